"""``python -m grpokit``: the CLI, also as ``torchrun --nproc_per_node K -m grpokit train CONFIG``."""

from grpokit.train.interrupt import guard_start_up

guard_start_up()  # first: a signal while the CLI is imported is one line, not a traceback

import sys  # noqa: E402

from grpokit.cli import main  # noqa: E402

sys.exit(main())
