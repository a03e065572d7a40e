"""Curricula: which prompts a step draws, from each prompt's history in the rollout store.

A curriculum is a function ``(stats, settings) -> weights`` registered under a name (the key ``curriculum``):
``stats`` (:class:`PromptStats`) holds, for every usable prompt, its recent pass rate (NaN for a prompt never
sampled, or one whose text changed since: its hash differs) and its samples in the window; ``settings`` the data
section (:class:`grpokit.data.curriculum_settings.CurriculumSettings` and any fields a plugin reads). It returns one
positive weight per prompt (or weights and a dict of its own ``curriculum/*`` metrics), or None for the source's own
seeded order (``uniform``). With ``retire_after`` K, a prompt solved in K visits in a row (every completion passed)
weighs ``retire_revisit`` times its weight until a visit fails. A step's batch is drawn without
replacement in proportion to the weights, with a generator seeded by (the run's seed, the number of batches drawn
before), so what a step draws is fixed by the seed and the history stored so far: a resumed run, whose store is
rolled back to its checkpoint and whose checkpoint holds that count, draws what the uninterrupted run drew.

    @register_curriculum("hardest_first")
    def hardest_first(stats, settings):
        return np.where(np.isnan(stats.pass_rate), 1.0, 1.01 - stats.pass_rate)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from grpokit.store.prompt_history import prompt_hash
from grpokit.system.registry import Registry


class CurriculumParams(Protocol):
    """What the built-in curricula read of their settings (grpokit.data.curriculum_settings.CurriculumSettings, which
    the data section inherits; a plugin's weigh function may read more of the section)."""

    learnability_prior: float
    learnability_floor: float
    pool_easy_above: float
    pool_hard_below: float
    pool_weights: list


CURRICULA = Registry("curriculum")
register_curriculum = CURRICULA.register
_STREAM = 61  # a third word of the generator's seed, so its draws differ from the shuffled order's


@dataclass(frozen=True)
class PromptStats:
    """Every usable prompt's history: ``indices`` [P] their dataset rows, ``pass_rate`` [P] (NaN: never sampled),
    ``samples`` [P] completions in their window (0: never sampled), ``streak`` [P] visits in a row solved."""

    indices: np.ndarray
    pass_rate: np.ndarray
    samples: np.ndarray
    streak: np.ndarray


@register_curriculum("uniform")
def uniform(stats: PromptStats, settings: CurriculumParams) -> None:
    """The source's own order: the dataset's, shuffled per epoch with ``shuffle`` (grpokit before curricula)."""
    return None


def learnability_weights(pass_rate: np.ndarray, prior: float, floor: float) -> np.ndarray:
    """max(p (1 - p), floor) of each prompt's pass rate p, ``prior`` for a NaN one. p = 0.5: 0.25; p = 0.9: 0.09;
    p = 1 or 0: the floor."""
    p = np.where(np.isnan(pass_rate), prior, pass_rate)
    return np.maximum(p * (1.0 - p), floor)


@register_curriculum("learnability")
def learnability(stats: PromptStats, settings: CurriculumParams) -> np.ndarray:
    """Prompts in proportion to p(1 - p) of their recent pass rate: the variance of a pass/fail reward, so the ones
    whose groups are most likely to differ (a nonzero advantage) weigh most; see :func:`learnability_weights`."""
    return learnability_weights(stats.pass_rate, settings.learnability_prior, settings.learnability_floor)


POOLS = ("easy", "normal", "hard")


def pool_of(pass_rate: np.ndarray, easy_above: float, hard_below: float) -> np.ndarray:
    """Each prompt's pool, 0 easy (p >= ``easy_above``), 1 normal, 2 hard (p <= ``hard_below``); never sampled
    (NaN): normal."""
    pool = np.ones(len(pass_rate), dtype=np.int64)
    seen = ~np.isnan(pass_rate)
    pool[seen & (np.nan_to_num(pass_rate) >= easy_above)] = 0
    pool[seen & (np.nan_to_num(pass_rate) <= hard_below)] = 2
    return pool


@register_curriculum("pools")
def pools(stats: PromptStats, settings: CurriculumParams) -> tuple[np.ndarray, dict[str, float]]:
    """Easy / normal / hard pools by pass rate (:func:`pool_of`), each drawn with its share of ``pool_weights``: a
    prompt weighs its pool's weight / the pool's size (an empty pool's share goes to the others in proportion)."""
    pool = pool_of(stats.pass_rate, settings.pool_easy_above, settings.pool_hard_below)
    sizes = np.bincount(pool, minlength=3)  # [3]
    weights = np.asarray(settings.pool_weights, dtype=np.float64)[pool] / sizes[pool]
    return weights, {f"curriculum/pool_{name}": float(n) for name, n in zip(POOLS, sizes)}


def retired(streak: np.ndarray, retire_after: int | None) -> np.ndarray:
    """Bool [P]: prompts solved in ``retire_after`` visits in a row (none when it is None)."""
    return np.zeros(len(streak), dtype=bool) if retire_after is None else streak >= retire_after


def curriculum_names() -> list[str]:
    """The registered curricula, built-ins first."""
    return list(CURRICULA)


class Curriculum:
    """A run's curriculum: ``choose(source, n)`` draws a batch of ``source``'s usable prompts by the registered
    function ``name``, reading the history with ``history()`` (bound by the trainer to the store's prompt_history on
    rank 0; until then none is known). ``draws`` (the batches drawn so far) is its checkpoint state."""

    def __init__(self, name: str, settings: CurriculumParams, seed: int):
        self.name, self.settings, self.seed = name, settings, seed
        self.weigh = CURRICULA.entry(name, curriculum_names())
        self.history: Callable[[], list[dict]] = list
        self.draws = 0
        self._seen_samples = -1  # the history's total samples at the last draw: it grows with every step stored
        self._drawn: list[int] = []  # prompts drawn since the history last grew (dynamic sampling's rounds)
        self._metrics: dict[str, float] = {}

    @property
    def ordered(self) -> bool:
        """Whether it keeps the source's own order (``uniform``): then the store is not read at all."""
        return self.weigh is uniform

    def stats(self, source: Any) -> PromptStats:
        """The history of ``source``'s usable prompts (a row whose hash differs from the prompt's text: unseen)."""
        rows = self.history()
        samples_now = sum(row["samples"] for row in rows)
        if samples_now != self._seen_samples:  # a step was stored since the last draw: every prompt may come again
            self._seen_samples, self._drawn = samples_now, []
        known = {row["prompt_index"]: row for row in rows}
        indices = np.asarray(source.usable)
        rate, samples = np.full(len(indices), np.nan), np.zeros(len(indices), dtype=np.int64)
        streak = np.zeros(len(indices), dtype=np.int64)
        for k, i in enumerate(indices.tolist()):
            row = known.get(i)
            if row is not None and row["prompt_hash"] == prompt_hash(source.texts[i]):
                rate[k], samples[k], streak[k] = row["pass_rate"], row["recent_samples"], row.get("solved_streak", 0)
        return PromptStats(indices, rate, samples, streak)

    def choose(self, source: Any, batch_size: int) -> list[int] | None:
        """``batch_size`` distinct prompt indices drawn by the weights; None for the source's own order."""
        if self.ordered:
            return None
        stats = self.stats(source)
        weights, extra = self.weigh(stats, self.settings), {}
        if isinstance(weights, tuple):  # (weights, its own curriculum/* metrics)
            weights, extra = weights
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != stats.indices.shape or not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError(
                f"curriculum {self.name!r} gave weights of shape {weights.shape} (min {weights.min():.3g}) for "
                f"{len(stats.indices)} prompts; it must give one finite weight > 0 per prompt."
            )
        gone = retired(stats.streak, getattr(self.settings, "retire_after", None))
        weights = np.where(gone, weights * getattr(self.settings, "retire_revisit", 1.0), weights)
        weights = other_prompts(weights, stats.indices, self._drawn, batch_size)
        rng = np.random.default_rng([self.seed, self.draws, _STREAM])
        self.draws += 1
        picked = rng.choice(len(weights), size=batch_size, replace=False, p=weights / weights.sum())
        self._metrics = {**batch_metrics(stats, weights, picked), "curriculum/retired_prompts": float(gone.sum())}
        self._metrics.update(extra)
        chosen = [int(stats.indices[k]) for k in picked]
        self._drawn += chosen
        return chosen

    def metrics(self) -> dict[str, float]:
        """``curriculum/*`` of the last batch drawn ({} for uniform)."""
        return dict(self._metrics)

    def state_dict(self) -> dict:
        return {"curriculum_draws": self.draws, "curriculum_drawn": [self._seen_samples, list(self._drawn)]}

    def load_state_dict(self, state: dict) -> None:
        self.draws = int(state.get("curriculum_draws", 0))
        seen, drawn = state.get("curriculum_drawn", [-1, []])
        self._seen_samples, self._drawn = int(seen), [int(i) for i in drawn]


def other_prompts(weights: np.ndarray, indices: np.ndarray, drawn: list[int], batch_size: int) -> np.ndarray:
    """``weights`` with the prompts ``drawn`` since the history last grew set to 0 (a further round of the same step
    draws other prompts), unless fewer than ``batch_size`` would be left: then all of them again."""
    if not drawn:
        return weights
    left = np.where(np.isin(indices, drawn), 0.0, weights)
    return left if np.count_nonzero(left) >= batch_size else weights


def batch_metrics(stats: PromptStats, weights: np.ndarray, picked: np.ndarray) -> dict[str, float]:
    """What a draw saw: prompts never sampled, solved (pass rate 1) and unsolved (0) in their window, and the mean
    known pass rate of the batch (NaN when none of it was sampled before)."""
    seen = ~np.isnan(stats.pass_rate)
    batch = stats.pass_rate[picked]
    known = batch[~np.isnan(batch)]
    return {
        "curriculum/unseen_prompts": float((~seen).sum()),
        "curriculum/solved_prompts": float((stats.pass_rate[seen] == 1.0).sum()),
        "curriculum/unsolved_prompts": float((stats.pass_rate[seen] == 0.0).sum()),
        "curriculum/batch_pass_rate": float(known.mean()) if known.size else float("nan"),
        "curriculum/batch_weight_share": float(weights[picked].sum() / weights.sum()),
    }
