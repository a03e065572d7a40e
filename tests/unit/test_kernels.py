"""grpokit.kernels.Kernels: the one per-run choice of fast paths, and run state that two runs never share."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from grpokit.kernels import Kernels
from grpokit.kernels.fused_head import WeightCasts, fused_head_logprobs
from grpokit.machine.cpu_caps import CpuCaps
from grpokit.testing import build_tiny_causal_lm

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")

AVX512_BF16 = CpuCaps(
    "x86_64",
    "",
    frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
    onednn=True,
    onednn_bf16=True,
    torch_capability="AVX512",
)
ZEN3 = CpuCaps("x86_64", "", frozenset({"avx2"}), onednn=True, onednn_bf16=False, torch_capability="AVX2")
GRAVITON = CpuCaps("aarch64", "", frozenset({"asimd", "bf16"}), onednn=True, onednn_bf16=True, torch_capability="SVE")


def test_selection_from_device_dtype_and_cpu():
    fp32 = Kernels.select(CPU, None, caps=AVX512_BF16)
    assert fp32.packed_linears and fp32.small_attention and fp32.fused_decoder and fp32.fused_head
    assert not fp32.reference_in_autocast_dtype
    bf16 = Kernels.select(CPU, torch.bfloat16, caps=AVX512_BF16)
    assert not bf16.packed_linears  # under autocast each call would cast and pack again
    assert bf16.reference_in_autocast_dtype and bf16.autocast_dtype is torch.bfloat16
    assert Kernels.select(CPU, None, caps=ZEN3).packed_linears  # float32 packing needs no AVX-512
    arm = Kernels.select(CPU, None, caps=GRAVITON)
    assert not arm.packed_linears and arm.small_attention  # oneDNN packing is an x86 path; the rest is plain torch
    cuda = Kernels.select(torch.device("cuda"), torch.bfloat16)  # no GPU needed: nothing is allocated
    assert not cuda.packed_linears and not cuda.small_attention
    assert cuda.fused_head and cuda.preallocated_kv_cache
    # the fused decoder is CPU-tuned (weight copies, float32 attention over the whole cache): CUDA keeps SDPA
    assert not cuda.fused_decoder and not Kernels.select(torch.device("cuda"), None).fused_decoder
    model, _ = build_tiny_causal_lm(arch="qwen2")
    assert cuda.decoder(model, torch.bfloat16, rows=2) is None


def test_the_forced_probe_rules_packing_out(monkeypatch):
    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "aarch64")
    assert not Kernels.select(CPU, None).packed_linears


def test_plain_versions():
    model, _ = build_tiny_causal_lm(arch="qwen2")
    fast = Kernels.select(CPU, None)
    assert fast.plain_head(model) is not None
    plain = dataclasses.replace(
        fast, fused_decoder=False, fused_head=False, small_attention=False, reference_in_autocast_dtype=False
    )
    assert plain.plain_head(model) is None
    assert plain.decoder(model, torch.float32, rows=2) is None
    with plain.attention(model):
        assert model.config._attn_implementation == "sdpa"  # left on SDPA
    with fast.attention(model):
        assert model.config._attn_implementation != "sdpa"
    assert plain.store_reference(model) == 0


def test_two_runs_share_no_state():
    model, _ = build_tiny_causal_lm(arch="qwen2")
    first, second = Kernels.select(CPU, None), Kernels.select(CPU, None)
    assert first.plain_head(model) is not None
    assert first.decoder(model, torch.float32, rows=1) is not None
    assert len(first.state.plain_heads) == 1 and len(first.state.decoder_checked) == 1
    assert len(second.state.plain_heads) == 0 and len(second.state.decoder_checked) == 0
    with first.reuse_weight_casts():
        head = model.get_output_embeddings().weight
        assert first.state.weight_casts.cast(head, torch.bfloat16) is first.state.weight_casts.cast(
            head, torch.bfloat16
        )
        assert second.state.weight_casts.cast(head, torch.bfloat16) is not second.state.weight_casts.cast(
            head, torch.bfloat16
        )  # the other run has no block open: a fresh cast per call


def test_weight_casts_are_reused_until_the_weight_changes():
    casts = WeightCasts()
    weight = torch.nn.Parameter(torch.randn(6, 4))
    assert casts.cast(weight, torch.float32) is weight  # no cast needed
    outside = casts.cast(weight, torch.bfloat16)
    assert casts.cast(weight, torch.bfloat16) is not outside  # no block: cast per call
    with casts.reuse():
        once = casts.cast(weight, torch.bfloat16)
        with casts.reuse():  # a nested block shares the outer one's casts
            assert casts.cast(weight, torch.bfloat16) is once
        assert casts.cast(weight, torch.bfloat16) is once
        with torch.no_grad():
            weight.add_(1.0)  # an optimizer step: a new version, so a new cast
        again = casts.cast(weight, torch.bfloat16)
        assert again is not once
        torch.testing.assert_close(again, weight.detach().to(torch.bfloat16))
    assert casts.cast(weight, torch.bfloat16) is not again  # block closed: nothing kept


def test_fused_head_gives_the_same_numbers_with_and_without_reused_casts():
    torch.manual_seed(0)
    hidden, weight, tokens = torch.randn(5, 8), torch.randn(11, 8), torch.tensor([0, 3, 10, 7, 7])
    casts = WeightCasts()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, _ = fused_head_logprobs(hidden, weight, None, tokens)
        with casts.reuse():
            reused, _ = fused_head_logprobs(hidden, weight, None, tokens, casts=casts)
    assert torch.equal(plain, reused)


def test_keep_freed_memory_is_opt_in_and_applies_on_glibc(tmp_path):
    """In its own process (it changes the process's allocator): applied on Linux with glibc, a no-op elsewhere."""
    code = "import grpokit.kernels as k; print(k.keep_freed_memory())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    glibc = sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver())
    assert result.stdout.strip() == ("True" if glibc else "False")


def test_the_fused_decoder_refuses_a_model_off_the_cpu(monkeypatch):
    from grpokit.kernels import fused_decoder

    model, _ = build_tiny_causal_lm(arch="qwen2")
    assert fused_decoder.fused_decoder(model, torch.float32, rows=2) is not None  # a CPU model: fused
    on_gpu = torch.nn.Parameter(torch.empty(1, device="meta"))  # a parameter that is not on the CPU, first
    monkeypatch.setattr(type(model), "parameters", lambda self, recurse=True: iter([on_gpu]))
    assert fused_decoder.fused_decoder(model, torch.float32, rows=2) is None
