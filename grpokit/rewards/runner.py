"""Score a batch of completions with several reward functions and combine them.

Where a function runs is the pool's business (:mod:`grpokit.rewards.pool`). By default
(``isolate=True``) in its own worker process (:mod:`grpokit.system.workers`), which is killed at the
function's timeout whatever the function does; ``isolate=None`` isolates the functions named by a string
(built-ins, ``module:function``, ``file.py:function``) and runs the function objects given to it on threads here,
as TRL runs them, so what they change in their module or closure is seen by the caller (GRPOTrainer's default,
``reward_isolation: null``); with ``workers=N > 0`` in N processes per function,
each scoring a contiguous chunk of whole groups (``group_size`` completions of one prompt stay
together), for CPU-heavy rewards. Reward models (a ``reward_model`` or an ``nn.Module``, marked
``in_process``), and every function with ``isolate=False``, run on daemon threads in this process,
where a timeout cannot stop code that holds the GIL. A ``pool`` given to the runner replaces all of
this (Ray actors: ``grpokit.distributed.ray_rewards.RayRewardPool``). All functions of a batch run at
the same time; the timeout counts per function and batch (per chunk with workers).

Whatever runs them, the results are checked and combined here, in the order of the batch:
``combined_i = sum_{f: r_if present} w_f * r_if`` (as TRL's ``nansum``), NaN when none did.
A function's first failure of each kind is printed at once with its traceback
(:meth:`RewardRunner.score`), and a batch on which every function failed on every completion
counts towards :meth:`RewardRunner.check_signal`, which stops a run that has nothing to learn from.
A completion for which every function returned None (no reward applies) is logged once, in TRL's words.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.rewards.contract import TIMED_OUT, RewardError, as_completions, check_output
from grpokit.rewards.pool import LocalRewardPool, PoolFactory
from grpokit.rewards.resolve import resolve_reward

logger = logging.getLogger(__name__)

# Batches in a row on which every function failed on every completion before a run stops
# (the first batch of a run stops it at once).
MAX_FAILED_BATCHES = 3


@dataclass
class RewardResult:
    """Rewards of N completions from F functions.

    ``per_func`` [N, F] float64, NaN where a function gave None, failed or timed out;
    ``combined`` [N] the weighted sum of the present values (NaN when none is present);
    ``errors`` one message per completion (``"name: Error: message"``, several joined by
    ``"; "``) or None; ``error_counts`` the number of completions each function failed on;
    ``logged`` the values each ``log_metric`` name got; ``extra`` each ``log_extra`` column [N]
    (None where no function logged it); ``seconds`` each function's wall time on the batch (its slowest chunk; a
    call that timed out counts the timeout).
    """

    names: list[str]
    per_func: torch.Tensor  # [N, F]
    combined: torch.Tensor  # [N]
    errors: list[str | None]
    error_counts: dict[str, int]
    logged: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """``rewards/<name>/mean|std|errors|null_fraction|seconds``, ``reward`` and ``reward_std``, ignoring NaN, and
        the mean of each ``log_metric`` name (under that name, as TRL logs it).

        std is the sample standard deviation (Bessel-corrected, as torch.std); NaN when fewer
        than two values are present, and a mean over no values is NaN too.
        """
        metrics: dict[str, float] = {}
        for f, name in enumerate(self.names):
            mean, std = _nan_mean_std(self.per_func[:, f])
            metrics[f"rewards/{name}/mean"] = mean
            metrics[f"rewards/{name}/std"] = std
            metrics[f"rewards/{name}/errors"] = float(self.error_counts[name])
            # None ("does not apply"): NaN values that were not failures
            missing = int(self.per_func[:, f].isnan().sum()) - self.error_counts[name]
            metrics[f"rewards/{name}/null_fraction"] = missing / max(self.per_func.size(0), 1)
            if name in self.seconds:
                metrics[f"rewards/{name}/seconds"] = self.seconds[name]
        metrics["reward"], metrics["reward_std"] = _nan_mean_std(self.combined)
        for name, values in self.logged.items():
            metrics[name] = sum(values) / len(values)
        return metrics

    def all_failed(self) -> bool:
        """Every function failed (raised, timed out, returned NaN) on every completion."""
        return (
            bool(self.errors)
            and all(e is not None for e in self.errors)
            and all(count == len(self.errors) for count in self.error_counts.values())
        )


@dataclass
class RewardValues:
    """The checked outputs of F functions on N completions, before :meth:`RewardRunner.combine`:
    ``per_func`` [N, F] float64 (NaN where absent), ``messages`` [N][F], the error of function f on
    completion i or None, what the functions logged, and each function's ``seconds``. Unlike a
    :class:`RewardResult` it can be cut into rows (torchrun: rank 0 scores the global batch and every rank keeps its
    rows)."""

    per_func: torch.Tensor  # [N, F]
    messages: list[list[str | None]]  # [N][F]
    logged: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def rows(self, rows: slice) -> RewardValues:
        """These rows; the logged metrics belong to the whole batch and stay with every part."""
        return RewardValues(
            self.per_func[rows].clone(),
            self.messages[rows],
            self.logged,
            {column: values[rows] for column, values in self.extra.items()},
            self.seconds,
        )


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


class RewardRunner:
    """Run reward functions safely on batches of completions.

    ``specs``: reward specs (see :func:`~grpokit.rewards.resolve.resolve_reward`); an ``nn.Module``
    is a sequence classifier scored as TRL does (:class:`~grpokit.rewards.judge.ClassifierReward`).
    ``weights``: one weight per spec; when given it replaces the specs' own weights.
    ``timeout``: seconds allowed per function per batch (per chunk with workers).
    ``workers``: processes per function, each scoring a chunk; 0 = one process each (``isolate``) or
    none. ``isolate=False`` runs the functions on threads in this process; ``isolate=None`` isolates the specs given
    as strings and runs the callables on threads (see the module docstring).
    ``processing_classes``: one tokenizer (or None) per spec, used by ``nn.Module`` rewards (TRL's
    ``reward_processing_classes``; a missing one is loaded from the model's folder).
    ``model_kwargs``: how reward models named by a string are loaded (``device``, ``dtype``, ``trust_remote_code``).
    ``pool``: builds where the functions run from (names, functions) (a
    :data:`~grpokit.rewards.pool.PoolFactory`, e.g. ``functools.partial(RayRewardPool, workers=4)``);
    default a :class:`~grpokit.rewards.pool.LocalRewardPool` of ``workers`` and ``isolate``.
    ``close()`` ends the workers (a later ``score`` starts them again).
    """

    def __init__(
        self,
        specs: Sequence[Any],
        weights: Sequence[float] | None = None,
        timeout: float = 10.0,
        workers: int = 0,
        isolate: bool | None = True,
        processing_classes: Sequence[Any] | None = None,
        pool: PoolFactory | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
    ):
        if isinstance(specs, (str, Mapping)) or callable(specs):
            specs = [specs]
        if not specs:
            raise ValueError("RewardRunner needs at least one reward")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if processing_classes is not None and len(processing_classes) != len(specs):
            raise ValueError(
                f"The number of reward processing classes ({len(processing_classes)}) must match the number of reward "
                f"functions ({len(specs)}); give one per reward function, in order (None for a plain function)."
            )
        classes = list(processing_classes) if processing_classes is not None else [None] * len(specs)
        resolved = [
            _classifier(*resolve_reward(spec, model_kwargs), tokenizer) for spec, tokenizer in zip(specs, classes)
        ]
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
        self._announced: set[tuple[str, str]] = set()
        self._warned_no_reward = False
        self._batches = self._failed_in_a_row = 0
        if isolate is None:  # the functions named by a string in worker processes, the objects given here on threads
            isolate = [isinstance(spec.get("name") if isinstance(spec, Mapping) else spec, str) for spec in specs]
        make_pool = pool or functools.partial(LocalRewardPool, workers=workers, isolate=isolate)
        self.pool = make_pool(self.names, self.functions)

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[str],
        columns: Mapping[str, Sequence[Any]] | None = None,
        group_size: int = 1,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: Any = None,
    ) -> RewardResult:
        """Rewards of each completion from each function, and their weighted combination; raises
        :class:`RewardError` when this batch leaves the run without reward signal (:meth:`check_signal`).

        ``prompts``: strings or chat-message lists; ``completions``: texts (given to the functions in
        TRL's conversational form when the prompts are messages); ``group_size``: completions per
        prompt (adjacent), workers get whole groups.
        """
        values = self.score_values(prompts, completions, columns, group_size, completion_ids, trainer_state)
        result = self.combine(values)
        self.check_signal(result)
        return result

    def score_values(
        self,
        prompts: Sequence[Any],
        completions: Sequence[str],
        columns: Mapping[str, Sequence[Any]] | None = None,
        group_size: int = 1,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: Any = None,
    ) -> RewardValues:
        """Each function's checked values and errors per completion, not yet combined (see :meth:`score`)."""
        n = len(completions)
        columns = dict(columns or {})
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompts for {n} completions")
        if completion_ids is not None and len(completion_ids) != n:
            raise ValueError(f"got {len(completion_ids)} completion_ids for {n} completions")
        for key, column in columns.items():
            if len(column) != n:
                raise ValueError(f"column {key!r} has {len(column)} values for {n} completions")
        if group_size < 1 or n % group_size:
            raise ValueError(f"group_size={group_size} must be >= 1 and divide the {n} completions")
        batch = {
            "prompts": list(prompts),
            "completions": as_completions(prompts, completions),
            "completion_ids": None if completion_ids is None else [[int(t) for t in ids] for ids in completion_ids],
            **{key: list(column) for key, column in columns.items()},
        }

        def payload(rows: slice) -> dict[str, Any]:
            return {**{k: v if v is None else v[rows] for k, v in batch.items()}, "trainer_state": trainer_state}

        outcomes = self.pool.run(n, group_size, payload, self.timeout)
        # float64: any finite Python float fits, so a huge reward is a value, not an overflow
        per_func = torch.full((n, len(self.names)), math.nan, dtype=torch.float64)  # [N, F]
        messages: list[list[str | None]] = [[None] * len(self.names) for _ in range(n)]  # [N][F]
        logged: dict[str, list[float]] = {}
        extra: dict[str, list] = {}
        seconds: dict[str, float] = {}
        for f, (name, chunks) in enumerate(zip(self.names, outcomes)):
            seconds[name] = max(self._seconds(outcome) for _, outcome in chunks) if chunks else 0.0
            for rows, outcome in chunks:
                if outcome.fatal is not None:
                    raise outcome.fatal
                size = rows.stop - rows.start
                if outcome.error is not None:
                    self._announce(name, outcome.error, outcome.traceback)
                    chunk_values, chunk_errors = [None] * size, [outcome.error] * size
                else:
                    chunk_values, chunk_errors = check_output(name, outcome.output, size)
                if outcome.log is not None and outcome.log.errors is not None and outcome.error is None:
                    chunk_errors = [
                        own if own is not None else (said if value is None else None)
                        for own, said, value in zip(chunk_errors, outcome.log.errors, chunk_values)
                    ]
                    for said in dict.fromkeys(e for e in outcome.log.errors if e is not None):
                        self._announce(name, said, None)
                if outcome.log is not None:
                    for metric, values in outcome.log.metrics.items():
                        logged.setdefault(metric, []).extend(values)
                    for column, values in outcome.log.extra.items():
                        extra.setdefault(column, [None] * n)[rows] = values
                for i, value, message in zip(range(rows.start, rows.stop), chunk_values, chunk_errors):
                    if value is not None:
                        per_func[i, f] = value
                    messages[i][f] = message
        self._warn_if_no_reward_applies(per_func, messages, batch)
        return RewardValues(per_func, messages, logged, extra, seconds)

    def _seconds(self, outcome) -> float:
        """A call's wall time; the timeout for one that timed out, 0 for one whose worker died."""
        if outcome.seconds is not None:
            return outcome.seconds
        return self.timeout if outcome.error is not None and TIMED_OUT in outcome.error else 0.0

    def _warn_if_no_reward_applies(self, per_func: torch.Tensor, messages: list[list[str | None]], batch: dict) -> None:
        """Warn (once per runner, through ``logging``, as TRL does) when every function returned None for a
        completion: it has no reward, so its advantage is 0 and nothing is learned from it. Failures are not
        counted here: they are announced with their traceback (:meth:`_announce`)."""
        if self._warned_no_reward:
            return
        absent = torch.isnan(per_func).all(dim=1)  # [N]
        rows = [i for i in absent.nonzero().flatten().tolist() if all(m is None for m in messages[i])]
        if not rows:
            return
        self._warned_no_reward = True
        i = rows[0]
        kwargs = {key: value[i] for key, value in batch.items() if isinstance(value, list) and len(value) > i}
        logger.warning(
            "All reward functions returned None for the following kwargs:\n%s\n(%d of %d completions in this batch; "
            "printed once.) A completion without a reward gets advantage 0 and teaches nothing: make at least one "
            "reward function return a number for it.",
            kwargs,
            len(rows),
            len(messages),
        )

    def _announce(self, name: str, error: str, trace: str | None) -> None:
        """Print a function's error the first time it occurs, with its traceback."""
        if (name, error) in self._announced:
            return
        self._announced.add((name, error))
        detail = f"\n{trace.rstrip()}" if trace else ""
        print(
            f"grpokit: reward {name!r} failed: {error}{detail}\n(printed once; its value is None where it fails, "
            f"counted in rewards/{name}/errors and stored with the rollouts: grpokit inspect RUN --errors)",
            file=sys.stderr,
            flush=True,
        )

    def check_signal(self, result: RewardResult) -> None:
        """Raise :class:`RewardError` when every function failed on every completion of the first
        batch this runner scored, or of MAX_FAILED_BATCHES batches in a row: training on such
        batches learns nothing, and every later batch would most likely fail the same way."""
        self._batches += 1
        self._failed_in_a_row = self._failed_in_a_row + 1 if result.all_failed() else 0
        if self._failed_in_a_row and (self._batches == 1 or self._failed_in_a_row >= MAX_FAILED_BATCHES):
            which = "the first batch" if self._batches == 1 else f"{self._failed_in_a_row} batches in a row"
            first = next(e for e in result.errors if e is not None)
            hint = (
                "Make the reward function faster, or raise reward_timeout."
                if TIMED_OUT in first
                else "Fix the reward function (its traceback is printed above)."
            )
            raise RewardError(
                f"every reward function failed on every completion of {which}, so there is nothing to "
                f"train on: {first}. {hint}"
            )

    def combine(self, values: RewardValues) -> RewardResult:
        """The weighted sum of checked ``values`` and their errors (named by function)."""
        per_func = values.per_func  # [N, F]
        present = ~torch.isnan(per_func)  # [N, F]
        combined = torch.nansum(per_func * self.weights, dim=1)  # [N]
        combined[~present.any(dim=1)] = math.nan
        errors = [
            "; ".join(f"{name}: {m}" for name, m in zip(self.names, row) if m is not None) or None
            for row in values.messages
        ]
        error_counts = {name: sum(row[f] is not None for row in values.messages) for f, name in enumerate(self.names)}
        return RewardResult(
            names=list(self.names),
            per_func=per_func,
            combined=combined,
            errors=errors,
            error_counts=error_counts,
            logged=values.logged,
            extra=values.extra,
            seconds=values.seconds,
        )

    def close(self) -> None:
        """Stop the workers (a later ``score`` starts them again)."""
        self.pool.close()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _classifier(name: str, fn: Callable, weight: float, processing_class: Any) -> tuple[str, Callable, float]:
    """An ``nn.Module`` reward as TRL scores it; any other function as it is."""
    if isinstance(fn, torch.nn.Module):
        from grpokit.rewards.judge import ClassifierReward

        classifier = ClassifierReward(fn, processing_class)
        return classifier.name, classifier, weight
    return name, fn, weight
