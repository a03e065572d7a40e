"""Sampling ahead from a vLLM server (``max_staleness`` K >= 1 with ``vllm_mode: server``, one learner process).

A server is another process, so it samples while the learner trains: the producer's thread of
:class:`~grpokit.train.experience.sources.AheadRollouts` drives it. What a batch holds is fixed at admission, as with
the hf engine's :class:`~grpokit.train.experience.samplers.ThreadSampler`: its prompts, its group seeds (seed, step,
group) and the weights' version, with a CPU copy of the policy's weights taken then (batches admitted by one version
share one copy). The server holds one set of weights: before sampling a batch of version v the producer loads v's copy
into its own copy of the model and pushes it (:meth:`VLLMServerEngine.generate_at`, under the engine's lock, so no
other push lands while the batch samples) unless the server holds v already. Versions only grow along admission
order, so each is pushed once (partial rollouts, ``partial_rollouts``: a batch's continuations sample by the next
version, :mod:`grpokit.train.experience.server_partial`, so versions alternate at the start); the rollouts are a
function of (seed, step, weights) whatever the threads' timing, and a resumed run pushes the weights its first new
batch needs before it.

The check of the sync: the learner's log-probs are a newer policy's than the sampler's, so the step's
``sampling_is/logprob_abs_diff`` measures the staleness. Each time the producer loads another version into its copy
(and so pushes it), the copy's log-probs of the tokens sampled next are compared with the server's, both at that
version (``vllm_server_sync_gap_max``: the largest gap
so far; the engine's warning and stop read it; partial rollouts' continuations also on their own,
``vllm_server_sync_gap_continued_max``). Memory: one more model, and up to K + 1 weight copies in the queue (K + 2
with partial rollouts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpokit.rollout.types import Rollouts
from grpokit.train.experience.samplers import EngineSampler
from grpokit.train.experience.server_partial import VersionCopies

if TYPE_CHECKING:
    from grpokit.train.experience.sampler_entry import SamplerInputs

GAP_METRIC = "vllm_server_sync_gap_max"
CONTINUED_GAP_METRIC = "vllm_server_sync_gap_continued_max"


class ServerAheadSampler(EngineSampler):
    """Batches sampled ahead by a vLLM server (module docstring). ``own_model``: a copy of the policy, loaded with
    each new version on the producer's thread (the learner's weights are never read while it trains)."""

    @classmethod
    def from_inputs(cls, inputs: SamplerInputs) -> ServerAheadSampler:
        return cls(own_model=inputs.own_model(), partial_rollouts=inputs.partial_rollouts, **inputs.common())

    def __init__(
        self, *, own_model: torch.nn.Module, partial_rollouts: tuple[int, float] | None = None, **parts: Any
    ) -> None:
        """``partial_rollouts``: (S tokens, seconds a continuation may wait for its version), or None."""
        super().__init__(**parts)
        self.own_model = own_model.eval().requires_grad_(False)
        self._own_version: int | None = None  # the version the copy holds
        self._copy: tuple[int, dict] | None = None  # the last copied version and its CPU weights
        self.partial = None if partial_rollouts is None else VersionCopies(*partial_rollouts)
        self.sync_gap_max: float | None = None
        self.sync_gap_continued_max: float | None = None
        self.engine.sample_ahead(GAP_METRIC)

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        return self.collect(self.submit(step, batch, first_group))

    @torch.no_grad()
    def _weights_now(self) -> tuple[int, dict]:
        """(the policy's version, a CPU copy of its weights), one copy per version (the learner's thread)."""
        version = self.engine.policy_version
        if self._copy is None or self._copy[0] != version:
            state = self.model.state_dict()
            self._copy = (version, {name: t.detach().to("cpu", copy=True) for name, t in state.items()})
        return self._copy

    def submit(self, step: int, batch: list[int], first_group: int = 0):
        """Fix the batch now: its step, prompts, first group, the weights of now (a CPU copy, one per version) and
        (partial rollouts) the version its continuations sample by."""
        from grpokit.rollout.partial import switch_version

        version, weights = self._weights_now()
        switch = None if self.partial is None else switch_version(step, version)
        if switch is not None:
            self.partial.admit(switch)
        return step, list(batch), first_group, (version, weights), switch

    def share_weights(self) -> None:
        """Partial rollouts: a CPU copy of the current weights when an admitted batch continues on them."""
        if self.partial is not None and self.partial.needs(self.engine.policy_version):
            self.partial.share(*self._weights_now())

    def interrupt(self) -> None:
        if self.partial is not None:
            self.partial.interrupt()

    @torch.no_grad()
    def collect(self, pending) -> Rollouts:
        """On the producer's thread: the batch sampled by the server at its version (pushed first if need be);
        partial rollouts: its first S tokens, then the samples still going continued by the next version."""
        from grpokit.rollout.partial import continue_chunk, head_params, tail_params

        step, batch, first_group, (version, weights), switch = pending
        prompts = [self.prompts.ids[i] for i in batch]
        seeds = self.seeds(step, len(batch), first_group)
        params = self.params if switch is None else head_params(self.params, self.partial.tokens)
        rollouts, gap = self._sample(version, weights, prompts, self.num_generations, params, seeds)
        self._count(gap, continued=False)
        if switch is None:
            return rollouts
        shared, tail = self.partial.wait(switch), tail_params(self.params, self.partial.tokens)

        def sample(tail_prompts: list[list[int]], tail_seeds: list[int]):
            return self._sample(switch, shared, tail_prompts, 1, tail, tail_seeds)

        pad = self.engine.pad_token_id
        merged, gap = continue_chunk(rollouts, seeds, self.partial.tokens, tail, switch, pad, sample)
        self._count(gap, continued=True)
        self.partial.done(switch)
        return merged

    def _sample(self, version: int, weights: dict, prompts, n: int, params, seeds) -> tuple[Rollouts, float | None]:
        """Sampled by the server at ``version`` (``weights``: its CPU copy, loaded into the own model first when it
        holds another), and the sync gap when the copy was loaded (a new version pushed; else None)."""
        from grpokit.distributed.ray_vllm import sync_gap

        fresh = version != self._own_version
        if fresh:
            self.own_model.load_state_dict(weights)
            self._own_version = version
        rollouts = self.engine.generate_at(version, self.own_model, prompts, n, params, seeds)
        if fresh and not params.greedy:  # as the Ray workers check: sampled tokens, at a temperature
            return rollouts, sync_gap(self.own_model, rollouts, params.temperature)
        return rollouts, None

    def _count(self, gap: float | None, continued: bool) -> None:
        if gap is not None:
            self.sync_gap_max = max(gap, self.sync_gap_max or 0.0)
            if continued:
                self.sync_gap_continued_max = max(gap, self.sync_gap_continued_max or 0.0)

    def scatter(self, rollouts: Rollouts | None) -> Rollouts:
        return rollouts

    def metrics(self) -> dict[str, float]:
        found = {"vllm_server_pushes": float(len(self.engine.pushed))}
        if self.sync_gap_max is not None:
            found[GAP_METRIC] = self.sync_gap_max
        if self.sync_gap_continued_max is not None:
            found[CONTINUED_GAP_METRIC] = self.sync_gap_continued_max
        return found
