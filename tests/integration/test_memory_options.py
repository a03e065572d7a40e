"""The options that trade numbers for memory, end to end on tiny models: bitsandbytes' 8-bit AdamW (``optimizer:
adamw_8bit``, TRL's ``optim``) trains, checkpoints its 8-bit state and resumes exactly; the reference stored in bf16
(``ref_model_dtype: bfloat16``) gives the log-probs of the reference with bf16-rounded weights."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import write_config

from grpokit import GRPOConfig
from grpokit.cli import main
from grpokit.compose.specs import learner_spec
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.policy_logprobs import build_batch
from grpokit.train.learning.reference import Reference

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_64(tmp_path_factory):
    """A 2-layer Llama, hidden 64, MLP 128: its attention (4096 values) and MLP (8192) weights get 8-bit moments,
    the embedding (48 x 64 = 3072 values) and norms float32 ones (bitsandbytes' threshold is 4096 values)."""
    from shared_helpers import WORDS

    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama-64")
    tokenizer = build_word_tokenizer([*WORDS, "user", "assistant", "system", ":"])
    build_tiny_causal_lm(path, tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    return path


def metrics(run: Path) -> list[dict]:
    return [m for line in (run / "metrics.jsonl").read_text().splitlines() if "loss" in (m := json.loads(line))]


def test_8bit_adamw_trains_checkpoints_and_resumes_exactly(tmp_path, model_64, word_prompts):
    pytest.importorskip("bitsandbytes")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    straight = write_config(tmp_path / "a", model_64, word_prompts, optim={"max_steps": 3}, run={"save_steps": 2})
    # TRL's key at the top level, as a TRL config writes it
    assert main(["train", str(straight), "optim=adamw_8bit"]) == 0
    run = tmp_path / "a" / "run"
    states = torch.load(run / "checkpoints" / "step-2" / "states.pt", weights_only=True)["optimizer"]["state"]
    moments = [s["__bnb_optimizer_quant_state__"]["state1"] for s in states.values()]  # bitsandbytes' saved form
    kinds = {(m.dtype, m.numel()) for m in moments}
    assert (torch.uint8, 8192) in kinds and (torch.uint8, 4096) in kinds and (torch.float32, 3072) in kinds
    assert all(m["nonfinite"] == 0 for m in metrics(run))
    # the same run stopped after step 2 and resumed from its checkpoint: the same step 3, weights alike
    resumed = write_config(tmp_path / "b", model_64, word_prompts, optim={"max_steps": 2, "optimizer": "adamw_8bit"})
    assert main(["train", str(resumed)]) == 0
    assert main(["train", str(resumed), "max_steps=3", "resume_from=latest"]) == 0
    a, b = metrics(run)[-1], metrics(tmp_path / "b" / "run")[-1]
    assert a["step"] == b["step"] == 3
    for key in ("loss", "kl", "grad_norm", "completion_logprob_mean"):
        assert a[key] == pytest.approx(b[key], abs=1e-6), key
    wa, wb = (
        load_file(run / "final" / "model.safetensors"),
        load_file(tmp_path / "b" / "run" / "final" / "model.safetensors"),
    )
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=0)


def test_8bit_adamw_first_step_is_adamws_then_close_to_it():
    """Step 1 from zero moments: m = (1 - b1) g, v = (1 - b2) g^2, so the bias-corrected update is
    lr * g / (|g| + eps) = lr * sign(g) for |g| >> eps in both optimizers (bitsandbytes quantises the moments
    after using them). Later steps use the dequantised 8-bit moments: close to AdamW's, not equal."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    start = torch.randn(64, 128)
    grads = [torch.randn(64, 128) for _ in range(5)]
    weights = {}
    for name, make in (
        ("torch", lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0)),
        ("8bit", lambda p: bnb.optim.AdamW8bit(p, lr=1e-2, weight_decay=0.0)),
    ):
        w = torch.nn.Parameter(start.clone())
        opt = make([w])
        trace = []
        for g in grads:
            w.grad = g.clone()
            opt.step()
            trace.append(w.detach().clone())
        weights[name] = trace
    torch.testing.assert_close(weights["8bit"][0], start - 1e-2 * grads[0].sign(), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights["8bit"][0], weights["torch"][0], atol=1e-6, rtol=0)
    moved = (weights["torch"][-1] - start).abs().mean()
    differ = (weights["8bit"][-1] - weights["torch"][-1]).abs().mean()
    assert 0 < differ < 0.05 * moved  # quantised moments: a few % of the distance travelled at most


def test_8bit_adamw_in_slices_equals_bitsandbytes_whole(monkeypatch):
    """grpokit's CPU step over slices of a parameter (here 3 x 256 + 100 values per slice of 1024) gives exactly
    bitsandbytes' own step over the whole parameter: every operation is elementwise or per 256-value block."""
    bnb = pytest.importorskip("bitsandbytes")
    from grpokit.memory import estimate as memory
    from grpokit.train.learning import adamw8bit

    assert adamw8bit.SLICE_VALUES == memory.EIGHT_BIT_SLICE  # the estimate's copy of it
    monkeypatch.setattr(adamw8bit, "SLICE_VALUES", 1024)
    torch.manual_seed(0)
    start = torch.randn(50, 70)  # 3500 values: 4 slices, the last partial, 14 blocks
    grads = [torch.randn(50, 70) for _ in range(4)]
    out = []
    for make in (bnb.optim.AdamW8bit, adamw8bit.AdamW8bit):
        w = torch.nn.Parameter(start.clone())
        opt = make([w], lr=1e-2, weight_decay=0.1, min_8bit_size=1000)
        for g in grads:
            w.grad = g.clone()
            opt.step()
        assert opt.state[w]["state1"].dtype == torch.uint8
        out.append((w.detach().clone(), opt.state[w]["state1"].clone(), opt.state[w]["absmax2"].clone()))
    for whole, sliced in zip(*out):
        assert torch.equal(whole, sliced)


def test_an_8bit_optimizer_without_bitsandbytes_names_the_extra(monkeypatch):
    import sys

    from grpokit.train.learning.optimizer import make_optimizer
    from grpokit.train.learning.optimizer_settings import OptimizerSettings

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    monkeypatch.delitem(sys.modules, "grpokit.train.learning.adamw8bit", raising=False)
    with pytest.raises(ImportError, match=r"grpokit\[qlora\]"):
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimizerSettings(optimizer="adamw_bnb_8bit"), CPU)


def _rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose weights are rounded to bf16 and kept in float32."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.bfloat16().float())
    return rounded


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_bf16_reference_is_the_reference_with_rounded_weights(tiny_model_dir, autocast_dtype):
    from grpokit.models.loading import load_model
    from grpokit.rollout.types import Rollouts

    policy = load_model(str(tiny_model_dir), torch.float32, CPU)
    args = GRPOConfig(ref_model_dtype="bfloat16", beta=0.04, num_generations=4, per_device_train_batch_size=8)
    reference = Reference(policy, use_adapters=False)
    learner = Learner(policy, reference, None, None, learner_spec(args), autocast_dtype=autocast_dtype)
    params = list(reference.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)  # at rest: all of it, the tied embedding and norms too
    torch.manual_seed(0)
    rollouts = Rollouts(
        prompt_ids=[[1, 5, 6, 7], [1, 8, 9]],
        completion_ids=torch.randint(5, 40, (8, 6)),
        completion_mask=torch.ones(8, 6),
        logprobs=torch.zeros(8, 6),
        finish_reasons=["length"] * 8,
        num_generations=4,
    )
    batch = build_batch(policy, rollouts, 0, CPU)
    got = learner.reference_logprobs(batch)
    assert all(p.dtype == torch.bfloat16 for p in reference.model.parameters())  # the casts were dropped
    expected_model = _rounded(policy).eval()
    expected = Learner(
        expected_model,
        Reference(expected_model, use_adapters=False),
        None,
        None,
        learner_spec(args.replace(ref_model_dtype="auto")),
        autocast_dtype=autocast_dtype,
    ).reference_logprobs(batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    full = Learner(
        policy,
        Reference(policy, use_adapters=False),
        None,
        None,
        learner_spec(args.replace(ref_model_dtype="auto")),
        autocast_dtype=autocast_dtype,
    ).reference_logprobs(batch)
    assert 0 < (got - full).abs().max() < 0.05  # the bf16 rounding of the weights, and only that


def test_bf16_reference_trains_through_the_cli_and_is_refused_where_it_has_no_copy(
    tmp_path, tiny_model_dir, word_prompts
):
    config = write_config(tmp_path, tiny_model_dir, word_prompts, model={"ref_model_dtype": "bfloat16"})
    assert main(["train", str(config), "max_steps=2"]) == 0
    steps = metrics(tmp_path / "run")
    assert [m["step"] for m in steps] == [1, 2] and steps[-1]["kl"] > 0
    with pytest.raises(ValueError, match="with LoRA there is no copy"):
        GRPOConfig(ref_model_dtype="bfloat16", lora={"r": 4}).validate()
    with pytest.raises(ValueError, match="ref_model_sync_steps"):
        GRPOConfig(ref_model_dtype="bfloat16", ref_model_sync_steps=4).validate()
