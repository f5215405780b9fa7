"""Imported only inside the multiprocessing forkserver that starts DataLoader workers.

Importing it asks the kernel to SIGKILL the forkserver when its parent (the training process)
dies, however it dies. Without that, a SIGKILLed group would leave its forkserver and data
workers running, holding its pipes and memory. (The workers themselves die with the
forkserver: ``replicaft.data.StepDataLoader``'s worker init.) This is the module's only effect, and the
reason it exists; nothing else imports it.
"""

from replicaft.process.process_tree import die_with_parent

die_with_parent(exit_if_orphaned=True)
