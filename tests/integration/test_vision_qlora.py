"""QLoRA on a vision-language model, on CPU (bitsandbytes >= 0.48): the tiny Qwen2-VL (text width 64: bitsandbytes
quantises in blocks of 64 values) loaded with load_in_4bit (every Linear of the vision tower, its merger and the
language model in NF4; the LM head and the embeddings stay float32), LoRA on the language model by default, 2 steps
through GRPOTrainer with a reference (the adapters disabled): the adapters move, every base weight stays as loaded,
and the sampler's log-probs through the 4-bit layers are the learner's."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.train.learning.policy_logprobs import batched_logprobs, build_batch

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

pytestmark = pytest.mark.usefixtures("one_thread")
COLOURS = {"red": (255, 0, 0), "blue": (0, 0, 255)}


def colour_reward(completions, answer, **kwargs):
    return [float(a in c[0]["content"].split()) for c, a in zip(completions, answer)]


def test_qlora_trains_language_model_adapters_on_a_4bit_vlm(tmp_path):
    from bitsandbytes.nn import Linear4bit

    from grpokit.models.vision import load_processor
    from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

    folder = tmp_path / "tiny-qwen2-vl"
    build_tiny_qwen2_vl(folder, words=[*COLOURS, "colour", "?"], hidden_size=64)
    chat = [{"role": "user", "content": "colour ?"}]
    rows = [{"prompt": chat, "image": Image.new("RGB", (30, 30), rgb), "answer": name} for name, rgb in COLOURS.items()]
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, max_completion_length=3,
        max_steps=2, learning_rate=1e-2, report_to="none", disable_tqdm=True, beta=0.04, load_in_4bit=True,
        lora={"r": 4},
    )  # fmt: skip
    trainer = GRPOTrainer(model=str(folder), reward_funcs=colour_reward, args=args, train_dataset=rows * 2,
                          processing_class=load_processor(str(folder)))  # fmt: skip
    base = trainer.model.get_base_model()
    quantised = {n for n, m in base.named_modules() if isinstance(m, Linear4bit)}
    # 2 text layers x 7, the tower's block (qkv, proj, fc1, fc2) and its merger's 2: all 4-bit; the LM head is not
    assert len(quantised) == 20 and any(n.startswith("model.visual.") for n in quantised)
    assert type(base.lm_head) is torch.nn.Linear
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ".language_model." in n for n in trainable)  # the tower has none
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert any(p.dtype == torch.uint8 for p in frozen.values())  # the packed 4-bit weights

    trainer.train()

    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(params[n].detach(), before) for n, before in frozen.items())  # the base stays as loaded
    lora_b = [n for n in trainable if "lora_B" in n]  # B starts at zero: nonzero once it learnt
    assert lora_b and all(params[n].abs().max() > 0 for n in lora_b)
    # the sampler's log-probs (each prompt's image once, through the 4-bit tower) are the learner's
    rollouts = trainer.engine.generate([trainer.train_source.ids[i] for i in range(2)], 4, trainer.sampling)
    trainer.model.eval()
    batch = build_batch(trainer.model, rollouts, trainer.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        learner = batched_logprobs(trainer.model, batch, 1.0, 16)
    torch.testing.assert_close(rollouts.logprobs, learner * rollouts.completion_mask, rtol=0, atol=1e-4)
