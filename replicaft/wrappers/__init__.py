"""What a training script wraps: the model and the optimizer.

``ddp.py`` (``DistributedDataParallel``), ``fsdp.py`` (HSDP: FSDP2 inside each group),
``optim.py`` (``zero_grad`` starts the quorum, ``step`` commits or skips), over
``buckets.py`` (gradient buckets and their launch order) and ``buffers.py`` (module buffers
kept identical across groups). ``managed_group.py`` is the manager's all-reduce as a real
c10d process group (``dist.all_reduce(group=)``, FSDP2's all-reduce hook, a device mesh), with
``gradient_record.py`` capturing what a healer replays when gradients go through it.
"""
