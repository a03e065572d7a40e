"""The vLLM part of scripts/gpu_check.py (grpokit.testing.vllm_gpu_check.run) in its dry-run form, on vLLM's CPU
build: every check runs and its figures say what they should (the sleep/wake check is the GPU's alone)."""

from __future__ import annotations

from grpokit.testing.vllm_gpu_check import run


def test_vllm_gpu_check_dry_run_on_the_cpu():
    out = run(device="cpu", dry_run=True)
    assert out["sleep_wake"] == {"status": "skipped", "reason": "vLLM's CPU build has no sleep mode"}
    throughput = out["throughput"]
    assert throughput["tokens_per_s_bfloat16"] > 0 and throughput["tokens_per_s_float32"] > 0, throughput
    reload = out["reload_paths"]
    assert reload["gap_loaded_from_folder"] <= 1e-5 and reload["gap_after_reload_weights"] <= 1e-5, reload
    # the direct path fails on the CPU build: its linear layers were repacked and lost their weight_loader
    assert "weight_loader" in reload["direct_load_weights_error"], reload
    lora = out["lora_drift"]
    assert lora["syncs"] == 100 and lora["base_bitwise_unchanged"] is True, lora
    assert lora["merge_unmerge_max_drift"] > 0 and lora["logprob_gap_bf16"] < 0.02, lora
