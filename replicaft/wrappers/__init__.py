"""What a training script wraps: the model and the optimizer.

``ddp.py`` (``DistributedDataParallel``), ``fsdp.py`` (HSDP: FSDP2 inside each group),
``optim.py`` (``zero_grad`` starts the quorum, ``step`` commits or skips), over
``buckets.py`` (gradient buckets and their launch order) and ``buffers.py`` (module buffers
kept identical across groups).
"""
