"""Ray rollout workers on a local cluster: CLI end to end, a worker killed mid-step, async one-step-off."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from shared_helpers import RAY_WORKERS, TARGET_REWARD, WORDS, sampling_params, tiny_args, tiny_run_config

from grpokit import GRPOTrainer
from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.testing import TinyGPT, build_word_tokenizer

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = pytest.mark.ray

# A target length in characters varies within every group and is learnable in a few steps.
LENGTH_REWARD = {"name": "length", "target_length": 40, "unit": "chars"}


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    """One local cluster, started by grpokit, for the module (a cluster start costs seconds)."""
    from grpokit.distributed.ray_rollout import connect

    # Workers must unpickle this module's model class, which they cannot import by name.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    connect(None, num_cpus=2)
    yield
    ray.shutdown()


def rollouts_of(run: Path) -> list[dict]:
    with RolloutStore(run / "rollouts.sqlite", readonly=True) as store:
        return store.rollouts()


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_each_rollout_once(rows: list[dict], steps: int, per_step: int) -> None:
    keys = [(r["step"], r["prompt_index"], r["completion_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == steps * per_step
    assert sorted({r["step"] for r in rows}) == list(range(1, steps + 1))


@pytest.mark.slow
def test_cli_with_two_rollout_workers_raises_the_reward(tmp_path, tiny_model_dir, word_prompts):
    path = tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=16,
        prompts_per_step=4,
        rewards=[LENGTH_REWARD],
        prompts=word_prompts,
        algo={"beta": 0.0},
        generation={"max_completion_length": 8},
        optim={"learning_rate": 1e-2, "lr_scheduler_type": "constant"},
        run={"save_steps": 0},
        distributed=RAY_WORKERS,
    )
    assert main(["train", str(path)]) == 0

    metrics = read_metrics(tmp_path / "run")
    rewards = [m["reward"] for m in metrics]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.1, rewards
    rows = rollouts_of(tmp_path / "run")
    assert_each_rollout_once(rows, 16, 16)
    # synchronous mode: step k is sampled by the weights after k-1 updates, published to the workers
    assert all(r["policy_version"] == r["step"] - 1 for r in rows)
    assert all(m["policy_staleness"] == 0 for m in metrics)


class DiesOnce(TinyGPT):
    """Kills the Ray worker process that runs it (never the learner) once ``flag`` exists; only the
    process that manages to delete the flag dies, so exactly one worker is lost."""

    def __init__(self, vocab_size: int, flag: str):
        super().__init__(vocab_size, d_model=32, n_layers=1, n_heads=2)
        self.flag, self.learner_pid = flag, os.getpid()

    def forward(self, input_ids):
        if os.getpid() != self.learner_pid and os.path.exists(self.flag):
            try:
                os.unlink(self.flag)
            except FileNotFoundError:
                pass
            else:
                os._exit(1)
        return super().forward(input_ids)


def custom_run(tmp_path: Path, **overrides):
    tokenizer = build_word_tokenizer(WORDS)
    flag = tmp_path / "kill-a-worker"
    torch.manual_seed(0)
    model = DiesOnce(len(tokenizer), str(flag))
    prompts = [{"prompt": " ".join(WORDS[i : i + 3])} for i in range(12)]

    def reward(prompts, completions, **columns):
        return [float(len(c)) / 20 for c in completions]

    settings = dict(max_steps=3, max_completion_length=5, learning_rate=1e-3, beta=0.0, save_steps=0)
    args = tiny_args(tmp_path / "run", **(settings | RAY_WORKERS | overrides))
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=prompts, tokenizer=tokenizer), flag


def test_a_killed_rollout_worker_is_replaced_and_its_prompts_requeued(tmp_path):
    trainer, flag = custom_run(tmp_path)
    score_values = trainer.rewards.score_values
    armed = []

    def score_then_arm(*args, **kwargs):
        if trainer.step == 1:
            armed.append(True)
            flag.touch()  # step 2's sampling will kill one worker in the middle of its chunk
        return score_values(*args, **kwargs)

    trainer.rewards.score_values = score_then_arm
    trainer.train()
    metrics = read_metrics(tmp_path / "run")
    assert armed and not flag.exists()  # the flag was set, and a worker ran into it and died
    assert [m["rollout_worker_restarts"] for m in metrics] == [0, 1, 1]
    assert_each_rollout_once(rollouts_of(tmp_path / "run"), 3, 8)


def test_async_rollouts_are_one_step_stale_and_train(tmp_path):
    trainer, _ = custom_run(tmp_path, async_rollouts=True)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    rows = rollouts_of(tmp_path / "run")
    assert_each_rollout_once(rows, 3, 8)
    # step 1 is sampled by version 0 and step k > 1 while step k-1 trains, i.e. by version k-2
    assert {r["step"]: r["policy_version"] for r in rows} == {1: 0, 2: 0, 3: 1}
    assert [m["policy_staleness"] for m in read_metrics(tmp_path / "run")] == [0, 1, 1]
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters()))


def test_ray_workers_sample_two_steps_ahead_with_max_staleness_2(tmp_path):
    trainer, _ = custom_run(tmp_path, max_staleness=2, max_steps=4, off_policy_correction="decoupled_ppo")
    trainer.train()
    rows = rollouts_of(tmp_path / "run")
    assert_each_rollout_once(rows, 4, 8)
    # steps 1-3 are admitted at once (version 0), step 4 before step 2 trains (version 1)
    assert {r["step"]: r["policy_version"] for r in rows} == {1: 0, 2: 0, 3: 0, 4: 1}
    metrics = read_metrics(tmp_path / "run")
    assert [m["policy_staleness"] for m in metrics] == [0, 1, 2, 2]
    assert all(m["sampling_is/weight_mean"] > 0 for m in metrics)


def test_ppo_trains_its_critic_on_rollouts_from_ray_workers(tmp_path, tiny_model_dir, word_prompts):
    ppo = dict(algorithm="ppo", num_generations=2, beta=0.04, kl_in_reward=True, save_steps=0)
    args = tiny_args(tmp_path / "run", **ppo, **(RAY_WORKERS | dict(num_rollout_workers=1)))
    trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=word_prompts)
    head = trainer.learner.critic.model.head.weight.detach().clone()
    trainer.train()
    steps = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["value_loss"] >= 0 and "explained_variance" in m for m in steps)
    assert not torch.equal(trainer.learner.critic.model.head.weight, head)  # the critic learned from the workers'


def test_partial_rollouts_over_two_workers_equal_one_worker():
    """Partial rollouts (grpokit/rollout/partial.py) cut a batch's groups into one chunk per worker; each chunk's
    first S tokens (version 0) and its continuation (version 1, launched when version 1 is published) run on that
    chunk's worker. What a chunk samples is a function of its groups' seeds and the two versions alone, so two workers
    return, row for row, the tokens, behaviour log-probs and per-token versions of one."""
    from grpokit.distributed.ray_rollout import RayRolloutEngine

    tokenizer = build_word_tokenizer(WORDS)
    torch.manual_seed(0)
    model = TinyGPT(len(tokenizer), d_model=32, n_layers=1, n_heads=2)
    v0 = {name: p.detach().clone() for name, p in model.named_parameters()}
    v1 = {name: p + 0.5 * torch.randn_like(p) for name, p in v0.items()}  # far enough to sample other tokens
    prompts = [tokenizer(" ".join(WORDS[i : i + 3]))["input_ids"] for i in range(4)]
    S, params = 2, sampling_params(6)

    def sample(workers: int):
        engine = RayRolloutEngine(
            model, [tokenizer.eos_token_id], tokenizer.pad_token_id, workers, worker_cpus=0.5, partial=(S, 120.0)
        )
        engine.publish(v0, 0)
        pending = engine.submit(prompts, [11, 12, 13, 14], 3, params, step=2)  # step 2, admitted with 0: w = 1
        assert pending.switch == 1 and len(pending.chunks) == workers
        engine.publish(v1, 1)  # launches the continuations
        rollouts = engine.collect(pending)
        for worker in engine.workers:
            ray.kill(worker)
        return rollouts

    one, two = sample(1), sample(2)
    lengths = one.completion_lengths.tolist()
    assert two.completion_lengths.tolist() == lengths
    assert max(lengths) > S  # some completions went on past the switch, on version 1
    for row, n in enumerate(lengths):
        assert torch.equal(one.completion_ids[row, :n], two.completion_ids[row, :n])
        assert torch.allclose(one.logprobs[row, :n], two.logprobs[row, :n], atol=1e-6)
        expected = [0] * min(n, S) + [1] * max(0, n - S)  # the first S tokens by version 0, the rest by 1
        assert one.token_versions[row, :n].tolist() == two.token_versions[row, :n].tolist() == expected
    assert one.policy_version == two.policy_version == 0


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_learnability_with_two_rollout_workers_draws_by_the_stored_history(tmp_path, tiny_model_dir, staleness):
    """`curriculum: learnability` with Ray rollout workers (sync, and one step ahead): the driver draws each batch
    from the history stored so far, the workers sample it, and the history table sums the stored rollouts."""
    from test_curriculum_runs import PRIOR, drawn_in_order, history_counts, replayed_draws

    rewards = tmp_path / "half.py"  # half of each group passes: a prompt drawn before weighs 0.25, a new one 0.0475
    rewards.write_text(
        "def half(completions, **columns):\n    return [float(i % 2) for i in range(len(completions))]\n"
    )
    path = tiny_run_config(
        tmp_path,
        tiny_model_dir,
        max_steps=3,
        prompts_per_step=4,
        rewards=[f"{rewards}:half"],
        data={"curriculum": "learnability", "history_window": 8, "learnability_prior": PRIOR},
        run={"save_steps": 0},
        distributed={**RAY_WORKERS, "max_staleness": staleness},
    )
    assert main(["train", str(path)]) == 0

    run = tmp_path / "run"
    drawn = drawn_in_order(run)
    assert [len(batch) for batch in drawn] == [4, 4, 4]
    kept, counted = history_counts(run)
    assert kept == counted and sum(row[2] for row in kept) == 3 * 4 * 4
    # each batch is what the curriculum draws from the history stored before it: of the steps before it (sync), or
    # before the one before it (one step ahead: steps 1 and 2 are drawn before anything is stored, step 3 after
    # step 1 stored its 4 prompts, as each step's metrics say of the latest draw)
    assert drawn == replayed_draws(run, tmp_path, 3, 4, ahead=staleness)
    unseen = [m["curriculum/unseen_prompts"] for m in read_metrics(run)]
    assert unseen == ([20.0, 16.0, 20.0 - len(set(drawn[0] + drawn[1]))] if staleness == 0 else [20.0, 16.0, 16.0])
