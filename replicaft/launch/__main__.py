"""``python -m replicaft.launch``: the same as ``replicaft-launch``."""

import sys

from replicaft.launch.supervisor import main

sys.exit(main())
