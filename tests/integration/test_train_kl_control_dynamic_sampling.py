"""The adaptive KL controller and DAPO's dynamic sampling in training runs on a tiny model, through the public API:
beta follows Ziegler et al.'s rule from the logged KL, no zero-variance group is trained on, the cap on rounds holds,
and a resumed run equals a straight one."""

from __future__ import annotations

import functools
import itertools
import json
from collections import defaultdict
from pathlib import Path

import pytest
from shared_helpers import RAY_WORKERS, tiny_args

from grpokit import GRPOTrainer
from grpokit.algos.kl_control import adaptive_kl_coef
from grpokit.algos.names import BETA, KL, SAMPLING_GROUPS_TRAINED, SAMPLING_PROMPTS, SAMPLING_ROUNDS, SAMPLING_SHORT
from grpokit.store import RolloutStore

pytestmark = pytest.mark.usefixtures("one_thread")

G, PROMPTS_PER_STEP, TARGET_KL, HORIZON = 4, 2, 1e-4, 10.0
# Every other prompt is marked `tie`: its reward is 1.0 for every completion, so its group has zero variance.
ROWS = [{"prompt": " ".join(f"w{j}" for j in range(i, i + 5)), "tie": i % 2 == 0} for i in range(24)]


def tie_or_varied(completions, tie, **kwargs):
    """1.0 for the completions of a `tie` prompt; else a number that differs between completions (their text)."""
    return [1.0 if t else float(sum(map(ord, c)) % 5) for c, t in zip(completions, tie)]


def always_one(completions, **kwargs):
    return [1.0] * len(completions)


config = functools.partial(
    tiny_args,
    num_generations=G,
    prompts_per_step=PROMPTS_PER_STEP,
    max_steps=4,
    max_completion_length=5,
    learning_rate=5e-3,
    lr_scheduler_type="constant",
    beta=0.04,
    kl_controller="adaptive",
    target_kl=TARGET_KL,
    kl_horizon=HORIZON,
    dynamic_sampling=True,
    max_sampling_rounds=4,
    save_steps=1,
)


def train(model_dir, run: Path, reward=tie_or_varied, **overrides) -> None:
    GRPOTrainer(str(model_dir), reward, args=config(run, **overrides), train_dataset=ROWS).train()


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stored(run: Path) -> list[dict]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return list(store.rollouts())


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("straight") / "run"
    train(tiny_model_dir, run)
    return run


def test_beta_follows_the_adaptive_rule_from_the_logged_kl(straight_run):
    logged = metrics(straight_run)
    assert [m["step"] for m in logged] == [1, 2, 3, 4]
    assert logged[0][BETA] == 0.04
    for before, after in itertools.pairwise(logged):
        # beta_{t+1} = beta_t * (1 + clip(kl_t / target - 1, -0.2, 0.2) * n_t / horizon), n_t = completions trained
        n = int(before[SAMPLING_GROUPS_TRAINED]) * G
        expected = adaptive_kl_coef(before[BETA], before[KL], TARGET_KL, HORIZON, n)
        assert after[BETA] == pytest.approx(expected, rel=1e-12)
    # step 1 trains the reference itself: KL 0, below the target, so beta falls by 20% x n / horizon (n = 8: 16%);
    # then the KL is above the tiny target and beta rises
    assert logged[0][KL] == pytest.approx(0.0, abs=1e-6) and logged[0][SAMPLING_GROUPS_TRAINED] == PROMPTS_PER_STEP
    assert logged[1][BETA] == pytest.approx(0.04 * (1 - 0.2 * 8 / HORIZON))
    assert logged[2][BETA] > logged[1][BETA]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_every_loss_type_uses_the_adaptive_beta(tiny_model_dir, tmp_path, loss_type):
    run = tmp_path / "run"
    train(tiny_model_dir, run, max_steps=3, loss_type=loss_type, dynamic_sampling=False, save_steps=0)
    logged = metrics(run)
    n = G * PROMPTS_PER_STEP
    for before, after in itertools.pairwise(logged):
        expected = adaptive_kl_coef(before[BETA], before[KL], TARGET_KL, HORIZON, n)
        assert after[BETA] == pytest.approx(expected, rel=1e-12)
    assert logged[2][BETA] != logged[0][BETA]
    # the loss's KL term had the moved beta: kl_penalty = beta x kl of the same step
    assert logged[2]["kl_penalty"] == pytest.approx(logged[2][BETA] * logged[2][KL], rel=1e-12)


def test_dynamic_sampling_trains_only_informative_groups_and_logs_its_rounds(straight_run):
    logged = {m["step"]: m for m in metrics(straight_run)}
    groups = defaultdict(list)  # (step, prompt, k-th group of that prompt in the step) -> its completions
    for r in stored(straight_run):
        groups[(r["step"], r["prompt_index"], r["completion_index"] // G)].append(r)
    assert all(len(g) == G for g in groups.values())
    trained = defaultdict(int)
    for (step, prompt, _), group in groups.items():
        rewards = {r["reward"] for r in group}
        advantages = [r["advantage"] for r in group]
        if advantages[0] is None:  # dropped: the whole group is untrained
            assert all(a is None for a in advantages)
        else:
            assert len(rewards) > 1, f"step {step}: prompt {prompt}'s group ties and was trained on"
            assert not ROWS[prompt]["tie"]
            trained[step] += 1
    for step, m in logged.items():
        sampled = sum(1 for key in groups if key[0] == step)
        assert m[SAMPLING_PROMPTS] == sampled == m[SAMPLING_ROUNDS] * PROMPTS_PER_STEP
        assert m[SAMPLING_GROUPS_TRAINED] == trained[step]
        assert 1 <= m[SAMPLING_ROUNDS] <= 4
        # full batch unless the cap stopped the rounds
        assert (trained[step] == PROMPTS_PER_STEP) == (m[SAMPLING_SHORT] == 0.0)
    assert any(m[SAMPLING_ROUNDS] > 1 for m in logged.values()), "no step needed a second round"


@pytest.mark.slow
def test_resume_after_extra_rounds_equals_the_straight_run(straight_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_model_dir, run, max_steps=2)
    train(tiny_model_dir, run, resume_from="latest")
    straight, resumed = metrics(straight_run), metrics(run)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    keys = ("loss", KL, BETA, "grad_norm", "reward", SAMPLING_ROUNDS, SAMPLING_PROMPTS, SAMPLING_GROUPS_TRAINED)
    for a, b in zip(straight, resumed):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-9), (a["step"], key)
    assert straight[2][BETA] != straight[0][BETA]  # the restored beta is a moved one
    assert any(m[SAMPLING_ROUNDS] > 1 for m in straight[2:])  # the resumed part has extra rounds

    def rows(path):
        return [
            (r["step"], r["prompt_index"], r["completion_index"], r["completion"], r["advantage"]) for r in stored(path)
        ]

    assert rows(straight_run) == rows(run)


def test_the_cap_on_rounds_holds_and_a_step_without_informative_groups_makes_no_update(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(
        tiny_model_dir,
        run,
        reward=always_one,
        max_steps=2,
        max_sampling_rounds=3,
        kl_controller="fixed",
        target_kl=None,
    )
    for m in metrics(run):
        assert (m[SAMPLING_ROUNDS], m[SAMPLING_PROMPTS], m[SAMPLING_GROUPS_TRAINED], m[SAMPLING_SHORT]) == (
            3.0,
            3.0 * PROMPTS_PER_STEP,
            0.0,
            1.0,
        )
        assert "loss" not in m and m[BETA] == 0.04
    rollouts = stored(run)
    assert len(rollouts) == 2 * 3 * PROMPTS_PER_STEP * G
    assert all(r["advantage"] is None and r["policy_version"] == 0 for r in rollouts)  # never updated


@pytest.mark.ray
@pytest.mark.slow
def test_dynamic_sampling_with_ray_rollout_workers(tiny_model_dir, tmp_path):
    """Sync Ray sampling: each round goes to the workers (seeds per group numbered on across rounds)."""
    pytest.importorskip("ray", reason="needs the ray extra")
    run = tmp_path / "run"
    train(tiny_model_dir, run, max_steps=2, **RAY_WORKERS)
    logged = metrics(run)
    assert any(m[SAMPLING_ROUNDS] > 1 for m in logged)
    for r in stored(run):
        assert r["advantage"] is None or not ROWS[r["prompt_index"]]["tie"]
    assert sum(m[SAMPLING_PROMPTS] for m in logged) * G == len(stored(run))


def test_cli_refuses_an_adaptive_controller_without_target(tmp_path, capsys):
    from grpokit.cli import main

    (tmp_path / "data.jsonl").write_text('{"prompt": "w1 w2", "tie": true}\n')
    (tmp_path / "c.yaml").write_text(
        f"data: {{train_dataset: {tmp_path / 'data.jsonl'}}}\nrewards: [accuracy]\n"
        f"model: {{model_name_or_path: {tmp_path / 'no-model'}}}\nalgo: {{kl_controller: adaptive}}\n"
    )
    assert main(["train", str(tmp_path / "c.yaml"), f"output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "grpokit: error: kl_controller: adaptive needs target_kl > 0" in err
    assert not (tmp_path / "run").exists()
