"""Third-party noise the CLI keeps off a run's log: lines that say nothing about the run, printed on every start.

- bitsandbytes (imported by peft whenever it is installed) logs at WARNING on every CPU with AVX512-BF16 that it
  could not load an optional kernel from the hub: "Failed to load CPU gemm_4bit_forward from kernels-community".
  grpokit does not use that kernel (QLoRA on CPU runs bitsandbytes' own ops).
- transformers' and peft's FutureWarning / DeprecationWarning about their own API: grpokit's code is what they
  address, and its CI turns them into issues; a user cannot act on them.

The CLI owns its process and calls :func:`quiet_third_party` before it imports them; the library leaves a Python
user's logging and warning filters alone. Errors from these libraries are untouched.
"""

from __future__ import annotations

import logging
import warnings

LOGGERS = ("bitsandbytes.backends.cpu.ops",)
MODULES = r"(transformers|peft|bitsandbytes)(\.|$)"


def quiet_third_party() -> None:
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=MODULES)
