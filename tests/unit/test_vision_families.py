"""Per-family log-prob parity: for every VLM family transformers builds here tiny, offline and without torchvision,
grpokit's per-token log-probs (its sampler's, the learner's shared-prompt pass with the vision tower once per
prompt, and its full forward) equal the model's own forward over each row, given the processor's own inputs for the
prompt (``processor.apply_chat_template(..., tokenize=True)``, as TRL builds them) with the completion appended, in
float32, to 1e-5; PaliGemma (1 and 2) also against its own generate (greedy tokens, position ids)."""

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
    **BUILDERS,
}
# per-token inputs whose completion value is not text's 0: PaliGemma's generate appends token_type_ids 1 (its causal
# suffix; transformers' PaliGemmaForConditionalGeneration._update_model_kwargs_for_generation), as its processor does
# for a ``suffix=``
COMPLETION_VALUES = {"paligemma": {"token_type_ids": 1}}


def rows(texts: tuple[str, str] = ("What is this?", "What is this?")) -> list[dict]:
    """Two one-image conversational prompts, pictures of different sizes and colours."""
    pictures = [Image.new("RGB", (40, 30), (200, 10, 10)), Image.new("RGB", (36, 52), (10, 10, 200))]
    return [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
         "images": [p]}
        for p, text in zip(pictures, texts)
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


def own_forward(model, processor, rollouts, prompts: list[dict]) -> torch.Tensor:
    """[N, T] log-probs from the model's forward over each row: the processor's inputs for its prompt (pixel values
    and all, repeated per completion as TRL does) with the completion appended; per-token inputs (token type ids)
    continue as text (0), or as COMPLETION_VALUES says; the model computes its positions itself (PaliGemma's from 1)."""
    G = rollouts.num_generations
    values = COMPLETION_VALUES.get(model.config.model_type, {})
    out = torch.zeros_like(rollouts.logprobs)
    for n in range(rollouts.completion_ids.size(0)):
        inputs = processor_inputs(processor, prompts[n // G])
        inputs.pop("labels", None)  # PaliGemma's processor adds training labels
        length = int(rollouts.completion_mask[n].sum())
        completion = rollouts.completion_ids[n, :length][None]  # [1, t]
        prompt_len = inputs["input_ids"].size(1)
        assert inputs["input_ids"][0].tolist() == list(rollouts.prompt_ids[n // G])  # grpokit encodes the same ids
        for key in [k for k, v in inputs.items() if torch.is_tensor(v) and v.shape[:2] == (1, prompt_len)]:
            fill = 1 if key == "attention_mask" else values.get(key, 0)
            inputs[key] = torch.cat([inputs[key], torch.full((1, length), fill, dtype=inputs[key].dtype)], dim=1)
        inputs["input_ids"][0, prompt_len:] = completion[0]
        with torch.no_grad():
            logits = model(**inputs).logits[0].float()  # [P+t, V]
        logp = torch.log_softmax(logits[prompt_len - 1 : -1], -1)  # [t, V]
        out[n, :length] = logp.gather(-1, completion[0][:, None]).squeeze(-1)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grpokit_logprobs_equal_the_models_own_forward(family):
    check_parity(family, rows())


@pytest.mark.parametrize("family", ["paligemma", "paligemma2"])
def test_paligemma_left_padded_prompts(family):
    """Prompts of different lengths: the shorter is left-padded (its padding, token type 0, is masked out of the
    bidirectional prefix), its positions still start at 1."""
    rollouts = check_parity(family, rows(("What is this?", "What is this? red blue red")))
    assert len(rollouts.prompt_ids[1]) == len(rollouts.prompt_ids[0]) + 3


def check_parity(family: str, prompts: list[dict]):
    """The sampler's, the shared-prompt pass's and the full forward's log-probs equal ``own_forward``'s."""
    torch.manual_seed(0)
    model, processor, _ = FAMILIES[family]()
    model = model.float().eval()
    tokenizer = processor.tokenizer
    register_processor(tokenizer, processor)
    source = PromptSource(prompts, tokenizer, max_prompt_length=4096)
    eos = tokenizer.eos_token_id
    engine = HFRolloutEngine(model, [eos] if eos is not None else [], tokenizer.pad_token_id, torch.device("cpu"))
    G, T = 2, 5
    rollouts = engine.generate([source.ids[i] for i in range(2)], G, SamplingParams.plain(T))
    expected = own_forward(model, processor, rollouts, prompts)
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
    return rollouts


@pytest.mark.parametrize("family", ["paligemma", "paligemma2"])
def test_paligemma_greedy_tokens_and_positions_equal_its_generate(family):
    """PaliGemma's generate reads positions from 1 and appends token_type_ids 1 (a causal suffix after the prompt's
    bidirectional prefix): grpokit's greedy sampler picks the same tokens, hands the language model the same position
    ids call by call (RoPE alone would not tell 0- from 1-based positions apart: it sees only their differences), and
    its log-probs are the model's own forward's (types 1 over the completion)."""
    torch.manual_seed(0)
    model, processor, _ = FAMILIES[family]()
    model = model.float().eval()
    tokenizer = processor.tokenizer
    register_processor(tokenizer, processor)
    seen = []  # the position ids of each call of the language model
    model.model.language_model.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs["position_ids"].flatten().tolist()), with_kwargs=True
    )
    T, image = 6, tokenizer.convert_tokens_to_ids("<image>")
    source = PromptSource(rows()[:1], tokenizer, max_prompt_length=4096)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))
    rollouts = engine.generate([source.ids[0]], 1, SamplingParams.plain(T, greedy=True))
    ours, seen[:] = list(seen), []
    inputs = processor_inputs(processor, rows()[0])
    inputs.pop("labels")
    P = inputs["input_ids"].size(1)
    with torch.no_grad():
        generated = model.generate(**inputs, do_sample=False, max_new_tokens=T, suppress_tokens=[image])[0, P:]
    length = int(rollouts.completion_mask[0].sum())
    assert rollouts.completion_ids[0, :length].tolist() == generated[:length].tolist()
    assert seen[0] == list(range(1, P + 1)) and ours == seen[: len(ours)]  # 1 .. P, then P + 1, P + 2 ...
    expected = own_forward(model, processor, rollouts, rows()[:1])
    assert float(((rollouts.logprobs - expected) * rollouts.completion_mask).abs().max()) < TOLERANCE


def test_paligemma_text_only_prompt_positions_start_at_1():
    """A PaliGemma prompt without an image (plain token ids, no token types: causal throughout, as its forward without
    token_type_ids): the sampler, the shared-prompt pass and the full forward still pass positions from 1."""
    torch.manual_seed(0)
    model, processor, _ = FAMILIES["paligemma"]()
    model = model.float().eval()
    tokenizer = processor.tokenizer
    register_processor(tokenizer, processor)
    seen = []  # the first row's position ids at each call of the language model
    model.model.language_model.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs["position_ids"][0].tolist()), with_kwargs=True
    )
    chat = [{"role": "user", "content": "What is this?"}]
    source = PromptSource([{"prompt": chat}], tokenizer, max_prompt_length=100)
    P = len(source.ids[0])
    engine = HFRolloutEngine(model, [], tokenizer.pad_token_id, torch.device("cpu"))
    rollouts = engine.generate([source.ids[0]], 2, SamplingParams.plain(3))  # no EOS: 3 tokens each
    assert seen == [list(range(1, P + 1)), [P + 1], [P + 2]]
    batch = build_batch(model, rollouts, tokenizer.pad_token_id, torch.device("cpu"))
    seen.clear()
    with torch.no_grad():
        completion_logprobs(model, batch, 1.0)
    # the prompt once, then its completions on its cache (before them: the kernels' one-off check of the LM head)
    assert seen[-2:] == [list(range(1, P + 1)), [P + 1, P + 2]]
    model.activation_checkpointing_enable()
    seen.clear()
    try:
        with torch.no_grad():
            completion_logprobs(model, batch, 1.0)
    finally:
        model.activation_checkpointing_disable()
    assert seen[-1] == list(range(1, P + 4))  # prompt and completion in one forward
