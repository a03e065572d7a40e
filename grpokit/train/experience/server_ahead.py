"""Sampling ahead from a vLLM server (``max_staleness`` K >= 1 with ``vllm_mode: server``, one learner process).

A server is another process, so it samples while the learner trains: the producer's thread of
:class:`~grpokit.train.experience.sources.AheadRollouts` drives it. What a batch holds is fixed at admission, as with
the hf engine's :class:`~grpokit.train.experience.samplers.ThreadSampler`: its prompts, its group seeds (seed, step,
group) and the weights' version, with a CPU copy of the policy's weights taken then (batches admitted by one version
share one copy). The server holds one set of weights: before sampling a batch of version v the producer loads v's copy
into its own copy of the model and pushes it (:meth:`VLLMServerEngine.generate_at`, under the engine's lock, so no
other push lands while the batch samples) unless the server holds v already. Versions only grow along admission
order, so each is pushed once; the rollouts are a function of (seed, step, weights) whatever the threads' timing, and
a resumed run pushes the checkpoint's weights before its first new batch.

The check of the sync: the learner's log-probs are a newer policy's than the sampler's, so the step's
``sampling_is/logprob_abs_diff`` measures the staleness. After each new version the copy's log-probs of the batch's
sampled tokens are compared with the server's, both at that version (``vllm_server_sync_gap_max``: the largest gap
so far; the engine's warning and stop read it). Memory: one more model, and up to K + 1 weight copies in the queue.
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.rollout.types import Rollouts
from grpokit.train.experience.samplers import EngineSampler

GAP_METRIC = "vllm_server_sync_gap_max"


class ServerAheadSampler(EngineSampler):
    """Batches sampled ahead by a vLLM server (module docstring). ``own_model``: a copy of the policy, loaded with
    each new version on the producer's thread (the learner's weights are never read while it trains)."""

    def __init__(self, *, own_model: torch.nn.Module, **parts: Any) -> None:
        super().__init__(**parts)
        self.own_model = own_model.eval().requires_grad_(False)
        self._own_version: int | None = None  # the version the copy holds
        self._copy: tuple[int, dict] | None = None  # the last admitted version and its CPU weights
        self.sync_gap_max: float | None = None
        self.engine.sample_ahead(GAP_METRIC)

    def sample(self, step: int, batch: list[int], first_group: int) -> Rollouts:
        return self.collect(self.submit(step, batch, first_group))

    @torch.no_grad()
    def submit(self, step: int, batch: list[int], first_group: int = 0):
        """Fix the batch now: its step, prompts, first group and the weights of now (a CPU copy, one per version)."""
        version = self.engine.policy_version
        if self._copy is None or self._copy[0] != version:
            state = self.model.state_dict()
            self._copy = (version, {name: t.detach().to("cpu", copy=True) for name, t in state.items()})
        return step, list(batch), first_group, self._copy

    @torch.no_grad()
    def collect(self, pending) -> Rollouts:
        """On the producer's thread: the batch sampled by the server at its version (pushed first if need be)."""
        from grpokit.distributed.ray_vllm import sync_gap

        step, batch, first_group, (version, weights) = pending
        fresh = version != self._own_version
        if fresh:
            self.own_model.load_state_dict(weights)
            self._own_version = version
        prompts = [self.prompts.ids[i] for i in batch]
        seeds = self.seeds(step, len(batch), first_group)
        rollouts = self.engine.generate_at(version, self.own_model, prompts, self.num_generations, self.params, seeds)
        if fresh and not self.params.greedy:  # as the Ray workers check: sampled tokens, at a temperature
            gap = sync_gap(self.own_model, rollouts, self.params.temperature)
            self.sync_gap_max = max(gap, self.sync_gap_max or 0.0)
        return rollouts

    def scatter(self, rollouts: Rollouts | None) -> Rollouts:
        return rollouts

    def metrics(self) -> dict[str, float]:
        found = {"vllm_server_pushes": float(len(self.engine.pushed))}
        if self.sync_gap_max is not None:
            found[GAP_METRIC] = self.sync_gap_max
        return found
