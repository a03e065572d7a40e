"""Custom models: a plain ``torch.nn.Module`` with ``forward(input_ids) -> logits`` and a plain Python
tokenizer (encode / decode / eos_token_id / pad_token_id), trained end to end without changes."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model
from shared_helpers import sampling_params, tiny_args

from grpokit import GRPOTrainer
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

# The nanoGPT-style module of the molecules example: plain PyTorch, forward(input_ids) -> logits.
_spec = importlib.util.spec_from_file_location(
    "example_chargpt", Path(__file__).parents[2] / "examples" / "molecules" / "chargpt.py"
)
chargpt = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # registered: its dataclasses look it up
_spec.loader.exec_module(chargpt)


def nano_gpt(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return chargpt.CharGPT(chargpt.GPTConfig(vocab_size, block_size=32, d_model=32, n_layers=2, n_heads=2))


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


class CharTokenizer:
    """The least a tokenizer needs to be: no transformers, no save_pretrained."""

    def __init__(self, chars: str, with_pad: bool = True):
        self.vocab = ["<eos>"] + (["<pad>"] if with_pad else []) + list(chars)
        self.eos_token_id = 0
        if with_pad:
            self.pad_token_id = 1

    def encode(self, text: str) -> list[int]:
        return [self.vocab.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:  # no skip_special_tokens keyword
        return "".join(self.vocab[i] for i in ids if self.vocab[i] not in ("<eos>", "<pad>"))


class TupleOutput(torch.nn.Module):
    """A model whose forward returns (logits, something else), as many research codebases do."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        return self.inner(input_ids), None


def a_fraction(prompts, completions, **columns):
    return [c.count("a") / max(1, len(c)) for c in completions]


# 8 completions of each of 2 prompts a step, 4 steps at a constant learning rate, the reference synced every 2
args_for = functools.partial(
    tiny_args,
    num_generations=8,
    max_completion_length=8,
    beta=0.04,
    learning_rate=1e-2,
    lr_scheduler_type="constant",
    max_steps=4,
    seed=0,
    ref_model_sync_steps=2,
    save_steps=0,
)


def first_token_prob(model, tokenizer, prompt: str, char: str) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode(prompt)]))[0, -1]
    return float(torch.softmax(logits, -1)[tokenizer.vocab.index(char)])


@pytest.mark.parametrize("compute", ["float32", "bf16"])
def test_nanogpt_module_and_plain_tokenizer_train_end_to_end(tmp_path, monkeypatch, compute):
    # with either outcome of mixed_precision auto's choice (GRPOKIT_CPU_PRECISION forces it, at any model size)
    monkeypatch.setenv("GRPOKIT_CPU_PRECISION", compute)
    tokenizer = CharTokenizer("abcxyz>")
    model = nano_gpt(len(tokenizer.vocab))
    rows = [{"prompt": p} for p in ("x>", "yz>", "abc>", "zzz>")]
    before = first_token_prob(model, tokenizer, "x>", "a")
    trainer = GRPOTrainer(
        model=model, tokenizer=tokenizer, reward_funcs=a_fraction, args=args_for(tmp_path / "run"), train_dataset=rows
    )
    assert trainer.reference.model is not None and trainer.reference.model is not trainer.model  # a frozen copy
    reference_before = [p.clone() for p in trainer.reference.model.parameters()]
    assert trainer.learner.autocast_dtype == {"float32": None, "bf16": torch.bfloat16}[compute]
    trainer.train()
    metrics = next(h for h in reversed(trainer.state.log_history) if "grad_norm" in h)  # the last step's

    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss", "grad_norm", "kl"))
    # the reward asks for "a": four steps at a high learning rate make it likelier as the first completion token
    assert first_token_prob(trainer.model, tokenizer, "x>", "a") > before
    # the reference was resynced (steps 2 and 4) towards the policy
    assert any(not torch.equal(a, b) for a, b in zip(reference_before, trainer.reference.model.parameters()))

    run = tmp_path / "run"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4
    reloaded = nano_gpt(len(tokenizer.vocab), seed=1)
    load_model(reloaded, str(run / "final" / "model.safetensors"))
    for a, b in zip(reloaded.state_dict().values(), trainer.model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_plain_tokenizer_without_pad_uses_eos(tmp_path):
    tokenizer = CharTokenizer("ab>", with_pad=False)
    trainer = GRPOTrainer(
        model=nano_gpt(len(tokenizer.vocab)),
        tokenizer=tokenizer,
        reward_funcs=a_fraction,
        args=args_for(tmp_path / "run", max_steps=1, per_device_train_batch_size=8, ref_model_sync_steps=0),
        train_dataset=[{"prompt": "ab>"}],
    )
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 0
    trainer.train()


@pytest.mark.parametrize("wrap", [False, True], ids=["tensor", "tuple"])
def test_logprobs_come_from_the_modules_own_logits(wrap):
    # Prompts of different lengths in one batch: the custom layout right-pads them, which must not
    # change any log-prob under a causal model. Sampling log-probs must equal the learner's (ratio 1).
    model = nano_gpt(12).eval()
    if wrap:
        model = TupleOutput(model)
    engine = HFRolloutEngine(model, eos_token_ids=[0], pad_token_id=1, device=torch.device("cpu"), seed=0)
    prompts = [[5, 6, 7, 8, 9], [3, 4]]
    params = sampling_params(max_completion_length=6, temperature=0.7)
    rollouts = engine.generate(prompts, 3, params)
    batch = build_batch(model, rollouts, 1, torch.device("cpu"))
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, batch, temperature=0.7)
    mask = rollouts.completion_mask.bool()
    torch.testing.assert_close(logprobs[mask], rollouts.logprobs[mask], atol=1e-5, rtol=1e-5)

    # the same numbers by hand: one unpadded forward per row, log_softmax(logits / T) at each completion token
    for n in range(len(rollouts.completion_ids)):
        prompt = prompts[n // 3]
        length = int(rollouts.completion_lengths[n])
        completion = rollouts.completion_ids[n, :length].tolist()
        with torch.no_grad():
            out = model(torch.tensor([prompt + completion]))
        logits = (out[0] if wrap else out)[0]  # [P+L, V]
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1] / 0.7, -1).gather(
            -1, torch.tensor(completion)[:, None]
        )[:, 0]
        torch.testing.assert_close(logprobs[n, :length], expected, atol=1e-5, rtol=1e-5)
