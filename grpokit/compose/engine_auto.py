"""``generation.engine: auto`` resolved for a run once its policy has loaded (:mod:`grpokit.rollout.engine_choice`
decides; this module gives it the run's facts): which engines the run's settings allow, and on a CPU a short
measurement of each on the run's own model, through the engines' own ``generate`` as a run samples."""

from __future__ import annotations

import time

import torch

from grpokit.config import ConfigError, GRPOConfig
from grpokit.rollout import engine_choice

MEASURE_ROWS = 8  # completions per timed generate (at most; the run's own per-step count when smaller)
MEASURE_TOKENS = 16  # new tokens per completion
PROMPT_TOKENS = 16


def resolve_run_engine(config: GRPOConfig, procs, *, model, tokenizer, device, source, compute, prompts, tools):
    """(the config with ``engine`` resolved, the choice) for a run whose ``generation.engine`` is auto. ``compute``:
    the run's RunCompute as for grpokit's sampler (hf measures at its sampling dtype, another engine at the
    learning dtype, as each would sample)."""
    from grpokit.kernels.cpu_probe import matmul_shapes

    rows = max(1, min(MEASURE_ROWS, config.completions_per_step()))
    shape = {
        "shapes": [[s.in_features, s.out_features, s.count] for s in matmul_shapes(model)],
        "dtypes": [str(compute.learning), str(compute.sampling), str(next(model.parameters()).dtype)],
        "rows": rows,
        "tokens": MEASURE_TOKENS,
    }
    choice = engine_choice.resolve(
        device.type,
        lambda names: measure(names, config, model, tokenizer, device, source, compute, rows),
        shape=shape,
        refusal=lambda name: refusal(name, config, procs, device, source, model, prompts, tools),
        world_size=procs.world_size,
    )
    return config.replace(engine=choice.name), choice


def refusal(name: str, config: GRPOConfig, procs, device, source, model, prompts, tools) -> str | None:
    """Why this run cannot sample with engine ``name`` (its config's rules, the engine's environment check, images,
    a custom module), or None."""
    from grpokit.compose.rollouts import engine_kind
    from grpokit.compose.vision_paths import check_image_paths
    from grpokit.config.rules import engine_settings
    from grpokit.models.loading import is_hf_model
    from grpokit.rollout.engines import EngineSite

    if not is_hf_model(model) or source is None:
        return "the policy is not a Hugging Face model given by its folder or hub id"
    try:
        named = config.replace(engine=name)
        named.validate(procs.world_size)
        kind = engine_kind(name)
        if kind.check_environment is not None:
            kind.check_environment(engine_settings(named, name), EngineSite(procs.enabled, device.type, None))
        check_image_paths(named, name, prompts, procs, tools, None)
    except (ConfigError, ValueError) as exc:
        return str(exc).splitlines()[0]
    return None


def measure(names: list[str], config: GRPOConfig, model, tokenizer, device, source, compute, rows: int) -> dict:
    """{engine: completion tokens per second}: each engine of ``names`` built as the run would build it, one warm-up
    generate, then the faster of two timed generates of ``rows`` completions of MEASURE_TOKENS new tokens (EOS held
    back) on the same random prompts; a vLLM engine is closed afterwards."""
    from dataclasses import replace

    from grpokit.compose.rollouts import engine_kind, engine_parts
    from grpokit.config.rules import engine_settings
    from grpokit.kernels import Kernels
    from grpokit.rollout.types import SamplingParams

    params = SamplingParams(MEASURE_TOKENS, 1.0, 1.0, 0, 0.0, 1.0, min_new_tokens=MEASURE_TOKENS)
    with torch.random.fork_rng(devices=[]):  # a seeded run draws the same numbers whether it measured or not
        torch.manual_seed(0)
        vocab = min(int(getattr(tokenizer, "vocab_size", None) or len(tokenizer)), model.config.vocab_size)
        prompt = torch.randint(0, vocab, (PROMPT_TOKENS,)).tolist()
        rates = {}
        for name in names:
            kind = engine_kind(name)
            named = config.replace(engine=name)
            parts = engine_parts(named, model, tokenizer, device, source, None, None, None)
            dtype = compute.sampling if kind.own_sampler else compute.learning
            kernels = Kernels.select(device, dtype) if kind.own_sampler else None  # as the run's hf engine
            engine = kind.build(replace(parts, autocast_dtype=dtype, kernels=kernels), engine_settings(named, name))
            try:
                rates[name] = _rate(engine, prompt, rows, params)
            finally:
                if hasattr(engine, "close"):
                    engine.close()
    return rates


def _rate(engine, prompt: list[int], rows: int, params) -> float:
    engine.generate([prompt], rows, params)  # warm-up (vLLM compiles and allocates its cache here)
    best, tokens = float("inf"), 0.0
    for _ in range(2):
        start = time.perf_counter()
        out = engine.generate([prompt], rows, params)
        seconds = time.perf_counter() - start
        if seconds < best:
            best, tokens = seconds, float(out.completion_mask.sum())
    return tokens / best
