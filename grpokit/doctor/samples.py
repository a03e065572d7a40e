"""Doctor checks on a few groups sampled with the configured engine: token round trips, sampler-learner parity,
the rewards, and the resources a step needs."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from grpokit.data.prompts import reward_arguments
from grpokit.doctor.result import FAIL, PASS, SKIP, WARN, Check
from grpokit.models.loading import decode

# Mean |sampler - learner| log-prob gap per token above which the importance weights are wrong (float32 gives ~1e-6,
# bf16 ~1e-2); the max is reported, the mean decides.
PARITY_FAIL = 0.05


@dataclass
class Sample:
    """The groups the doctor sampled: the prompts' dataset ``indices``, the ``rollouts`` and their timings."""

    indices: list[int]
    rollouts: object
    sample_seconds: float
    score_seconds: float = 0.0  # set by reward_checks
    forward_seconds: float = 0.0  # set by parity_check: the learner's log-probs of the sample


def sample_groups(run, groups: int) -> Sample:
    """``groups`` groups of G completions of the first usable training prompts, sampled as in training."""
    source = run.train_source
    indices = [int(i) for i in source.usable][:groups]
    started = time.perf_counter()
    rollouts = run.engine.generate([source.ids[i] for i in indices], run.spec.num_generations, run.evaluator.params)
    return Sample(indices, rollouts, time.perf_counter() - started)


def round_trip_check(run, sample: Sample) -> Check:
    """Decode then re-encode each completion: the fraction of its tokens that come back different (a multi-turn
    rollout that re-encodes text trains on other tokens than it sampled)."""
    r = sample.rollouts
    changed = total = 0
    special = set(getattr(run.tokenizer, "all_special_ids", None) or [])  # decoding drops them by design
    for ids, n in zip(r.completion_ids, r.completion_lengths.tolist()):
        body = [t for t in ids[:n].tolist() if t not in special]
        again = run.tokenizer.encode(decode(run.tokenizer, body), add_special_tokens=False)
        same = next((i for i, (a, b) in enumerate(zip(body, again)) if a != b), min(len(body), len(again)))
        changed += max(len(body), len(again)) - same
        total += len(body)
    fraction = changed / total if total else 0.0
    detail = (
        f"decoding then re-encoding {r.completion_ids.size(0)} completions changes {fraction:.1%} of their "
        f"{total} tokens (special tokens left out)"
    )
    if fraction > 0:
        return Check(
            "token round trip",
            WARN,
            detail,
            "keep token ids between turns (grpokit's multi-turn engine does); never re-encode decoded text",
        )
    return Check("token round trip", PASS, detail)


def parity_check(run, sample: Sample) -> Check:
    """The engine's sampling log-probs against the learner's recomputation of the same tokens."""
    from grpokit.train.learning.policy_logprobs import build_batch

    r = sample.rollouts
    started = time.perf_counter()
    batch = build_batch(run.model, r, run.tokenizer.pad_token_id, run.device)
    learner = run.learner.old_logprobs(batch).float().cpu()  # [N, T]
    sample.forward_seconds = time.perf_counter() - started
    mask = r.completion_mask.bool()
    signed = (r.logprobs.float() - learner)[mask]  # sampler - learner, per sampled token
    if signed.numel() == 0:
        return Check("sampler-learner parity", SKIP, "no completion token sampled")
    gap = signed.abs()
    params, engine = run.evaluator.params, run.config.engine
    filtered = params.top_p < 1.0 or params.top_k > 0 or params.min_p > 0
    detail = f"engine {engine}: |log-prob gap| mean {gap.mean():.2e}, max {gap.max():.2e} over {gap.numel()} tokens"
    if filtered and engine == "vllm":  # the processed distribution's log-probs: p / Z against the learner's raw p
        # top-p alone keeps a mass Z >= top_p, so the gap log(1/Z) lies in [0, -log(top_p)]; top-k and min-p: >= 0
        only_top_p = params.top_k == 0 and params.min_p == 0
        bound = -math.log(params.top_p) if only_top_p else math.inf
        outside = (signed < -PARITY_FAIL) | (signed > bound + PARITY_FAIL)
        detail += (
            "; with top-p/top-k/min-p vLLM's log-probs are the processed distribution's (after filtering, the one "
            f"the token was drawn from), the learner's the raw one's: the gap is log(1/Z), Z the mass kept (mean "
            f"{signed.mean():.3g}), so learner/sampler importance weights are about {math.exp(-signed.mean()):.3g} "
            "where 1 was meant"
        )
        broken = bool(outside.any())
    else:
        if filtered:
            detail += (
                "; with top-p/top-k/min-p the engine's log-probs are the raw distribution's (before filtering), as "
                "the learner's: the token was drawn from the renormalised one (probability p / Z, Z the mass kept), "
                "so importance weights against the raw one are 1/Z times the true ones"
            )
        broken = bool(gap.mean() > PARITY_FAIL)
    if broken:
        return Check(
            "sampler-learner parity",
            FAIL,
            detail,
            "the engine samples from other weights than the learner's: check the weight sync (generation.engine, "
            "vllm's load format, dtype), or correct it (off_policy_correction: behaviour)",
        )
    return Check("sampler-learner parity", PASS, detail)


def reward_checks(run, sample: Sample) -> list[Check]:
    """Each reward's time per call, None and error rates and spread, and the groups whose totals all tie."""
    from grpokit.rewards.runner import RewardError

    r, G = sample.rollouts, sample.rollouts.num_generations
    prompts, texts, columns, ids = reward_arguments(
        run.train_rows, sample.indices, r, run.tokenizer, run.evaluator.prompt_column
    )
    started = time.perf_counter()
    try:
        result = run.rewards.score(prompts, texts, columns, group_size=G, completion_ids=ids)
    except RewardError as exc:
        return [Check("rewards", FAIL, str(exc), "fix the reward function (its error is above)")]
    seconds = sample.score_seconds = time.perf_counter() - started
    checks = []
    n = len(texts)
    for f, name in enumerate(result.names):
        values = result.per_func[:, f]
        present = values[~values.isnan()]
        errors = result.error_counts[name]
        none = n - len(present) - errors
        spread = f"std {present.std():.3g}, range {present.min():.3g}..{present.max():.3g}" if len(present) > 1 else ""
        detail = f"{none / n:.0%} None, {errors / n:.0%} errors; {spread}"
        status, fix = PASS, ""
        if errors:
            status, fix = WARN, "a failing call scores None: see the error stored with the completion (grpokit inspect)"
        if errors == n:
            status = FAIL
        checks.append(Check(f"reward {name}", status, detail, fix))
    combined = result.combined.view(-1, G)
    flat = [bool(torch.nan_to_num(row, nan=math.inf).unique().numel() == 1) for row in combined]
    detail = (
        f"{seconds:.3g} s per call of {n} completions ({len(result.names)} functions); {sum(flat)} of {len(flat)} "
        "groups have zero variance"
    )
    if all(flat):
        checks.append(
            Check(
                "reward spread",
                FAIL,
                detail + ": every group's totals tie, so every advantage is 0 and GRPO learns nothing",
                "a larger num_generations, a softer reward (partial credit), or a higher temperature",
            )
        )
    else:
        checks.append(Check("reward spread", WARN if sum(flat) > len(flat) / 2 else PASS, detail, _SPREAD_FIX))
    return checks


_SPREAD_FIX = "most groups tie: a larger num_generations, a softer reward, or dynamic_sampling: true"
