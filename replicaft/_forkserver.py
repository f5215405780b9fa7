"""Imported only inside the multiprocessing forkserver that starts DataLoader workers.

Importing it asks the kernel to SIGKILL the forkserver when its parent (the training process)
dies, however it dies. Without that, a SIGKILLed group would leave its forkserver and data
workers running, holding its pipes and memory. (The workers themselves die with the
forkserver: ``replicaft.data._die_with_parent``.) This is the module's only effect, and the
reason it exists; nothing else imports it.
"""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
if os.getppid() == 1:
    os._exit(1)
