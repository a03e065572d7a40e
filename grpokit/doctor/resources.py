"""Doctor's resource check: the memory estimate (grpokit/memory/, as `grpokit explain`) against what the
device has free, and the time of the measured mini-step (the doctor's groups: sampled, scored, their log-probs
computed) scaled to the configured step."""

from __future__ import annotations

from grpokit.doctor.result import FAIL, PASS, SKIP, Check

# A learner's update (forward with gradients, backward, optimizer) takes about 3 forward passes of the same rows.
UPDATE_PER_FORWARD = 3.0


def memory_check(run) -> Check:
    from grpokit.compose.memory import estimate_memory
    from grpokit.memory.fit import available_bytes, process_bytes
    from grpokit.memory.shape import build_meta_model

    cfg = run.config
    try:
        estimate = estimate_memory(cfg, build_meta_model(cfg.model_name_or_path, cfg.trust_remote_code), run.device)
    except Exception as exc:  # a model grpokit cannot inspect (not a HF model): say so and go on
        return Check("memory", SKIP, f"no estimate ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    free = available_bytes(run.device)
    need = process_bytes(estimate, run.device)
    if free is None:
        return Check("memory", SKIP, f"about {_gib(need)} needed; free memory of {run.device.type} unknown")
    detail = f"about {_gib(need)} at the peak (weights, reference, AdamW, the largest phase) of {_gib(free)} free"
    if need > free:
        fix = "fewer completions per micro-batch, gradient checkpointing, LoRA, or a bf16 reference (docs/memory.md)"
        return Check("memory", FAIL, detail + f" on {run.device.type}", fix)
    return Check("memory", PASS, detail + f" on {run.device.type}")


def step_time_check(run, sample_seconds: float, score_seconds: float, forward_seconds: float, groups: int) -> Check:
    """The measured mini-step of ``groups`` groups scaled to the configured prompts per step: linear in prompts, first
    calls included, so an upper bound (batching makes a real step cheaper per prompt)."""
    per_step = run.config.prompts_per_step()
    scale = per_step / groups
    estimate = scale * (sample_seconds + score_seconds + (1 + UPDATE_PER_FORWARD) * forward_seconds)
    detail = (
        f"{groups} groups: sampling {sample_seconds:.2f} s, rewards {score_seconds:.2f} s, log-probs "
        f"{forward_seconds:.2f} s; a step of {per_step} prompts: at most about {estimate:.1f} s "
        f"({run.config.max_steps} steps: about {_duration(estimate * max(run.config.max_steps, 0))})"
    )
    return Check("time per step", PASS, detail)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
