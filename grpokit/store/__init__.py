"""The rollout store of a run (RUN/rollouts.sqlite), `grpokit inspect` and the HTML report."""

from grpokit.store.errors import QueryError
from grpokit.store.inspect import inspect_run
from grpokit.store.record import RolloutRecord, rollout_records
from grpokit.store.report import write_report
from grpokit.store.store import STORE_FILENAME, DuplicateStepError, RolloutStore, StoreError

__all__ = [
    "STORE_FILENAME",
    "DuplicateStepError",
    "QueryError",
    "RolloutRecord",
    "RolloutStore",
    "StoreError",
    "inspect_run",
    "rollout_records",
    "write_report",
]
