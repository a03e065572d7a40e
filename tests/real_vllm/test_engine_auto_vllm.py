"""generation.engine: auto with vLLM's CPU build installed: a one-step CLI run measures both engines on the run's
model (grpokit/compose/engine_auto.py), caches the rates, says which engine it resolved to in the run's config.yaml,
and trains with it; a second resolution reads the cache."""

from __future__ import annotations

import json

from real_vllm_helpers import cli_train, metrics

from grpokit.rollout.engine_choice import CACHE_FOLDER, env_line


def test_auto_measures_caches_and_trains(tmp_path, vllm_model_dir, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    monkeypatch.delenv("GRPOKIT_ENGINE_AUTO", raising=False)
    run = tmp_path / "auto"
    cli_train(tmp_path, vllm_model_dir, run, engine="auto", max_steps=1)
    (saved,) = (cache / CACHE_FOLDER).glob("*.json")
    rates = json.loads(saved.read_text())["rates"]
    assert set(rates) == {"hf", "vllm"} and all(rate > 0 for rate in rates.values()), rates
    picked = "vllm" if rates["vllm"] > 1.05 * rates["hf"] else "hf"
    config = (run / "config.yaml").read_text()
    assert f"engine: auto -> {picked} (" in config and "measured now, saved in" in config, config[:2000]
    lines = metrics(run)
    assert [line["step"] for line in lines] == [1] and lines[0]["loss"] == lines[0]["loss"]  # trained, finite
    assert ("sampling_is/logprob_abs_diff" in lines[0]) == (picked == "vllm")  # vLLM's own log-probs weigh tokens
    assert f"{picked} (" in env_line("cpu") and "cached in" in env_line("cpu")
