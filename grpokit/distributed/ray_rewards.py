"""Reward functions on Ray actors (``distributed.num_reward_workers > 0``), off the learner process.

Each actor holds the reward functions (sent once, through the object store) and scores one chunk of
whole groups per batch. :class:`RayRewardPool` is a :class:`~grpokit.rewards.pool.RewardPool`: the
trainer gives it to the :class:`~grpokit.rewards.runner.RewardRunner`, which checks the outputs and
combines them in the batch's order, exactly as it does in-process. In the actor every
function runs with the runner's timeout (:class:`~grpokit.rewards.contract.TimedCall`): a function
that raises or times out gives None and an error; a :class:`RewardError` (wrong length, non-number,
missing column) is sent back and raised in the learner. An actor that does not answer within
GRACE seconds of the timeout (a function holding the GIL) is killed and replaced.

Shipping: the functions are pickled with Ray's cloudpickle. Functions from a ``file.py`` (loaded by
path) and from modules that are not installed packages (your own code: not grpokit, the standard
library or site-packages) are pickled **by value**, so a worker on another node needs neither the
file nor the module. What such a function imports is still imported by name on the worker:
installed packages (RDKit, ...) must be installed on every node, like grpokit.

Fault tolerance: the actors are started with ``max_restarts=-1`` and ``max_task_retries``, so Ray
restarts an actor whose process died and runs its chunk again; the chunk's result is taken once.
A chunk whose worker died on every try gives None and an error for its rows, like a raising
function. After a timeout the actor is replaced by a new one (``ray.kill``), which ends the abandoned call.
"""

from __future__ import annotations

import functools
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from grpokit.distributed.placement import actor_options
from grpokit.distributed.ray_rollout import import_ray
from grpokit.rewards.contract import TIMED_OUT, Outcome, RewardError, TimedCall
from grpokit.rewards.pool import Outcomes, chunks
from grpokit.rewards.resolve import FileFunction

# Tries of a chunk whose worker process dies (the first run included): a reward that kills its
# process on some input should not loop forever.
MAX_TRIES = 3
# Seconds past the timeout the learner waits for an actor's answer before killing it: enough for Ray
# to restart a dead actor and run its chunk again, which is how a worker that died is retried.
GRACE = 30.0


class RewardWorker:
    """A Ray actor holding the reward functions; scores one chunk per call."""

    def __init__(self, functions: list[Callable]):
        self.functions = functions

    def ready(self) -> bool:
        return True

    def score(self, payload: dict, n: int, timeout: float) -> list[Outcome]:
        """One Outcome per function (a RewardError travels in it, raised in the learner)."""
        calls = [TimedCall(fn, payload, n) for fn in self.functions]
        return [call.result(timeout) for call in calls]


class RayRewardPool:
    """``workers`` Ray actors of ``worker_cpus`` CPUs each, started at the first batch (a ``RewardPool``)."""

    def __init__(self, names: list[str], functions: list[Callable], workers: int, worker_cpus: float = 1.0):
        ray = import_ray()
        self.functions = [shippable(fn) for fn in functions]
        for name, fn in zip(names, self.functions):
            try:
                ray.cloudpickle.dumps(fn)
            except Exception as exc:
                raise RewardError(
                    f"reward {name!r} cannot be sent to Ray reward workers: {exc}. "
                    "Keep what it needs at module level (no open files, locks or clients), "
                    "or set distributed.num_reward_workers: 0"
                ) from exc
        self.workers = workers
        self.worker_cpus = worker_cpus
        self.grace = GRACE
        self.actors: list = []
        self._actor = None  # the Ray actor class, made at start
        self._functions_ref = None

    def _start(self) -> None:
        ray = import_ray()
        # Held while the actors live: a restarted actor is built again from this object.
        self._functions_ref = ray.put(self.functions)
        # no GPU, and none visible: the learner's stays its own (distributed/placement.py)
        options = actor_options(self.worker_cpus, 0)
        self._actor = ray.remote(**options, max_restarts=-1, max_task_retries=MAX_TRIES - 1)(RewardWorker)
        self.actors = [self._actor.remote(self._functions_ref) for _ in range(self.workers)]
        ray.get([actor.ready.remote() for actor in self.actors])  # started: the deadline of a batch is its own

    def run(self, n: int, group_size: int, payload: Callable[[slice], dict], timeout: float) -> Outcomes:
        """Every function on every chunk of whole groups (chunk c on actor c): [F][chunk] (rows, Outcome).
        An actor that has not answered shortly after the timeout (a call that holds the GIL keeps even
        its timeout thread from returning) is killed."""
        ray = import_ray()
        from ray.exceptions import GetTimeoutError, RayActorError

        if not self.actors:
            self._start()
        rows = chunks(n, self.workers, group_size)
        refs = [self.actors[c].score.remote(payload(r), r.stop - r.start, timeout) for c, r in enumerate(rows)]
        deadline = time.monotonic() + timeout + self.grace
        outcomes: Outcomes = [[] for _ in self.functions]
        replaced = []
        for c, (r, ref) in enumerate(zip(rows, refs)):
            replace = False
            try:
                results = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                timed_out = Outcome(error=f"{TIMED_OUT} after {timeout:g} s (its Ray worker was killed)")
                results, replace = [timed_out] * len(self.functions), True
            except RayActorError as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                lost = Outcome(error=f"reward worker lost ({MAX_TRIES} tries): {type(exc).__name__}: {reason}")
                results = [lost] * len(self.functions)
            for f, outcome in enumerate(results):
                outcomes[f].append((r, outcome))
            if replace or any(o.error is not None and o.error.startswith(TIMED_OUT) for o in results):
                # A new actor in a new process; the abandoned call ends with the old one.
                ray.kill(self.actors[c], no_restart=True)
                self.actors[c] = self._actor.remote(self._functions_ref)
                replaced.append(self.actors[c])
        # started before the next batch, whose deadline is then its own (as _start's), not the new process's start
        ray.get([actor.ready.remote() for actor in replaced])
        return outcomes

    def close(self) -> None:
        if self.actors:
            ray = import_ray()
            for actor in self.actors:
                ray.kill(actor)
        self.actors, self._functions_ref = [], None


def shippable(fn: Callable) -> Callable:
    """``fn`` as it is sent to Ray workers: a ``file.py`` function as the function itself, and the
    module of any function that is not in an installed package registered to pickle by value."""
    if isinstance(fn, functools.partial):
        return functools.partial(shippable(fn.func), *fn.args, **fn.keywords)
    if isinstance(fn, FileFunction):
        fn = fn.__wrapped__  # a FileFunction pickles as its path, which other nodes may not have
    module = sys.modules.get(getattr(fn, "__module__", None) or type(fn).__module__)
    if module is not None and not _installed(module):
        import_ray().cloudpickle.register_pickle_by_value(module)
    return fn


def _installed(module) -> bool:
    """grpokit, the standard library, built-in modules and site-packages: importable on every node."""
    top = module.__name__.partition(".")[0]
    if top in ("grpokit", "__main__") or top in sys.stdlib_module_names:
        return True  # cloudpickle already pickles __main__ by value
    file = getattr(module, "__file__", None)
    if file is None:
        return True
    paths = sysconfig.get_paths()
    roots = {Path(paths[key]).resolve() for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(Path(file).resolve().is_relative_to(root) for root in roots)
