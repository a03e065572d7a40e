"""Qwen3.5's hybrid KV cache (gated delta-net layers with conv / recurrent states beside full-attention layers) and
its MoE router in grpokit's sampler and learner: rows dropped from the sampler's preallocated cache leave the
attention buffers in step with the states; training through the shared-prompt pass (the prompt once per group, its
completions on the prompt's cache) has the full forward's gradients; and the router's aux-loss pass (a full forward
asking for router logits) gets the prompts' images. All three failed TRL's Qwen3.5(-MoE) test_train_vlm here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpokit.data.prompts import PromptSource
from grpokit.kernels import Kernels
from grpokit.kernels.kv_cache import PreallocatedLayer, preallocate
from grpokit.models.cache_rows import select_rows
from grpokit.models.vision import register_processor
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import SamplingParams
from grpokit.train.learning.loss_terms import policy_forward
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
families = pytest.importorskip("vlm_fixture_families")  # TRL's Qwen3.5 recipe; trl ships its chat template

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_qwen3_5_moe():
    torch.manual_seed(0)
    model, processor, _ = families.qwen3_5("moe")  # one linear-attention and one full-attention layer
    return model.float().eval(), processor


def test_dropping_a_row_of_a_hybrid_cache_moves_the_preallocated_attention_buffers_too():
    model, _ = tiny_qwen3_5_moe()
    ids = torch.randint(0, 1000, (2, 6), generator=torch.Generator().manual_seed(1))
    token = torch.tensor([[7]])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        preallocate(cache, 10)  # as the sampler does after the prefill
        assert [type(layer).__name__ for layer in cache.layers] == ["LinearAttentionLayer", "PreallocatedLayer"]
        select_rows(cache, torch.tensor([1]))  # row 0 finished: row 1 decodes on alone
        assert isinstance(cache.layers[1], PreallocatedLayer) and cache.layers[1]._keys.size(0) == 1
        step = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]  # [1, V]
        alone = model(input_ids=torch.cat([ids[1:], token], dim=1)).logits[:, -1]  # row 1 from scratch
    assert float((step - alone).abs().max()) < 1e-5


def image_rollouts(model, processor):
    """Two completions of 4 tokens for one prompt with a picture, and the learner's batch of them."""
    tokenizer = processor.tokenizer
    register_processor(tokenizer, processor)
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
         "images": [Image.new("RGB", (40, 30), (200, 10, 10))]}
    ]  # fmt: skip
    source = PromptSource(rows, tokenizer, max_prompt_length=4096)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    rollouts = engine.generate([source.ids[0]], 2, SamplingParams.plain(4))
    return rollouts, build_batch(model, rollouts, tokenizer.pad_token_id, torch.device("cpu"))


def test_training_through_the_shared_prompt_pass_of_a_hybrid_model_has_the_full_forwards_gradients():
    model, processor = tiny_qwen3_5_moe()
    rollouts, batch = image_rollouts(model, processor)

    def gradients() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logprobs, _ = completion_logprobs(model, batch, 1.0)
        (logprobs * rollouts.completion_mask).sum().backward()  # raised "modified by an inplace operation"
        return {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}  # embedding: sparse

    shared = gradients()  # the prompt once; its two completions on the prompt's cache
    model.activation_checkpointing_enable()  # no KV cache: the full forward over [prompt | completion] per row
    try:
        full = gradients()
    finally:
        model.activation_checkpointing_disable()
    assert shared.keys() == full.keys() and any("linear_attn" in n for n in shared)
    for name, grad in full.items():
        assert torch.allclose(shared[name], grad, rtol=1e-4, atol=1e-6), name


def test_the_router_aux_loss_pass_of_a_moe_vlm_sees_the_images():
    model, processor = tiny_qwen3_5_moe()
    rollouts, batch = image_rollouts(model, processor)
    with torch.no_grad():
        expected, _ = completion_logprobs(model, batch, 1.0)  # the shared-prompt pass, images and all
    logprobs, _, aux, _ = policy_forward(model, batch, 1.0, Kernels.select(torch.device("cpu")), router_aux=True)
    assert aux is not None  # the router's load-balancing loss came back
    mask = rollouts.completion_mask
    assert float(((logprobs - expected) * mask).abs().max()) < 1e-5  # was the forward of image placeholders alone
    (logprobs * mask).sum().backward()
    assert float(model.model.visual.patch_embed.proj.weight.grad.abs().sum()) > 0  # the vision tower trains
