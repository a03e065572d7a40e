"""Bounded staleness (distributed.max_staleness K) through the CLI on the tiny model, without Ray: a copy of the
policy samples ahead on a background thread. The store holds each sample's policy version, and every one obeys the
bound; the staleness is exactly min(step - 1, K) (admission is by step, not by timing); the run equals itself
resumed after a SIGTERM-made checkpoint; K = 0 is the synchronous run."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import TARGET_REWARD, cli_env, signal_after_step, tiny_args, tiny_run_config, word_prompts

G, PROMPTS_PER_STEP, STEPS = 4, 2, 6


def write_config(tmp_path: Path, model_dir: Path, **run) -> Path:
    path = tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=STEPS,
        num_generations=G,
        prompts_per_step=PROMPTS_PER_STEP,
        optim={"lr_scheduler_type": "constant"},
        run=run,
    )
    return path.rename(tmp_path / "config.yaml")


def train(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "train", str(config), *overrides],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,  # generous: two busy cores shared with other runs
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def stored_versions(run: Path) -> dict[int, set[int]]:
    """step -> the policy versions of its stored samples, read back from rollouts.sqlite."""
    found: dict[int, set[int]] = {}
    with sqlite3.connect(run / "rollouts.sqlite") as db:
        for step, version in db.execute("SELECT step, policy_version FROM rollouts"):
            found.setdefault(step, set()).add(version)
    return found


def metrics(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "loss" in m]


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_every_stored_sample_obeys_the_bound(tmp_path, tiny_model_dir, k):
    config = write_config(tmp_path, tiny_model_dir)
    train(config, f"max_staleness={k}")
    run = tmp_path / "run"
    versions = stored_versions(run)
    assert sorted(versions) == list(range(1, STEPS + 1))
    for step, found in versions.items():
        trained_at = step - 1  # the updates made before step `step` trains
        assert all(trained_at - v <= k for v in found), (step, found)
        # admission is by step: step s is sampled by version max(0, s - 1 - K), exactly
        assert found == {max(0, trained_at - k)}, (step, found)
    staleness = [m["policy_staleness"] for m in metrics(run)]
    assert staleness == [min(s - 1, k) for s in range(1, STEPS + 1)]
    if k:
        assert all("async/learner_wait_s" in m and "async/producer_wait_s" in m for m in metrics(run))
        # report.html plots the staleness and the waits over the steps
        html = (run / "report.html").read_text()
        curves = json.loads(re.search(r'id="grpokit-data">(.*?)</script>', html).group(1))
        staleness = curves["Staleness (updates between sampling and training)"]["policy_staleness"]
        assert [value for _, value in staleness] == [min(s - 1, k) for s in range(1, STEPS + 1)]
        waits = curves["Waiting per step (s): learner for data, producer on the staleness bound"]
        assert set(waits) == {"async/learner_wait_s", "async/producer_wait_s"}
    # `grpokit inspect --sql` selects by the policy version
    done = subprocess.run(
        [sys.executable, "-m", "grpokit.cli", "inspect", str(run), "--sql",
         "SELECT count(*) AS n FROM rollouts WHERE policy_version = 0"],
        env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert str(G * PROMPTS_PER_STEP * min(k + 1, STEPS)) in done.stdout


def test_decoupled_ppo_with_sequence_mis_trains_and_logs_its_weights(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir)
    train(
        config,
        "max_staleness=2",
        "off_policy_correction=decoupled_ppo",
        "off_policy_is_mode=sequence_mask",
        "off_policy_is_min=0.5",
        "off_policy_is_max=2.0",
    )
    steps = metrics(tmp_path / "run")
    assert len(steps) == STEPS
    for m in steps:
        assert 0.0 <= m["sampling_is/masked_fraction"] <= 1.0 and m["sampling_is/capped_fraction"] == 0.0
        assert m["sampling_is/weight_min"] == 0.0 or m["sampling_is/weight_min"] >= 0.5
        assert m["sampling_is/weight_max"] <= 2.0
    assert steps[0]["sampling_is/weight_mean"] == pytest.approx(1.0)  # step 1 is on-policy: every weight is 1


def test_a_run_stopped_with_batches_queued_resumes_to_the_same_numbers(tmp_path, tiny_model_dir):
    """K = 2: a SIGTERM after step 3 checkpoints with steps 4 and 5 queued (sampled by versions 1 and 2); the resumed
    run trains on them and ends with the numbers and weights of a straight run."""
    import signal

    import torch
    from safetensors.torch import load_file

    from grpokit import GRPOTrainer
    from grpokit.store import RolloutStore

    prompts = word_prompts(20, 4)

    def trainer(run: Path, **more) -> GRPOTrainer:
        args = tiny_args(
            run, num_generations=G, prompts_per_step=PROMPTS_PER_STEP, max_steps=STEPS, learning_rate=5e-3,
            beta=0.04, save_steps=0, max_staleness=2, off_policy_correction="decoupled_ppo", **more,
        )  # fmt: skip
        return GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=prompts)

    def rows(run: Path) -> list[tuple]:
        with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
            return [(r["step"], r["completion"], r["policy_version"], r["advantage"]) for r in store.rollouts()]

    straight = tmp_path / "straight"
    trainer(straight).train()

    run = tmp_path / "run"
    first = trainer(run)
    signal_after_step(first, 3, signal.SIGTERM)
    first.train()
    assert first.step == 3
    queue = torch.load(run / "checkpoints" / "step-3" / "states.pt", weights_only=True)["pending_rollouts"]["queue"]
    assert [(e["step"], e["rollouts"]["policy_version"]) for e in queue] == [(4, 1), (5, 2)]

    trainer(run, resume_from="latest").train()
    assert rows(run) == rows(straight)
    compared = ("loss", "policy_loss", "kl", "grad_norm", "reward", "policy_staleness", "sampling_is/weight_mean")
    for a, b in zip(metrics(straight), metrics(run), strict=True):
        for key in compared:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    wa, wb = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_the_demo_task_trains_through_the_cli_at_each_bound(tmp_path, k):
    """`grpokit train` on the demo's config (a tiny warm start of its model, 3 steps), K = 0, 1, 2, 4: every stored
    sample obeys the bound. The measured comparison of pass@1 at 20 steps is bench/async_staleness.py's."""
    from grpokit.demo import WarmStartConfig, ensure_demo_policy
    from grpokit.demo.run import CONFIG_PATH

    tiny = WarmStartConfig(hidden_size=16, num_layers=1, num_heads=2, clean_steps=3, sloppy_steps=2, batch_size=8)
    policy = ensure_demo_policy(tmp_path / "cache", config=tiny)
    run = tmp_path / "run"
    train(
        Path(CONFIG_PATH),
        f"model_name_or_path={policy}",
        f"output_dir={run}",
        "max_steps=3",
        "eval_strategy=no",
        "report_to=[jsonl]",
        "progress_bar=false",
        f"max_staleness={k}",
        "off_policy_correction=decoupled_ppo",
    )
    versions = stored_versions(run)
    assert sorted(versions) == [1, 2, 3]
    assert all(found == {max(0, step - 1 - k)} for step, found in versions.items()), versions
