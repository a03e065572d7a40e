"""What the commands share: which errors a command prints as one line (exit 2) instead of a traceback, and the
overrides after a config on a command line."""

from __future__ import annotations


def is_user_error(exc: BaseException) -> bool:
    """Errors grpokit raises on purpose, with a message that names the problem and the fix: the CLI prints
    them as one line (exit 2) instead of a traceback. An ImportError raised by grpokit to name a missing
    extra has no module name; one from a failed import statement has it and stays a traceback."""
    from grpokit.config import ConfigError
    from grpokit.data.prompts import DataError
    from grpokit.rewards.contract import RewardError
    from grpokit.rollout.partial import PartialRolloutTimeout
    from grpokit.rollout.vllm.http import VLLMServerError
    from grpokit.rollout.vllm.weights import SyncGapError
    from grpokit.store.store import StoreError
    from grpokit.system.run_lock import RunFolderError
    from grpokit.train.rundir.checkpoint import CheckpointError

    if isinstance(exc, ImportError):
        return exc.name is None
    raised_on_purpose = (ConfigError, DataError, CheckpointError, StoreError, RewardError, RunFolderError)
    services = (VLLMServerError, SyncGapError, PartialRolloutTimeout)
    return isinstance(exc, (*raised_on_purpose, FileNotFoundError, *services))


def command_overrides(items: list[str]) -> list[str]:
    """The ``key=value`` overrides after a config, less argparse's ``--`` separator."""
    return [x for x in items if x != "--"]
