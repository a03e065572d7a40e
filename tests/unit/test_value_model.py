"""The critic (learning/value_model.py): values aligned with the completion log-probs, gradients, LoRA, loading."""

from __future__ import annotations

import pytest
import torch

from grpokit.algos.gae import ppo_advantages
from grpokit.algos.value import value_loss
from grpokit.machine.hardware import autocast
from grpokit.models.loading import load_model
from grpokit.rollout.types import Rollouts
from grpokit.testing import TinyGPT, build_tiny_causal_lm
from grpokit.train.learning.policy_logprobs import build_batch, shares_prefix
from grpokit.train.learning.value_model import ValueModel

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]  # ragged: left padding in the batch
G, T = 2, 5
LENGTHS = [5, 2, 3, 1, 4, 5]  # ragged completions: right padding


def rollouts() -> Rollouts:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 40, (len(PROMPTS) * G, T), generator=generator)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
    ids = torch.where(mask.bool(), ids, 0)
    return Rollouts(PROMPTS, ids, mask, torch.zeros(ids.shape), ["length"] * len(LENGTHS), G)


def expected_values(critic: ValueModel, rows: Rollouts) -> torch.Tensor:
    """Each row alone, unpadded: V_t = head(hidden at the position whose logits predict completion token t)."""
    expected = torch.zeros(rows.completion_ids.shape)
    with torch.no_grad():
        for i, length in enumerate(LENGTHS):
            prompt = PROMPTS[i // G]
            ids = torch.tensor([prompt + rows.completion_ids[i, :length].tolist()])
            hidden = critic.trunk(input_ids=ids).last_hidden_state  # [1, P + length, H]
            positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + length)
            expected[i, :length] = critic.head(hidden[0, positions]).squeeze(-1)
    return expected


@pytest.fixture()
def critic(tiny_model_dir):
    torch.manual_seed(0)  # the new head's init
    return ValueModel.from_pretrained(str(tiny_model_dir))


def test_values_align_with_completion_logprob_positions(critic):
    rows = rollouts()
    batch = build_batch(critic.trunk, rows, 0, CPU)  # the policy's batch: the same HF layout
    with torch.no_grad():
        values = critic(batch)
    assert values.shape == (len(LENGTHS), T) and values.dtype == torch.float32
    assert torch.equal(values == 0, rows.completion_mask == 0)  # 0 exactly at padding (and nowhere else here)
    torch.testing.assert_close(values, expected_values(critic, rows), atol=1e-5, rtol=1e-5)
    # micro-batches of rows give the same values (the shared prompt cache is per micro-batch)
    halves = torch.cat([critic(batch.rows(slice(0, 3))), critic(batch.rows(slice(3, 6)))]).detach()
    torch.testing.assert_close(halves, values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_values_align_on_other_architectures(arch, tmp_path):
    # Qwen2's token classifier has a `score` head like Llama's; GPT-2's is called `classifier`
    build_tiny_causal_lm(tmp_path, arch=arch, hidden_size=32, num_layers=2, num_heads=2)
    torch.manual_seed(0)
    critic = ValueModel.from_pretrained(str(tmp_path))
    rows = rollouts()
    with torch.no_grad():
        values = critic(build_batch(critic.trunk, rows, 0, CPU))
    torch.testing.assert_close(values, expected_values(critic, rows), atol=1e-5, rtol=1e-5)


def test_values_on_the_full_forward_path(critic):
    # activation checkpointing turns the shared KV cache off: [left-padded prompt | completion] in one forward
    rows = rollouts()
    critic.trunk.activation_checkpointing_enable()
    assert not shares_prefix(critic.trunk)
    values = critic(build_batch(critic.trunk, rows, 0, CPU))
    critic.trunk.activation_checkpointing_disable()
    torch.testing.assert_close(values.detach(), expected_values(critic, rows), atol=1e-5, rtol=1e-5)


def test_gradients_reach_head_and_trunk(critic):
    batch = build_batch(critic.trunk, rollouts(), 0, CPU)
    critic(batch).pow(2).sum().backward()
    assert critic.head.weight.grad is not None and critic.head.weight.grad.abs().sum() > 0
    assert critic.head.bias.grad.abs().sum() > 0
    layer = critic.trunk.layers[0].self_attn.q_proj.weight
    assert layer.grad is not None and layer.grad.abs().sum() > 0


def test_lora_trains_adapters_and_head_only(critic):
    peft = pytest.importorskip("peft", reason="LoRA needs peft: pip install 'grpokit[lora]'")
    batch = build_batch(critic.trunk, rollouts(), 0, CPU)
    with torch.no_grad():
        before = critic(batch)
    critic.add_lora(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        torch.testing.assert_close(critic(batch), before)  # LoRA B starts at 0: same function
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable)
    assert any(name.startswith("head.") for name in trainable)
    critic(batch).pow(2).sum().backward()
    lora_b = [p for name, p in critic.named_parameters() if "lora_B" in name]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    assert critic.head.weight.grad.abs().sum() > 0
    frozen = [p for name, p in critic.named_parameters() if "base_layer" in name]
    assert frozen and all(p.grad is None for p in frozen)


def test_from_policy_copies_the_trunk(tiny_model_dir):
    policy = load_model(str(tiny_model_dir), torch.float32, CPU)
    critic = ValueModel.from_policy(policy)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            critic.trunk(input_ids=ids).last_hidden_state, policy.model(input_ids=ids).last_hidden_state
        )
    assert critic.trunk is not policy.model
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(critic.trunk.parameters(), policy.model.parameters()))
    assert critic.head.bias.abs().sum() == 0 and 0 < critic.head.weight.std() < 0.1


def test_from_policy_merges_lora_adapters(tiny_model_dir):
    peft = pytest.importorskip("peft", reason="LoRA needs peft: pip install 'grpokit[lora]'")
    policy = peft.get_peft_model(
        load_model(str(tiny_model_dir), torch.float32, CPU), peft.LoraConfig(r=4, target_modules=["q_proj"])
    )
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_()  # adapters that change the function
    critic = ValueModel.from_policy(policy)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = policy.get_base_model().model(input_ids=ids).last_hidden_state  # adapters on
        torch.testing.assert_close(critic.trunk(input_ids=ids).last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    assert not any("lora_" in name for name, _ in critic.named_parameters())
    assert any("lora_" in name for name, _ in policy.named_parameters())  # the policy keeps its adapters


def test_from_pretrained_keeps_a_trained_value_head(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    saved = AutoModelForTokenClassification.from_config(config)
    with torch.no_grad():
        saved.score.weight.fill_(0.5)
    saved.save_pretrained(tmp_path)
    critic = ValueModel.from_pretrained(str(tmp_path))
    assert torch.equal(critic.head.weight, torch.full((1, config.hidden_size), 0.5))


def test_bad_inputs_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ValueModel.from_pretrained(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="cannot load the value model"):
        ValueModel.from_pretrained(str(tmp_path))  # a folder without config.json
    custom = TinyGPT(40, d_model=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="Hugging Face model"):
        ValueModel(custom, torch.nn.Linear(16, 1))
    critic = ValueModel.from_pretrained(str(tiny_model_dir))
    with pytest.raises(ValueError, match="Linear"):
        ValueModel(critic.trunk, torch.nn.Linear(32, 2))
    custom_batch = build_batch(custom, rollouts(), 0, CPU)
    with pytest.raises(ValueError, match="batch layout"):
        critic(custom_batch)


@pytest.mark.parametrize("compute", [None, torch.bfloat16])  # either outcome of mixed_precision auto on a CPU
def test_critic_learns_the_returns_of_a_batch(critic, compute):
    # the pieces together on one batch: old values -> ppo_advantages' returns -> value_loss steps; the critic's
    # values move to the returns (explained variance from about 0 to 0.75 here, not 1: the first tokens of a
    # prompt's two completions share one state, the prompt, but have different returns)
    rows = rollouts()
    batch = build_batch(critic.trunk, rows, 0, CPU)
    mask = rows.completion_mask
    with torch.no_grad():
        old_values = critic(batch)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    _, returns, _ = ppo_advantages(rewards, old_values, mask, gamma=0.9, lam=0.95)
    optimizer = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=1e-2)
    first = None
    for _ in range(50):
        with autocast(CPU, compute):  # float32 weights and Adam state; matmuls in ``compute``
            values = critic(batch)
        loss, metrics = value_loss(values, old_values, returns, mask, cliprange_value=10.0, vf_coef=0.5)
        first = metrics if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    _, last = value_loss(critic(batch), old_values, returns, mask, cliprange_value=10.0)
    assert first["explained_variance"] < 0.2
    assert last["explained_variance"] > 0.6 and last["value_loss"] < 0.2 * first["value_loss"]
