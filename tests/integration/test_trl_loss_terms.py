"""TRL's extra loss terms through GRPOTrainer on tiny models: the entropy bonus (static and adaptive, TRL's logged
names and ``trainer.entropy_coef``), a mixture-of-experts router's load-balancing loss (``aux_loss``,
``trainer.aux_loss_enabled``), GDPO's ``multi_objective_aggregation: normalize_then_sum``, and TRL's warning for a
sequence-level ratio under a loss that sums tokens."""

from __future__ import annotations

import functools
import logging

import pytest
import torch
from shared_helpers import PROMPTS, save_tiny_moe, tiny_args

from grpokit import GRPOTrainer
from grpokit.algos.multi_objective import batch_normalized, normalize_then_sum
from grpokit.store import RolloutStore

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def has_target(completions, target, **kw):
    return [float(t in c.split()) for c, t in zip(completions, target)]


def length_reward(completions, **kw):
    return [len(c.split()) / 5.0 for c in completions]


config = functools.partial(
    tiny_args,
    max_completion_length=6,
    learning_rate=1e-2,
    logging_steps=1,
    save_steps=0,
    seed=0,
    beta=0.0,  # TRL's default: the logged policy_loss is then the whole policy term
)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_static_entropy_bonus_is_coef_times_mean_entropy(tmp_path, tiny_model_dir, loss_type):
    """With one micro-batch per step: loss = policy_loss - entropy_coef x entropy, TRL's logged names."""
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(tmp_path / "run", entropy_coef=0.5, loss_type=loss_type),
        train_dataset=PROMPTS,
    )
    assert trainer.entropy_coef == 0.5 and trainer.aux_loss_enabled is False
    trainer.train()
    steps = [h for h in trainer.state.log_history if "policy_loss" in h]
    assert len(steps) == 2
    for h in steps:
        assert h["entropy_coef"] == 0.5
        assert h["policy_loss"] - h["loss"] == pytest.approx(0.5 * h["entropy"], rel=1e-4, abs=1e-6)


def test_entropy_bonus_moves_the_weights_off_a_zero_advantage(tmp_path, tiny_model_dir):
    """A reward that ties every completion gives advantage 0: without the bonus no gradient, with it the entropy's."""

    def tie(completions, **kw):
        return [1.0] * len(completions)

    def trained(**more):
        trainer = GRPOTrainer(
            str(tiny_model_dir), tie, args=config(tmp_path / str(len(more)), max_steps=1, **more), train_dataset=PROMPTS
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        return sum(float((p - before[n]).abs().sum()) for n, p in trainer.model.named_parameters())

    assert trained() == 0.0
    assert trained(entropy_coef=0.1) > 0.0


def test_adaptive_entropy_moves_once_per_optimizer_step(tmp_path, tiny_model_dir):
    """Two micro-batches per optimizer step: the coefficient moves by delta once per optimizer step (TRL's
    test_train_with_adaptive_entropy_gradient_accumulation), up while the entropy is under the target, down above."""
    up = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(
            tmp_path / "up",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=3,
            entropy_coef=0.01,
            use_adaptive_entropy=True,
            entropy_target=100.0,  # above any entropy of a 50-word vocabulary (ln 50 = 3.9)
            entropy_coef_delta=0.005,
        ),
        train_dataset=PROMPTS,
    )
    up.train()
    assert up.entropy_coef == pytest.approx(0.01 + 0.005 * 3)  # 3 optimizer steps, not 6 micro-batches
    assert [h["entropy_coef"] for h in up.state.log_history if "entropy_coef" in h] == pytest.approx(
        [0.015, 0.02, 0.025]
    )
    down = GRPOTrainer(
        str(tiny_model_dir),
        has_target,
        args=config(
            tmp_path / "down",
            max_steps=3,
            entropy_coef=0.01,
            use_adaptive_entropy=True,
            entropy_target=0.0,  # below any entropy: down to entropy_coef_min and held there
            entropy_coef_delta=0.004,
            entropy_coef_min=0.002,
        ),
        train_dataset=PROMPTS,
    )
    down.train()
    assert down.entropy_coef == pytest.approx(0.002)  # 0.01 -> 0.006 -> 0.002 -> 0.002


def _tiny_moe(path, tokenizer, coef):
    return save_tiny_moe(path, tokenizer, router_aux_loss_coef=coef, bos_token_id=tokenizer.bos_token_id)


def test_moe_router_loss_is_logged_and_trains(tmp_path):
    from grpokit.testing import build_word_tokenizer

    tokenizer = build_word_tokenizer([f"w{i}" for i in range(40)])
    folder = _tiny_moe(tmp_path / "moe", tokenizer, coef=0.01)
    trainer = GRPOTrainer(str(folder), has_target, args=config(tmp_path / "run"), train_dataset=PROMPTS)
    assert trainer.aux_loss_enabled is True and trainer.learner.terms.aux_coef == 0.01  # the model config's own
    router = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "mlp.gate" in n}
    assert router
    trainer.train()
    logged = [h["aux_loss"] for h in trainer.state.log_history if "aux_loss" in h]
    # Switch Transformer's loss: num_experts x sum_e f_e P_e, 1 at perfect balance, here between 1 and num_experts
    assert len(logged) == 2 and all(0.5 < v < 4.0 for v in logged)
    assert any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in router.items())
    off = GRPOTrainer(
        str(folder), has_target, args=config(tmp_path / "off", router_aux_loss_coef=0.0), train_dataset=PROMPTS
    )
    assert off.aux_loss_enabled is False


def test_router_loss_coefficient_on_a_dense_model_is_refused(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="not a mixture-of-experts model"):
        GRPOTrainer(
            str(tiny_model_dir),
            has_target,
            args=config(tmp_path / "run", router_aux_loss_coef=0.01),
            train_dataset=PROMPTS,
        )


def test_normalize_then_sum_gives_gdpo_advantages(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        [has_target, length_reward],
        args=config(
            tmp_path / "run", max_steps=1, multi_objective_aggregation="normalize_then_sum", reward_weights=[1.0, 0.5]
        ),
        train_dataset=PROMPTS,
    )
    trainer.train()
    with RolloutStore(tmp_path / "run" / "rollouts.sqlite", readonly=True) as store:
        rows = store.rollouts(step=1)
    per_func = torch.tensor(
        [
            [
                float("nan") if r["rewards"][name] is None else r["rewards"][name]
                for name in ("has_target", "length_reward")
            ]
            for r in rows
        ],
        dtype=torch.float64,
    )
    expected = batch_normalized(normalize_then_sum(per_func, torch.tensor([1.0, 0.5], dtype=torch.float64), 4))
    assert [r["advantage"] for r in rows] == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize(("loss_type", "warned"), [("grpo", False), ("dapo", True), ("cispo", True)])
def test_sequence_level_with_a_token_summed_loss_is_warned_as_trl(tmp_path, tiny_model_dir, caplog, loss_type, warned):
    args = config(tmp_path / "run", importance_sampling_level="sequence", loss_type=loss_type)
    with caplog.at_level(logging.WARNING):
        GRPOTrainer(str(tiny_model_dir), has_target, args=args, train_dataset=PROMPTS)
    assert ("weights each sequence by its completion length" in caplog.text) == warned
