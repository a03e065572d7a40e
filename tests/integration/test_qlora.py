"""QLoRA on CPU (bitsandbytes >= 0.48): LoRA adapters on a frozen 4-bit NF4 base learn, the reference is the
4-bit base, checkpoints and the final adapter hold the adapters only and reload to the same log-probs,
and 2 + resume + 2 steps equal 4 straight steps."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shared_helpers import WORDS, tiny_args, word_prompts

from grpokit import GRPOTrainer
from grpokit.models.loading import load_model
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread

PROMPTS = word_prompts(target=None)
LOW = {f"w{i}" for i in range(10)}
# the head is untied (bitsandbytes leaves the LM head unquantised): its adapter is what learns fast on a random model
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj", "lm_head"]}
CPU = torch.device("cpu")


def low_words(prompts, completions, **columns):
    """The fraction of a completion's words among w0-w9: about 1/4 for the random policy."""
    return [sum(w in LOW for w in c.split()) / max(1, len(c.split())) for c in completions]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer Llama, hidden 64 (bitsandbytes quantises in blocks of 64 values), untied head."""
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama-64")
    build_tiny_causal_lm(
        path, build_word_tokenizer(WORDS), hidden_size=64, num_layers=2, num_heads=2, tie_word_embeddings=False
    )
    return path


qlora_args = functools.partial(
    tiny_args,
    lora=LORA,
    load_in_4bit=True,
    num_generations=8,
    max_completion_length=6,
    beta=0.0,
    learning_rate=5e-2,
    lr_scheduler_type="constant",
    max_steps=8,
    save_steps=0,
    seed=0,
)


def metrics(run: Path) -> list[dict]:
    return [m for line in (run / "metrics.jsonl").read_text().splitlines() if "loss" in (m := json.loads(line))]


def logprobs_of(model, rollouts, pad_id: int) -> torch.Tensor:
    model.eval()
    return batched_logprobs(model, build_batch(model, rollouts, pad_id, CPU), 1.0, 16)


@pytest.fixture(scope="module")
def trained(model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("qlora") / "run"
    args = qlora_args(run, beta=0.05, save_steps=4)
    trainer = GRPOTrainer(str(model_dir), low_words, args=args, train_dataset=PROMPTS)
    trainer.train()
    return trainer, run


def test_qlora_learns_on_a_4bit_base_on_cpu(trained):
    from bitsandbytes.nn import Linear4bit

    trainer, run = trained
    base = trainer.model.get_base_model()
    quantised = [n for n, m in base.named_modules() if isinstance(m, Linear4bit)]
    assert len(quantised) == 2 * 7  # every Linear of both layers; the head stays float32
    assert type(base.lm_head.base_layer) is torch.nn.Linear and base.lm_head.base_layer.weight.dtype == torch.float32
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    rewards = [m["reward"] for m in metrics(run)]
    assert len(rewards) == 8
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.3, rewards  # the random policy is at ~0.25
    # adapters on 4-bit layers get gradients too (B starts at zero), also after sampling ran those layers in eval mode
    for name in ("layers.0.self_attn.q_proj", "layers.1.mlp.down_proj"):
        lora_b = dict(trainer.model.named_parameters())[f"base_model.model.model.{name}.lora_B.default.weight"]
        assert lora_b.abs().max() > 0, name


def test_qlora_checkpoints_hold_the_adapters_and_reload_with_peft(trained, model_dir):
    from peft import PeftModel

    trainer, run = trained
    saved = load_file(run / "checkpoints" / "step-8" / "model.safetensors")
    assert saved and all("lora_" in name for name in saved)  # no 4-bit base weights, no quantisation constants
    trainable = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert saved.keys() == trainable.keys()

    pad = trainer.tokenizer.pad_token_id
    rollouts = trainer.engine.generate([trainer.train_source.ids[i] for i in range(4)], 4, trainer.sampling)
    policy = logprobs_of(trainer.model, rollouts, pad)
    base = load_model(str(model_dir), torch.float32, CPU, load_in_4bit=True)
    reloaded = PeftModel.from_pretrained(base, run / "final")
    torch.testing.assert_close(logprobs_of(reloaded, rollouts, pad), policy, rtol=0, atol=1e-6)
    # the sampler's log-probs (HF forward through the 4-bit layers) are the learner's
    torch.testing.assert_close(rollouts.logprobs, policy * rollouts.completion_mask, rtol=0, atol=1e-4)


def test_qlora_reference_is_the_4bit_base(trained, model_dir):
    trainer, _ = trained
    rollouts = trainer.engine.generate([trainer.train_source.ids[i] for i in range(4)], 4, trainer.sampling)
    batch = build_batch(trainer.model, rollouts, trainer.tokenizer.pad_token_id, CPU)
    reference = trainer.learner.reference_logprobs(batch)
    base = load_model(str(model_dir), torch.float32, CPU, load_in_4bit=True)
    pad = trainer.tokenizer.pad_token_id
    torch.testing.assert_close(reference, logprobs_of(base, rollouts, pad), rtol=0, atol=1e-6)
    assert (logprobs_of(trainer.model, rollouts, pad) - reference).abs().max() > 1e-2


def test_qlora_resume_equals_a_straight_run(model_dir, tmp_path):
    compared = (
        "loss",
        "policy_loss",
        "kl",
        "grad_norm",
        "entropy",
        "reward",
        "learning_rate",
        "completion_logprob_mean",
    )
    settings = dict(
        max_steps=4,
        beta=0.1,
        algo={"num_iterations": 2},  # grpokit's form: max_steps counts generation batches
        save_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
    )
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    def train(run: Path, **overrides):
        args = qlora_args(run, **(settings | overrides))
        GRPOTrainer(str(model_dir), low_words, args=args, train_dataset=PROMPTS).train()

    train(straight)
    train(resumed, max_steps=2)
    train(resumed, resume_from="latest")
    a, b = metrics(straight), metrics(resumed)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in compared:
            assert x[key] == pytest.approx(y[key], abs=1e-6), (x["step"], key)
    wa, wb = (load_file(r / "final" / "adapter_model.safetensors") for r in (straight, resumed))
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)
