"""The learner's fast paths give the numbers of the plain computation.

Shared-prefix log-probs and gradients equal one unpadded forward pass per sequence (float32, 1e-5),
through the fused LM head and through the logits path; the full-forward fallback too; the fused
head equals log_softmax by hand; the bf16 autocast update stays within a stated tolerance of float32.
"""

import copy

import pytest
import torch
from shared_helpers import sampling_params, tiny_args

from grpokit.compose.specs import learner_spec
from grpokit.kernels import plain_head as plain_head_module
from grpokit.kernels.fused_head import fused_head_logprobs
from grpokit.kernels.linear_storage import store_linears_in
from grpokit.kernels.plain_head import plain_head
from grpokit.machine import hardware
from grpokit.machine.cpu_caps import CpuCaps
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.policy_logprobs import (
    batched_logprobs,
    build_batch,
    completion_logprobs,
    shares_prefix,
)
from grpokit.train.learning.reference import Reference

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread
G = 4
PROMPTS = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40]]


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    model, _ = build_tiny_causal_lm(tokenizer=tokenizer, arch="qwen2", num_kv_heads=2)
    model.eval()
    engine = HFRolloutEngine(model, list(range(2, 12)), tokenizer.pad_token_id, CPU, seed=3)
    rollouts = engine.generate(PROMPTS, G, sampling_params(max_completion_length=12, temperature=0.7))
    assert len(set(rollouts.completion_lengths.tolist())) > 2  # ragged completions: padding inside micro-batches
    return model, rollouts, build_batch(model, rollouts, tokenizer.pad_token_id, CPU)


def plain_logprobs(model, rollouts, n, temperature=0.7):
    """One unpadded forward pass of prompt + completion n; log softmax(logits / T) at each completion token."""
    prompt, length = PROMPTS[n // G], int(rollouts.completion_lengths[n])
    completion = rollouts.completion_ids[n, :length].tolist()
    logits = model(torch.tensor([prompt + completion])).logits[0]  # [L, V]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp[torch.arange(len(prompt) - 1, len(prompt) - 1 + length), torch.tensor(completion)]


# micro-batches: all rows; one group; rows spanning parts of two groups; a single row
SLICES = [slice(0, 12), slice(4, 8), slice(2, 7), slice(9, 10)]


@pytest.fixture(params=["fused_head", "logits"])
def head_path(request, monkeypatch):
    """Run a test through the fused LM head, and again through full logits + selective_logprobs."""
    if request.param == "logits":
        monkeypatch.setattr(plain_head_module, "plain_head", lambda model, checked=None: None)
    return request.param


@pytest.mark.parametrize("rows", SLICES, ids=lambda s: f"rows{s.start}-{s.stop}")
def test_shared_prefix_logprobs_equal_plain_forward(setup, rows, head_path):
    model, rollouts, batch = setup
    assert shares_prefix(model)
    with torch.no_grad():
        logprobs, entropy = completion_logprobs(model, batch.rows(rows), 0.7, with_entropy=True)
        lengths = rollouts.completion_lengths[rows]
        for i, n in enumerate(range(rows.start, rows.stop)):
            torch.testing.assert_close(logprobs[i, : lengths[i]], plain_logprobs(model, rollouts, n), atol=1e-5, rtol=0)
    width = int(lengths.max())  # the micro-batch runs up to its longest completion; past it, zeros
    assert logprobs.shape == entropy.shape == (len(lengths), rollouts.completion_ids.size(1))
    assert (logprobs[:, width:] == 0).all() and (entropy[:, width:] == 0).all()


def test_shared_prefix_gradients_equal_plain_forward(setup, head_path):
    # the G rows of a group share one prompt pass; its gradient is the sum over the rows, as over G copies
    model, rollouts, batch = setup
    rows = slice(2, 7)
    model.zero_grad()
    logprobs, _ = completion_logprobs(model, batch.rows(rows), 0.7)
    (logprobs * batch.completion_mask[rows]).sum().backward()
    shared = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    sum(plain_logprobs(model, rollouts, n).sum() for n in range(rows.start, rows.stop)).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(shared[name], p.grad, atol=1e-5 * p.grad.abs().max().item(), rtol=0, msg=name)
    model.zero_grad()


def test_full_forward_fallback_equals_plain_forward(setup, head_path):
    # gradient checkpointing turns the KV cache off: the learner then runs [prompt | completion] whole
    model, rollouts, batch = setup
    fallback = copy.deepcopy(model)
    enable = getattr(fallback, "activation_checkpointing_enable", None) or fallback.gradient_checkpointing_enable
    enable()
    assert not shares_prefix(fallback)
    with torch.no_grad():
        logprobs, _ = completion_logprobs(fallback, batch.rows(slice(2, 7)), 0.7)
        for i, n in enumerate(range(2, 7)):
            length = int(rollouts.completion_lengths[n])
            torch.testing.assert_close(logprobs[i, :length], plain_logprobs(model, rollouts, n), atol=1e-5, rtol=0)


def test_no_grad_passes_return_ordinary_tensors(setup):
    # the reference pass runs in inference mode; its result must still be usable inside the loss's graph
    model, rollouts, batch = setup
    ref = batched_logprobs(model, batch, 0.7, micro_batch_size=5)
    assert not ref.is_inference() and not ref.requires_grad
    with torch.no_grad():
        for n in (0, 6, 11):
            length = int(rollouts.completion_lengths[n])
            torch.testing.assert_close(ref[n, :length], plain_logprobs(model, rollouts, n), atol=1e-5, rtol=0)
    logprobs, _ = completion_logprobs(model, batch, 0.7)
    ((ref - logprobs).exp() * batch.completion_mask).sum().backward()  # k3-style use of the reference
    model.zero_grad()


def test_fused_head_by_hand():
    # hidden [1, 0] and [0, 1]; W rows (0, 0), (ln 3, 0), (0, ln 3) -> logits [0, ln 3, 0] and [0, 0, ln 3]
    # -> p = [0.2, 0.6, 0.2] and [0.2, 0.2, 0.6]; log p(token 1) = ln 0.6 = -0.510826, log p(token 0) = ln 0.2 =
    # -1.609438
    # H = -(2 * 0.2 ln 0.2 + 0.6 ln 0.6) = 0.643775 + 0.306495 = 0.950271 for both rows
    # d log p(y) / dz = onehot(y) - p: row 1 -> [-0.2, 0.4, -0.2]; dW = sum over rows of (onehot - p) h^T,
    # row 2 (token 0) -> [0.8, -0.2, -0.6] on hidden [0, 1]; so dW[:, 0] = [-0.2, 0.4, -0.2], dW[:, 1] = [0.8, -0.2,
    # -0.6]
    log3 = torch.log(torch.tensor(3.0))
    weight = torch.tensor([[0.0, 0.0], [log3, 0.0], [0.0, log3]], requires_grad=True)
    hidden = torch.eye(2, requires_grad=True)
    logprobs, entropy = fused_head_logprobs(
        hidden, weight, None, torch.tensor([1, 0]), with_entropy=True, chunk_elements=2, saved_logits_bytes=0
    )  # logits recomputed in the backward
    torch.testing.assert_close(logprobs, torch.tensor([-0.510826, -1.609438]))
    torch.testing.assert_close(entropy, torch.tensor([0.950271, 0.950271]))
    logprobs.sum().backward()
    torch.testing.assert_close(weight.grad, torch.tensor([[-0.2, 0.8], [0.4, -0.2], [-0.2, -0.6]]))
    # dh = (onehot - p) W: row 1 -> [-0.2, 0.4, -0.2] W = [0.4 ln 3, -0.2 ln 3]
    torch.testing.assert_close(hidden.grad[0], torch.tensor([0.4, -0.2]) * log3)


@pytest.mark.parametrize("chunk_elements", [7, 64, 2**22])
@pytest.mark.parametrize("saved_logits_bytes", [0, 2**20], ids=["recomputed", "kept"])
def test_fused_head_equals_log_softmax(chunk_elements, saved_logits_bytes, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(40, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 40, (13,), generator=gen)
    upstream = torch.randn(13, generator=gen, dtype=torch.float64)
    z = (hidden @ weight.t() + bias) / 0.7
    expected = torch.log_softmax(z, -1).gather(-1, tokens[:, None]).squeeze(-1)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), [hidden, weight, bias])
    leaves = [x.detach().float().requires_grad_(True) for x in (hidden, weight, bias)]
    got, entropy = fused_head_logprobs(
        *leaves,
        tokens,
        temperature=0.7,
        with_entropy=True,
        chunk_elements=chunk_elements,
        saved_logits_bytes=saved_logits_bytes,
    )
    import grpokit.kernels.fused_head as fused_head

    calls = []
    linear = fused_head.F.linear
    monkeypatch.setattr(fused_head.F, "linear", lambda *a: calls.append(1) or linear(*a))
    (got * upstream.float()).sum().backward()
    assert bool(calls) == (saved_logits_bytes == 0), "the backward recomputes the logits only when they were not kept"
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        entropy.double(), -(z.softmax(-1) * z.log_softmax(-1)).sum(-1).detach(), atol=1e-5, rtol=0
    )
    for leaf, grad in zip(leaves, expected_grads):
        torch.testing.assert_close(leaf.grad.double(), grad, atol=1e-5, rtol=1e-5)


def test_fused_head_online_logsumexp_when_the_max_moves_across_slices():
    # weight rows j = 0..39 give row i the logit z_j = 3 j (1 + i) on hidden [1 + i, 0]: each slice of 4 vocabulary
    # entries holds a larger max than the one before (the running sums are rescaled 9 times), up to 117 (1 + i),
    # where float32 exp would overflow without the shift. Expected: log_softmax and entropy in float64.
    hidden = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    weight = torch.stack([3.0 * torch.arange(40.0), torch.zeros(40)], dim=1)  # [40, 2]
    tokens = torch.tensor([39, 38, 0])
    z = (hidden.double() @ weight.double().t()) / 2.0
    logp = torch.log_softmax(z, -1)
    logprobs, entropy = fused_head_logprobs(
        hidden, weight, None, tokens, temperature=2.0, with_entropy=True, chunk_elements=12, saved_logits_bytes=0
    )  # 12 logits per slice / 3 rows = slices of 4 vocabulary entries
    torch.testing.assert_close(logprobs.double(), logp.gather(-1, tokens[:, None]).squeeze(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)


def test_plain_head_detection():
    from transformers import CohereConfig, CohereForCausalLM

    for arch in ("qwen2", "llama", "gpt2"):
        model, _ = build_tiny_causal_lm(arch=arch)
        assert plain_head(model) is not None, arch
    # Cohere multiplies its logits by logit_scale: the fused head would be wrong, so the logits path is used
    cohere = CohereForCausalLM(
        CohereConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            logit_scale=0.5,
            eos_token_id=2,
            bos_token_id=1,
            pad_token_id=0,
        )
    )
    assert plain_head(cohere) is None


def _update(autocast_dtype, seed=0):
    """One Learner.update on a fixed batch whose loss depends on the log-probs: off-policy old log-probs
    (a ratio away from 1) and a reference that differs from the policy (a KL away from 0)."""
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(200)])
    model, _ = build_tiny_causal_lm(
        tokenizer=tokenizer, arch="qwen2", hidden_size=128, num_heads=4, num_kv_heads=2, seed=seed
    )
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, CPU, seed=0)
    rollouts = engine.generate([[20, 21, 22, 23], [30, 31]], 4, sampling_params(max_completion_length=16))
    batch = build_batch(model, rollouts, tokenizer.pad_token_id, CPU)
    reference = Reference(model, use_adapters=False)
    with torch.no_grad():
        for p in reference.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    optim = dict(gradient_accumulation_steps=2, learning_rate=1e-3)
    cfg = tiny_args(num_generations=4, prompts_per_step=1, max_completion_length=16, beta=0.04, **optim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(model, reference, optimizer, scheduler, learner_spec(cfg), autocast_dtype=autocast_dtype)
    old = rollouts.logprobs + 0.3 * torch.randn(rollouts.logprobs.shape, generator=torch.Generator().manual_seed(2))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.0])
    ref_logprobs = learner.reference_logprobs(batch)
    weights = [p.detach().clone() for p in model.parameters()]
    metrics = learner.update(
        batch, advantages, batch.completion_mask, ref_logprobs, old_logprobs=old * batch.completion_mask
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return metrics, torch.cat([(p.detach() - w).flatten() for p, w in zip(model.parameters(), weights)])


def test_bf16_autocast_update_is_close_to_float32():
    # Tolerance: bf16 keeps 8 mantissa bits (~0.4 % relative error per matmul output). Stated bound:
    # loss, KL and gradient norm of the bf16 update within 2 % (relative) of float32 (measured here:
    # 0.5 %, 0.1 %, 0.03 %), and an update direction with cosine > 0.99 (measured 0.996).
    fp32, step32 = _update(None)
    bf16, step16 = _update(torch.bfloat16)
    for key in ("loss", "kl", "grad_norm"):
        assert bf16[key] == pytest.approx(fp32[key], rel=0.02), key
    # AdamW's first step is ~lr * sign(grad), so tiny gradient entries may flip; the direction holds
    assert torch.cosine_similarity(step16, step32, dim=0) > 0.99


def test_reference_linears_in_bf16_change_no_number(setup):
    # under bf16 autocast a Linear computes with its weight cast to bf16 anyway: storing it so is exact
    model, _, batch = setup
    reference = copy.deepcopy(model)
    assert store_linears_in(reference, torch.bfloat16) == 2 * 7  # q k v o gate up down per layer; not the tied head
    assert reference.get_input_embeddings().weight.dtype == torch.float32
    with hardware.autocast(CPU, torch.bfloat16):
        expected = batched_logprobs(model, batch, 0.7, micro_batch_size=12)
        got = batched_logprobs(reference, batch, 0.7, micro_batch_size=12)
    assert torch.equal(got, expected)


def test_autocast_choice(monkeypatch):
    big = torch.nn.Linear(4000, 3000)  # 12M parameters
    small = torch.nn.Linear(10, 10)
    flags = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_bf16"})
    sapphire_rapids = CpuCaps("x86_64", "", flags, onednn=True, onednn_bf16=True, torch_capability="AVX512")
    monkeypatch.setattr(hardware, "cpu_caps", lambda: sapphire_rapids)
    assert hardware.autocast_dtype("auto", CPU, big) is torch.bfloat16
    assert hardware.autocast_dtype("auto", CPU, small) is None  # casts cost more than they save
    assert hardware.autocast_dtype("float32", CPU, big) is None
    zen3 = CpuCaps("x86_64", "", frozenset({"avx2"}), onednn=True, onednn_bf16=False, torch_capability="AVX2")
    monkeypatch.setattr(hardware, "cpu_caps", lambda: zen3)
    assert hardware.autocast_dtype("auto", CPU, big) is None  # emulated bf16: float32 is faster
    graviton3 = CpuCaps(
        "aarch64", "", frozenset({"asimd", "sve", "bf16"}), onednn=True, onednn_bf16=True, torch_capability="SVE256"
    )
    monkeypatch.setattr(hardware, "cpu_caps", lambda: graviton3)
    assert hardware.autocast_dtype("auto", CPU, big) is None  # not measured on Arm: float32
