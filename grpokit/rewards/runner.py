"""Score a batch of completions with several reward functions and combine them.

Each function runs on the whole batch with a timeout (per batch); in-process the functions run
concurrently on daemon threads, so slow I/O-bound rewards (async judges) overlap. With
``workers=N > 0`` the batch is split into at most N contiguous chunks of whole groups
(``group_size`` completions of one prompt stay together) that run on workers, for CPU-heavy
rewards: a process pool (spawn) in this process (``backend="process"``), or Ray actors
(``backend="ray"``, :mod:`grpokit.distributed.ray_rewards`). Workers are started at the first
batch and reused, and receive the functions once, when they start. As with any spawn pool, a
script that creates a process pool must guard its entry point with ``if __name__ == "__main__":``.

Whatever runs them, the results are checked and combined here, in the order of the batch:
``combined_i = sum_{f: r_if present} w_f * r_if`` (as TRL's ``nansum``), NaN when none did.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import pickle
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.rewards.contract import TIMED_OUT, RewardError, TimedCall, check_output
from grpokit.rewards.registry import resolve_reward


@dataclass
class RewardResult:
    """Rewards of N completions from F functions.

    ``per_func`` [N, F] float64, NaN where a function gave None, failed or timed out;
    ``combined`` [N] the weighted sum of the present values (NaN when none is present);
    ``errors`` one message per completion (``"name: Error: message"``, several joined by
    ``"; "``) or None; ``error_counts`` the number of completions each function failed on.
    """

    names: list[str]
    per_func: torch.Tensor  # [N, F]
    combined: torch.Tensor  # [N]
    errors: list[str | None]
    error_counts: dict[str, int]

    def metrics(self) -> dict[str, float]:
        """``rewards/<name>/mean|std|errors``, ``reward`` and ``reward_std``, ignoring NaN.

        std is the sample standard deviation (Bessel-corrected, as torch.std); NaN when fewer
        than two values are present, and a mean over no values is NaN too.
        """
        metrics: dict[str, float] = {}
        for f, name in enumerate(self.names):
            mean, std = _nan_mean_std(self.per_func[:, f])
            metrics[f"rewards/{name}/mean"] = mean
            metrics[f"rewards/{name}/std"] = std
            metrics[f"rewards/{name}/errors"] = float(self.error_counts[name])
        metrics["reward"], metrics["reward_std"] = _nan_mean_std(self.combined)
        return metrics


@dataclass
class RewardValues:
    """The checked outputs of F functions on N completions, before :meth:`RewardRunner.combine`:
    ``per_func`` [N, F] float64 (NaN where absent) and ``messages`` [N][F], the error of function f on
    completion i or None. Unlike a :class:`RewardResult` it can be cut into rows (torchrun: rank 0
    scores the global batch and every rank keeps its rows)."""

    per_func: torch.Tensor  # [N, F]
    messages: list[list[str | None]]  # [N][F]

    def rows(self, rows: slice) -> RewardValues:
        return RewardValues(self.per_func[rows].clone(), self.messages[rows])


def _nan_mean_std(values: torch.Tensor) -> tuple[float, float]:
    present = values[~torch.isnan(values)]
    mean = present.mean().item() if present.numel() else math.nan
    std = present.std().item() if present.numel() >= 2 else math.nan
    return mean, std


def _unique(names: list[str]) -> list[str]:
    """Suffix repeated names: accuracy, accuracy_2, accuracy_3."""
    unique: list[str] = []
    for name in names:
        candidate, k = name, 1
        while candidate in unique:
            k += 1
            candidate = f"{name}_{k}"
        unique.append(candidate)
    return unique


# The reward functions of the runner that started this worker process: sent once when the pool
# starts rather than pickled with every chunk, which matters for a reward model's weights.
_worker_functions: list[Callable] = []


def _init_worker(functions: list[Callable]) -> None:
    _worker_functions.extend(functions)


def _score_in_worker(
    index: int, prompts: list[str], completions: list[str], columns: dict, timeout: float
) -> tuple[Any, str | None]:
    return TimedCall(_worker_functions[index], prompts, completions, columns).result(timeout)


def _chunks(n: int, parts: int, group_size: int = 1) -> list[slice]:
    """At most ``parts`` contiguous, non-empty slices covering range(n), each a whole number of
    groups of ``group_size`` (which divides n), with near-equal numbers of groups."""
    groups = n // group_size
    parts = max(1, min(parts, groups))
    bounds = [round(k * groups / parts) * group_size for k in range(parts + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


class ProcessPool:
    """Reward functions on a spawn process pool in this process (``RewardRunner(backend="process")``)."""

    def __init__(self, names: list[str], functions: list[Callable], workers: int):
        for name, fn in zip(names, functions):
            try:
                pickle.dumps(fn)
            except Exception as exc:
                raise RewardError(
                    f"reward {name!r} cannot be sent to worker processes (workers={workers}): "
                    f"{exc}. Define it at module level, or use workers=0"
                ) from exc
        self.functions = functions
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    def run(self, rows: list[slice], prompts, completions, columns, timeout: float) -> list[list[tuple[slice, Any, str | None]]]:
        """Every function on every chunk of ``rows``: [F][chunk] (rows, output, error)."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.functions,),
            )
        futures: list[list[Future]] = []  # [F][chunk]
        for f in range(len(self.functions)):
            futures.append([])
            for r in rows:
                chunk_columns = {key: column[r] for key, column in columns.items()}
                futures[f].append(
                    self._executor.submit(
                        _score_in_worker, f, prompts[r], completions[r], chunk_columns, timeout
                    )
                )
        outcomes = []
        recycle = False
        for per_function in futures:
            results = []
            for r, future in zip(rows, per_function):
                try:
                    output, error = future.result()
                except RewardError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a worker died (BrokenProcessPool)
                    output, error = None, f"{type(exc).__name__}: {exc}"
                    recycle = True
                recycle = recycle or (error is not None and error.startswith(TIMED_OUT))
                results.append((r, output, error))
            outcomes.append(results)
        if recycle:
            # Ending the workers ends the abandoned calls still running on their threads.
            self.close()
        return outcomes

    def close(self) -> None:
        """Shut the process pool down (a later ``run`` starts a new one)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class RewardRunner:
    """Run reward functions safely on batches of completions.

    ``specs``: reward specs (see :func:`~grpokit.rewards.registry.resolve_reward`).
    ``weights``: one weight per spec; when given it replaces the specs' own weights.
    ``timeout``: seconds allowed per function per batch (per chunk with workers).
    ``workers``: 0 to run in this process, N > 0 for N workers; ``close()`` ends them.
    ``backend``: ``process`` (a process pool here) or ``ray`` (Ray actors of ``worker_cpus`` CPUs each).
    """

    def __init__(
        self,
        specs: Sequence[Any],
        weights: Sequence[float] | None = None,
        timeout: float = 10.0,
        workers: int = 0,
        backend: str = "process",
        worker_cpus: float = 1.0,
    ):
        if isinstance(specs, (str, Mapping)) or callable(specs):
            specs = [specs]
        if not specs:
            raise ValueError("RewardRunner needs at least one reward")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if backend not in ("process", "ray"):
            raise ValueError(f"backend must be 'process' or 'ray', got {backend!r}")
        resolved = [resolve_reward(spec) for spec in specs]
        if weights is None:
            weights = [weight for _, _, weight in resolved]
        elif len(weights) != len(resolved):
            raise ValueError(f"got {len(weights)} reward weights for {len(resolved)} rewards")
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"reward weights must be finite, got {list(weights)}")
        self.names = _unique([name for name, _, _ in resolved])
        self.functions: list[Callable] = [fn for _, fn, _ in resolved]
        self.weights = torch.tensor([float(w) for w in weights], dtype=torch.float64)  # [F]
        self.timeout = float(timeout)
        self.workers = workers
        self._pool = None  # ProcessPool or RayRewardPool: run(rows, prompts, completions, columns, timeout), close()
        if workers and backend == "ray":
            from grpokit.distributed.ray_rewards import RayRewardPool

            self._pool = RayRewardPool(self.names, self.functions, workers, worker_cpus)
        elif workers:
            self._pool = ProcessPool(self.names, self.functions, workers)

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: Mapping[str, Sequence[Any]] | None = None,
        group_size: int = 1,
    ) -> RewardResult:
        """Rewards of each completion from each function, and their weighted combination.

        ``group_size``: completions per prompt (adjacent); workers get whole groups.
        """
        return self.combine(self.score_values(prompts, completions, columns, group_size))

    def score_values(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: Mapping[str, Sequence[Any]] | None = None,
        group_size: int = 1,
    ) -> RewardValues:
        """Each function's checked values and errors per completion, not yet combined (see :meth:`score`)."""
        n = len(completions)
        columns = dict(columns or {})
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompts for {n} completions")
        for key, column in columns.items():
            if len(column) != n:
                raise ValueError(f"column {key!r} has {len(column)} values for {n} completions")
        if group_size < 1 or n % group_size:
            raise ValueError(f"group_size={group_size} must be >= 1 and divide the {n} completions")
        prompts, completions = list(prompts), list(completions)
        columns = {key: list(column) for key, column in columns.items()}
        if self._pool is not None:
            outcomes = self._pool.run(_chunks(n, self.workers, group_size), prompts, completions, columns, self.timeout)
        else:
            calls = [TimedCall(fn, prompts, completions, columns) for fn in self.functions]
            outcomes = [[(slice(0, n), *call.result(self.timeout))] for call in calls]

        # float64: any finite Python float fits, so a huge reward is a value, not an overflow
        per_func = torch.full((n, len(self.names)), math.nan, dtype=torch.float64)  # [N, F]
        messages: list[list[str | None]] = [[None] * len(self.names) for _ in range(n)]  # [N][F]
        for f, (name, chunks) in enumerate(zip(self.names, outcomes)):
            for rows, output, error in chunks:
                size = rows.stop - rows.start
                if error is not None:
                    chunk_values, chunk_errors = [None] * size, [error] * size
                else:
                    chunk_values, chunk_errors = check_output(name, output, size)
                for i, value, message in zip(range(rows.start, rows.stop), chunk_values, chunk_errors):
                    if value is not None:
                        per_func[i, f] = value
                    messages[i][f] = message
        return RewardValues(per_func, messages)

    def combine(self, values: RewardValues) -> RewardResult:
        """The weighted sum of checked ``values`` and their errors (named by function)."""
        per_func = values.per_func  # [N, F]
        present = ~torch.isnan(per_func)  # [N, F]
        combined = torch.nansum(per_func * self.weights, dim=1)  # [N]
        combined[~present.any(dim=1)] = math.nan
        errors = ["; ".join(f"{name}: {m}" for name, m in zip(self.names, row) if m is not None) or None for row in values.messages]
        error_counts = {name: sum(row[f] is not None for row in values.messages) for f, name in enumerate(self.names)}
        return RewardResult(names=list(self.names), per_func=per_func, combined=combined, errors=errors, error_counts=error_counts)

    def close(self) -> None:
        """Stop the workers (a later ``score`` starts them again)."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardRunner:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
