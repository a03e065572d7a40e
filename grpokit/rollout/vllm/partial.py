"""Partial rollouts on the colocated vLLM engine: generation in flight when new weights arrive is paused, the weights
are loaded, and generation continues on them, each token's policy version recorded.

vLLM's ``LLM.generate`` is one blocking call; here its engine is driven step by step (``llm_engine.add_request``,
then ``llm_engine.step()`` until no request is left; vLLM 0.32's own loop). Between two steps a caller's
``updates(steps)`` may hand over new weights (a :class:`WeightUpdate`). Then, as OpenRLHF does with
``pause_generation(mode="keep")`` (keep-and-recompute, the form an in-process engine supports):

1. ``llm_engine.reset_prefix_cache(reset_running_requests=True)``: every running request is preempted (its KV
   blocks freed) and kept in vLLM's queue with its tokens so far;
2. the weights go in by vLLM's reload path (:func:`~grpokit.rollout.vllm.weights.push_weights`);
3. the next ``step()`` recomputes each request's prompt + completion so far with the new weights (a prefill)
   and samples on.

What each request already returned stays as it was: its tokens and the log-probs of the policy that sampled them
(``processed_logprobs``). So a completion is made of pieces, one per version, and the behaviour log-probs the
off-policy corrections use (``Rollouts.logprobs``) are, token by token, those of the policy that sampled each token;
``Rollouts.token_versions`` [N, T] says which (``Rollouts.policy_version``: the oldest, the version the batch started
with, which ``policy_staleness`` counts from). The rollout store keeps them as runs (:mod:`grpokit.store.versions`).

Requests are one sample each (``n = 1``): sample i of a group gets the seed ``seed + i``, the seeds vLLM gives the
children of an ``n = G`` request, so without an update this returns what ``VLLMRolloutEngine.generate`` returns.
Each request streams its new tokens (``RequestOutputKind.DELTA``), tagged with the version loaded when they came.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpokit.rollout.types import Rollouts, SamplingParams


@dataclass(frozen=True)
class WeightUpdate:
    """New weights for the engine: ``model``'s (the policy, or a copy of it taken when they were published) are
    loaded, and the tokens sampled after it carry ``version``."""

    version: int
    model: torch.nn.Module


# Called after each engine step with the number of steps so far, while requests are left: new weights, or None.
Updates = Callable[[int], WeightUpdate | None]


@dataclass
class _Piece:
    """One sample's tokens so far, their log-probs and versions, and how it finished (None: running)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def sample_requests(prompt_ids: list[list[int]], seeds: list[int], num_generations: int, greedy: bool):
    """(prompt, seed) of each sample, G adjacent per prompt: seed + i for sample i (vLLM's seeds of an n = G
    request's children); greedy: the group's seed for all (they are equal anyway)."""
    return [
        (list(p), seed if greedy else seed + i) for p, seed in zip(prompt_ids, seeds) for i in range(num_generations)
    ]


def pieces_to_rollouts(
    prompt_ids: list[list[int]], pieces: list[_Piece], num_generations: int, pad_token_id: int, first_version: int
) -> Rollouts:
    """Rollouts of the samples (G adjacent per prompt), right-padded to the longest; ``token_versions`` [N, T]
    (0 on padding), None when every token is by ``first_version``."""
    width = max([len(p.token_ids) for p in pieces] + [1])
    N = len(pieces)
    completion_ids = torch.full((N, width), pad_token_id, dtype=torch.long)  # [N, T]
    completion_mask = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    logprobs = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    versions = torch.zeros((N, width), dtype=torch.long)  # [N, T]
    for i, piece in enumerate(pieces):
        n = len(piece.token_ids)
        if len(piece.logprobs) != n:
            raise ValueError(
                "vLLM returned no log-prob for some sampled tokens; sample with SamplingParams(logprobs=0)"
            )
        if piece.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM finished a completion with reason {piece.finish_reason!r} (expected stop or length)"
            )
        completion_ids[i, :n] = torch.tensor(piece.token_ids, dtype=torch.long)
        completion_mask[i, :n] = 1.0
        logprobs[i, :n] = torch.tensor(piece.logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(piece.versions, dtype=torch.long)
    moved = any(v != first_version for p in pieces for v in p.versions)
    return Rollouts(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=logprobs,
        finish_reasons=[p.finish_reason for p in pieces],
        num_generations=num_generations,
        policy_version=first_version,
        token_versions=versions if moved else None,
    )


def generate_partial(
    engine,
    prompt_ids: list[list[int]],
    num_generations: int,
    params: SamplingParams,
    seeds: list[int] | None = None,
    updates: Updates | None = None,
) -> Rollouts:
    """G samples per prompt from ``engine`` (a :class:`~grpokit.rollout.vllm.engine.VLLMRolloutEngine`), its vLLM
    driven step by step; after each step ``updates(steps)`` may hand over new weights, loaded before the next step
    (module docstring). ``seeds``: one per prompt, drawn from ``engine.generator`` when None."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    from grpokit.rollout.vllm.engine import vllm_sampling_kwargs

    if seeds is None:
        seeds = torch.randint(0, 2**62, (len(prompt_ids),), generator=engine.generator).tolist()
    samples = sample_requests(prompt_ids, seeds, num_generations, params.greedy)
    pieces = [_Piece() for _ in samples]
    core = engine.llm.llm_engine
    engine._wake()
    try:
        version = engine.policy_version
        first_version = version
        ids: dict[str, int] = {}
        for k, (prompt, seed) in enumerate(samples):
            kwargs = vllm_sampling_kwargs(params, 1, seed, engine.eos_token_ids)
            settings = VLLMSamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
            given = core.add_request(f"grpokit-{k}", {"prompt_token_ids": prompt}, settings)
            ids[f"grpokit-{k}"] = ids[str(given)] = k  # outputs name ours; the id vLLM returns has a suffix
        steps = 0
        while core.has_unfinished_requests():
            for output in core.step():
                _take(pieces[ids[output.request_id]], output, version)
            steps += 1
            update = updates(steps) if updates is not None and core.has_unfinished_requests() else None
            if update is not None:
                load_between_steps(engine, update)
                version = update.version
    finally:
        engine._sleep()
    return pieces_to_rollouts(prompt_ids, pieces, num_generations, engine.pad_token_id, first_version)


def _take(piece: _Piece, output, version: int) -> None:
    """Append a step's new tokens of one request (a DELTA ``RequestOutput``), tagged ``version``."""
    sample = output.outputs[0]
    new = list(sample.token_ids)
    if sample.logprobs is None or len(sample.logprobs) != len(new):
        raise ValueError("vLLM returned no log-prob for some sampled tokens; sample with SamplingParams(logprobs=0)")
    piece.token_ids += new
    piece.logprobs += [step[token].logprob for step, token in zip(sample.logprobs, new)]
    piece.versions += [version] * len(new)
    if output.finished:
        piece.finish_reason = sample.finish_reason


def load_between_steps(engine, update: WeightUpdate) -> None:
    """Pause the running requests (preempted, kept: their KV is recomputed on the next step), load ``update``'s
    weights by vLLM's reload path, and record the version vLLM now holds."""
    from grpokit.rollout.vllm.weights import push_weights

    if not engine.llm.llm_engine.reset_prefix_cache(reset_running_requests=True):
        raise RuntimeError("vLLM could not pause its running requests (reset_prefix_cache) for new weights")
    push_weights(engine.llm, update.model)
    engine._loaded_version = update.version if update.model is engine.policy else None
