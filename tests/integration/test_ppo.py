"""PPO (``algo.algorithm: ppo``) end to end on a tiny model: the CLI trains with a critic, one sample per
prompt works, the critic learns and is checkpointed, and a resumed run equals an uninterrupted one."""

from __future__ import annotations

import functools
import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import PROMPTS, TARGET_REWARD, tiny_args, tiny_run_config

from grpokit import GRPOTrainer
from grpokit.algos.kl_control import adaptive_kl_coef
from grpokit.cli import main
from grpokit.train.rundir.checkpoint import list_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")

# logged by every PPO step, besides the GRPO family's
PPO_METRICS = ("value_loss", "value_clip_frac", "explained_variance", "critic/grad_norm", "time/critic")
# per-step numbers that must agree between a straight PPO run and a resumed one
COMPARED = ("loss", "policy_loss", "kl", "grad_norm", "reward", "value_loss", "value_clip_frac", "explained_variance")


config = functools.partial(
    tiny_args,
    algorithm="ppo",
    num_generations=2,
    num_mini_batches=2,
    num_ppo_epochs=2,
    max_steps=4,
    learning_rate=5e-3,
    lr_scheduler_type="constant",  # the same learning rates in a run cut in two (resume)
    beta=0.04,
    kl_in_reward=True,
    vf_coef=0.5,
    save_steps=1,
)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_trains_ppo_with_one_sample_per_prompt(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    config = tiny_run_config(
        tmp_path, tiny_model_dir, max_steps=3, num_generations=1, prompts_per_step=4, optim={"learning_rate": 5e-3}
    )
    assert main(["train", str(config), "algo.algorithm=ppo"]) == 0
    steps = [m for m in metrics(run) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        for key in (*PPO_METRICS, "kl"):
            assert key in m and math.isfinite(m[key]), key
        assert m["nonfinite"] == 0.0
    # kl_in_reward is off by default: beta's k3 term is in the loss, as in GRPO (0 at step 1: policy = reference)
    assert steps[-1]["kl_penalty"] > 0
    assert "critic.safetensors" in {p.name for p in (run / "checkpoints" / "step-3").iterdir()}


def test_critic_and_policy_learn_and_the_kl_goes_into_the_reward(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=config(tmp_path / "run"), train_dataset=PROMPTS)
    critic = trainer.learner.critic.model
    before = {name: p.detach().clone() for name, p in critic.named_parameters()}
    policy_before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [name for name, p in critic.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "head.weight" in changed and any(name.startswith("trunk.") for name in changed)
    assert any(not torch.equal(p.detach(), policy_before[n]) for n, p in trainer.model.named_parameters())
    steps = [m for m in metrics(tmp_path / "run") if "loss" in m]
    assert len(steps) == 4
    for m in steps:
        # k1 of the sampling policy against the reference, in the reward; the loss has no KL term
        assert math.isfinite(m["kl"]) and "kl_penalty" not in m
        assert m["loss"] == pytest.approx(m["policy_loss"], rel=1e-6)
        assert all(math.isfinite(m[key]) for key in (*PPO_METRICS, "loss"))
    # the saved critic is the trained one
    saved = load_file(tmp_path / "run" / "checkpoints" / "step-4" / "critic.safetensors")
    for name, p in critic.state_dict().items():
        torch.testing.assert_close(saved[name], p)


def test_adaptive_kl_controller_moves_the_beta_of_the_kl_in_the_reward(tmp_path, tiny_model_dir):
    args = config(tmp_path / "run", max_steps=3, kl_controller="adaptive", target_kl=1e-3, kl_horizon=10)
    GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS).train()
    steps = [m for m in metrics(tmp_path / "run") if "loss" in m]
    n = args.completions_per_step(1)
    assert steps[0]["beta"] == 0.04
    for before, after in itertools.pairwise(steps):
        # beta_{t+1} = beta_t * (1 + clip(kl_t / target - 1, -0.2, 0.2) * n / horizon), kl_t the reward's k1
        expected = adaptive_kl_coef(before["beta"], before["kl"], 1e-3, 10, n)
        assert after["beta"] == pytest.approx(expected, rel=1e-12)
        assert after["beta"] != before["beta"]
    for m in steps:  # the KL is in the rewards only: the loss has no KL term at any beta
        assert m["loss"] == pytest.approx(m["policy_loss"], rel=1e-6) and "kl_penalty" not in m


def test_critic_trains_lora_adapters_with_a_lora_policy(tmp_path, tiny_model_dir):
    args = config(tmp_path / "run", max_steps=2, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS)
    critic = trainer.learner.critic.model
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable)
    trainer.train()
    saved = load_file(list_checkpoints(tmp_path / "run")[-1] / "critic.safetensors")
    assert set(saved) == trainable  # the adapters and the head only


def test_value_model_from_its_own_path(tmp_path, tiny_model_dir):
    args = config(tmp_path / "run", max_steps=1, value_model_name_or_path=str(tiny_model_dir), critic_learning_rate=0.0)
    trainer = GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args, train_dataset=PROMPTS)
    before = {name: p.detach().clone() for name, p in trainer.learner.critic.model.named_parameters()}
    trainer.train()
    # critic_learning_rate 0: AdamW moves nothing (weight decay is 0 by default), the policy still learns
    for name, p in trainer.learner.critic.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    assert trainer.learner.critic.optimizer.param_groups[0]["lr"] == 0.0


def test_ppo_needs_a_hugging_face_model(tmp_path):
    from grpokit.config import ConfigError
    from grpokit.testing import TinyGPT, build_word_tokenizer

    tokenizer = build_word_tokenizer([f"w{i}" for i in range(40)])
    with pytest.raises(ConfigError, match=r"algorithm: ppo.*needs a Hugging Face model"):
        GRPOTrainer(
            TinyGPT(len(tokenizer)),
            TARGET_REWARD,
            args=config(tmp_path / "run", max_steps=1),
            train_dataset=PROMPTS,
            processing_class=tokenizer,
        )


@pytest.mark.slow
def test_ppo_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir):
    straight = tmp_path / "straight"
    GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=config(straight), train_dataset=PROMPTS).train()
    run = tmp_path / "resumed"
    args = config(run)
    GRPOTrainer(str(tiny_model_dir), TARGET_REWARD, args=args.replace(max_steps=2), train_dataset=PROMPTS).train()
    GRPOTrainer(
        str(tiny_model_dir), TARGET_REWARD, args=args.replace(resume_from="latest"), train_dataset=PROMPTS
    ).train()
    ma, mb = [m for m in metrics(straight) if "loss" in m], [m for m in metrics(run) if "loss" in m]
    assert [m["step"] for m in ma] == [m["step"] for m in mb] == [1, 2, 3, 4]
    for x, y in zip(ma, mb):
        for key in COMPARED:
            if key in x:
                assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    for name in ("model.safetensors", "critic.safetensors"):
        wa = load_file(straight / "checkpoints" / "step-4" / name)
        wb = load_file(run / "checkpoints" / "step-4" / name)
        assert wa.keys() == wb.keys()
        for key in wa:
            torch.testing.assert_close(wa[key], wb[key], atol=1e-6, rtol=0)
