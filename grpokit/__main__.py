"""``python -m grpokit``: the CLI, also as ``torchrun --nproc_per_node K -m grpokit train CONFIG``."""

import sys

from grpokit.cli import main

sys.exit(main())
