"""Per-family log-prob parity: for every VLM family transformers builds here tiny, offline and without torchvision,
grpokit's per-token log-probs (its sampler's, the learner's shared-prompt pass with the vision tower once per
prompt, and its full forward) equal the model's own forward over each row, given the processor's own inputs for the
prompt (``processor.apply_chat_template(..., tokenize=True)``, as TRL builds them) with the completion appended, in
float32, to 1e-5. A family grpokit cannot drive is refused in one line naming it (tested below)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from grpokit.data.prompts import PromptSource
from grpokit.models.vision import register_processor
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.types import SamplingParams
from grpokit.train.learning.policy_logprobs import build_batch, completion_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
families = pytest.importorskip("vlm_fixture_families")  # TRL's recipes; trl ships their chat templates
from vlm_families import BUILDERS  # noqa: E402  (tests/vlm_families.py: the families beyond TRL's list)

pytestmark = pytest.mark.usefixtures("one_thread")
TOLERANCE = 1e-5

FAMILIES = {
    "qwen2_vl": lambda: families.qwen2_vl("2"),
    "qwen2_5_vl": lambda: families.qwen2_vl("2.5"),
    "gemma3": families.gemma3,
    "llava_next": families.llava_next,
    "qwen3_5": lambda: families.qwen3_5("dense"),
    "qwen3_5_moe": lambda: families.qwen3_5("moe"),
    **{name: build for name, build in BUILDERS.items() if name != "paligemma"},
}


def rows() -> list[dict]:
    """Two one-image conversational prompts, pictures of different sizes and colours."""
    pictures = [Image.new("RGB", (40, 30), (200, 10, 10)), Image.new("RGB", (36, 52), (10, 10, 200))]
    return [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
         "images": [p]}
        for p in pictures
    ]  # fmt: skip


def processor_inputs(processor, row: dict) -> dict:
    """The processor's own inputs for a row's prompt, as TRL makes them (images inside the messages)."""
    messages = [dict(m) for m in row["prompt"]]
    content = [dict(c) for c in messages[0]["content"]]
    for c, image in zip([c for c in content if c["type"] == "image"], row["images"], strict=True):
        c["image"] = image
    messages[0]["content"] = content
    return dict(
        processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
    )


def own_forward(model, processor, rollouts) -> torch.Tensor:
    """[N, T] log-probs from the model's forward over each row: the processor's inputs for its prompt (pixel values
    and all, repeated per completion as TRL does) with the completion appended; per-token inputs (token type ids)
    continue as text (0); the model computes its positions itself."""
    G = rollouts.num_generations
    out = torch.zeros_like(rollouts.logprobs)
    for n in range(rollouts.completion_ids.size(0)):
        inputs = processor_inputs(processor, rows()[n // G])
        length = int(rollouts.completion_mask[n].sum())
        completion = rollouts.completion_ids[n, :length][None]  # [1, t]
        prompt_len = inputs["input_ids"].size(1)
        assert inputs["input_ids"][0].tolist() == list(rollouts.prompt_ids[n // G])  # grpokit encodes the same ids
        for key in [k for k, v in inputs.items() if torch.is_tensor(v) and v.shape[:2] == (1, prompt_len)]:
            fill = torch.ones if key == "attention_mask" else torch.zeros
            inputs[key] = torch.cat([inputs[key], fill((1, length), dtype=inputs[key].dtype)], dim=1)
        inputs["input_ids"][0, prompt_len:] = completion[0]
        with torch.no_grad():
            logits = model(**inputs).logits[0].float()  # [P+t, V]
        logp = torch.log_softmax(logits[prompt_len - 1 : -1], -1)  # [t, V]
        out[n, :length] = logp.gather(-1, completion[0][:, None]).squeeze(-1)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grpokit_logprobs_equal_the_models_own_forward(family):
    torch.manual_seed(0)
    model, processor, _ = FAMILIES[family]()
    model = model.float().eval()
    tokenizer = processor.tokenizer
    register_processor(tokenizer, processor)
    source = PromptSource(rows(), tokenizer, max_prompt_length=4096)
    eos = tokenizer.eos_token_id
    engine = HFRolloutEngine(model, [eos] if eos is not None else [], tokenizer.pad_token_id, torch.device("cpu"))
    G, T = 2, 5
    rollouts = engine.generate([source.ids[i] for i in range(2)], G, SamplingParams.plain(T))
    expected = own_forward(model, processor, rollouts)
    mask = rollouts.completion_mask
    assert float(((rollouts.logprobs - expected) * mask).abs().max()) < TOLERANCE, "sampler"
    batch = build_batch(model, rollouts, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        shared, _ = completion_logprobs(model, batch, 1.0)  # the prompt once per group: the tower once per prompt
    assert float(((shared - expected) * mask).abs().max()) < TOLERANCE, "shared-prompt pass"
    model.activation_checkpointing_enable()  # no KV cache: the full forward, each row with its prompt's images
    try:
        with torch.no_grad():
            full, _ = completion_logprobs(model, batch, 1.0)
    finally:
        model.activation_checkpointing_disable()
    assert float(((full - expected) * mask).abs().max()) < TOLERANCE, "full forward"


def test_paligemma_is_refused_in_one_line_loaded_or_by_path(tmp_path):
    """PaliGemma's prompt is a bidirectional prefix (token_type_ids 0) and its completion a causal suffix (1), from
    1-based positions: grpokit's sampler and learner do not reproduce that yet, so it is refused, not trained wrong."""
    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.models.vision import vision_model_class

    model, processor, _ = BUILDERS["paligemma"]()
    with pytest.raises(ValueError, match="model type 'paligemma' is not supported yet: PaliGemma's prompt attends"):
        vision_model_class(model.config)  # by path: before any weight is read
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, report_to="none")
    with pytest.raises(ValueError, match=r"^model type 'paligemma' is not supported yet: .*; use another family\.$"):
        GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                    train_dataset=rows(), processing_class=processor)  # fmt: skip
