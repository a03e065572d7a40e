"""vLLM's part of the GPU check (``scripts/gpu_check.py`` calls :func:`run`): what the CPU build cannot show.

    run(device="cuda", dry_run=False)   # on one CUDA GPU with vLLM's CUDA build
    run(device="cpu", dry_run=True)     # vLLM's CPU build, tiny sizes (make test-vllm runs it)

Each check is a function returning a dict of figures:

- :func:`check_sleep_wake`: sleep (level 2) / wake cycles as the engine runs them: the GPU memory each sleep frees,
  and the learner-vLLM log-prob gap after each wake and reload (CUDA only: the CPU build has no sleep mode).
- :func:`check_throughput`: generated tokens per second, vLLM in bf16 against vLLM in fp32 (the engine's default on a
  GPU is bf16 whatever the learner's dtype).
- :func:`check_reload_paths`: the log-prob gap after vLLM's supported reload (``reload_weights``, the engine's path)
  against the direct ``model.load_weights`` path (TRL's and older engines'), on perturbed weights.
- :func:`check_lora_drift`: 100 LoRA syncs (merged out of place) on a bf16 base: the base bitwise unchanged and the gap
  after the last sync; beside it, the drift 100 peft ``merge_adapter``/``unmerge_adapter`` round trips leave.
"""

from __future__ import annotations

import copy
import gc
import tempfile
import time

import torch

from grpokit.rollout.vllm.settings import VLLMSettings, vllm_llm_kwargs, vllm_spec
from grpokit.rollout.vllm.weights import push_weights, vllm_weight_items

PROMPTS = [[5 + i, 6 + i, 7 + i] for i in range(8)]


def _sizes(dry_run: bool) -> dict:
    # head_dim 32 on the CPU (the narrowest its attention runs), 128 on a GPU
    return (
        dict(hidden_size=64, num_layers=2, num_heads=2) if dry_run else dict(hidden_size=512, num_layers=4, num_heads=4)
    )


def _build_llm(folder: str, device: str, dtype: str, sleep_mode: bool = False):
    from vllm import LLM

    from grpokit.rollout.vllm.engine import single_process_env

    single_process_env()
    settings = VLLMSettings(
        vllm_enable_sleep_mode=sleep_mode, vllm_dtype=dtype, vllm_enforce_eager=True, vllm_kv_cache_gib=1.0
    )
    spec = vllm_spec(settings, folder, trust_remote_code=False, default_len=None)  # as the engine derives it
    kwargs = vllm_llm_kwargs(spec, platform=device, dtype=dtype, max_model_len=128, sleep_mode=sleep_mode, seed=0)
    return LLM(model=folder, **kwargs)


def _with_llm(folder: str, device: str, dtype: str, use, sleep_mode: bool = False):
    """``use(llm)`` on a fresh vLLM, shut down before this returns: its finalizer tears down the process groups,
    so it must not outlive the next one's construction."""
    from grpokit.rollout.vllm.engine import shutdown_llm

    llm = _build_llm(folder, device, dtype, sleep_mode)
    try:
        return use(llm)
    finally:
        shutdown_llm(llm)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _generate(llm, max_tokens: int, n: int = 4):
    from vllm import SamplingParams

    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=0, logprobs=0, detokenize=False)
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)


@torch.no_grad()
def logprob_gap(model: torch.nn.Module, outputs) -> float:
    """Mean |learner - vLLM| log-prob over the sampled tokens of vLLM's ``outputs`` (the learner in float32)."""
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for request in outputs:
        for c in request.outputs:
            ids = torch.tensor([list(request.prompt_token_ids) + list(c.token_ids)], device=device)
            logits = model(ids).logits.float()[0, len(request.prompt_token_ids) - 1 : -1]  # [T, V]
            learner = logits.log_softmax(-1).gather(-1, ids[0, len(request.prompt_token_ids) :, None])[:, 0]
            sampled = torch.tensor([s[t].logprob for s, t in zip(c.logprobs, c.token_ids)], device=device)
            total += float((learner - sampled).abs().sum())
            count += len(c.token_ids)
    return total / max(count, 1)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))


def check_sleep_wake(folder: str, model: torch.nn.Module, device: str, cycles: int = 3) -> dict:
    if device != "cuda":
        return {"status": "skipped", "reason": "vLLM's CPU build has no sleep mode"}

    def cycle_through(llm) -> list[dict]:
        rows = []
        for cycle in range(cycles):
            _perturb(model, cycle)
            free_awake = torch.cuda.mem_get_info()[0]
            llm.sleep(level=2)
            freed = torch.cuda.mem_get_info()[0] - free_awake
            torch.cuda.empty_cache()
            llm.wake_up(tags=["weights"])
            push_weights(llm, model)  # level 2 forgot the weights: the engine reloads them on each wake
            llm.wake_up(tags=["kv_cache"])
            gap = logprob_gap(model, _generate(llm, 16))
            rows.append({"cycle": cycle, "freed_gib": freed / 2**30, "logprob_gap_bf16": gap})
        return rows

    return {"cycles": _with_llm(folder, device, "bfloat16", cycle_through, sleep_mode=True)}


def check_throughput(folder: str, device: str, max_tokens: int) -> dict:
    def tokens_per_s(llm) -> float:
        _generate(llm, 4)  # warm-up
        start = time.perf_counter()
        outputs = _generate(llm, max_tokens)
        seconds = time.perf_counter() - start
        return sum(len(c.token_ids) for r in outputs for c in r.outputs) / seconds

    out = {f"tokens_per_s_{dtype}": _with_llm(folder, device, dtype, tokens_per_s) for dtype in ("bfloat16", "float32")}
    out["bf16_over_fp32"] = out["tokens_per_s_bfloat16"] / out["tokens_per_s_float32"]
    return out


def check_reload_paths(folder: str, model: torch.nn.Module, device: str) -> dict:
    """float32 vLLM, so the gap shows the weights and not rounding; the direct path last (it may leave vLLM's
    model half-loaded)."""

    def compare(llm) -> dict:
        gap_before = logprob_gap(model, _generate(llm, 16))
        _perturb(model, 100)
        push_weights(llm, model)
        out = {"gap_loaded_from_folder": gap_before, "gap_after_reload_weights": logprob_gap(model, _generate(llm, 16))}
        _perturb(model, 101)
        items = [(n, t.clone()) for n, t in vllm_weight_items(model)]
        try:
            llm.apply_model(lambda m: m.load_weights(iter(items)))
            llm.reset_prefix_cache()
            out["gap_after_direct_load_weights"] = logprob_gap(model, _generate(llm, 16))
        except Exception as exc:  # vLLM's CPU build: the repacked layers have no weight_loader
            out["direct_load_weights_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return out

    return _with_llm(folder, device, "float32", compare)


def check_lora_drift(folder: str, model: torch.nn.Module, device: str, syncs: int = 100) -> dict:
    import peft

    base = copy.deepcopy(model).to(torch.bfloat16)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    lora = peft.get_peft_model(base, config)
    with torch.no_grad():  # B starts at 0: make the adapters matter
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    frozen = {n: p.detach().clone() for n, p in lora.named_parameters() if "lora_" not in n}

    def sync(llm) -> float:
        for _ in range(syncs):
            push_weights(llm, lora)
        return logprob_gap(lora, _generate(llm, 16))

    gap = _with_llm(folder, device, "bfloat16", sync)
    unchanged = all(torch.equal(p, frozen[n]) for n, p in lora.named_parameters() if "lora_" not in n)
    old_way = copy.deepcopy(lora)  # peft's in-place merge and unmerge, the engine's way before this fix
    for _ in range(syncs):
        old_way.merge_adapter()
        old_way.unmerge_adapter()
    drift = max(
        float((p.float() - frozen[n].float()).abs().max()) for n, p in old_way.named_parameters() if "lora_" not in n
    )
    return {
        "syncs": syncs,
        "base_bitwise_unchanged": unchanged,
        "logprob_gap_bf16": gap,
        "merge_unmerge_max_drift": drift,
    }


def run(device: str = "cuda", dry_run: bool = False) -> dict:
    """Every check on ``device`` (``cpu``: vLLM's CPU build; ``dry_run``: tiny sizes): {check: figures}."""
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    out: dict = {"device": device, "dry_run": dry_run}
    with tempfile.TemporaryDirectory(prefix="grpokit-vllm-check-") as folder:
        tokenizer = build_word_tokenizer([f"w{i}" for i in range(200)])
        model, _ = build_tiny_causal_lm(folder, tokenizer, arch="llama", max_positions=128, **_sizes(dry_run))
        model = model.to(device).eval()
        checks = {
            "sleep_wake": lambda: check_sleep_wake(folder, model, device),
            "throughput": lambda: check_throughput(folder, device, 16 if dry_run else 256),
            "reload_paths": lambda: check_reload_paths(folder, model, device),
            "lora_drift": lambda: check_lora_drift(folder, model, device, 100),
        }
        for name, check in checks.items():
            try:
                out[name] = check()
            except Exception as exc:  # one check's failure is a figure; the others still run
                out[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
    return out
