"""The warm start: a tiny Qwen2-VL that sees the square's colour but is sloppy about naming it.

GRPO only sharpens what the policy already samples, and the gain shows on held-out pictures only if it sharpens
something they share (the demo's reasoning: ``examples/arithmetic/README.md``). So, as the demo's sloppy teacher:

1. ``clean_steps`` of teacher forcing on the right colour (the model learns to read the square's colour);
2. ``sloppy_steps`` on a teacher that names the right colour with probability ``teacher_accuracy`` and otherwise
   the next one in the list (red -> green, ..., cyan -> red), drawn afresh each time a picture is seen.

The policy then names the right colour about a third of the time, and the wrong answers are one habit shared by
every picture, which GRPO switches off. Every step draws fresh pictures (``task.pictures``) from a seed separate
from the train and eval splits. Training is single-threaded (see ``grpokit/demo/warmstart.py``).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from task import NAMES, QUESTION, SIDE, WORDS, next_colour, pictures

from grpokit.models.vision import make_processor
from grpokit.testing.tiny_vlm import build_tiny_qwen2_vl

VERSION = 1  # bump when the recipe changes in a way the config below does not show
STAMP_FILE = "grpokit_vision_example.json"
WARM_SEED_OFFSET = 10_000  # the warm start's pictures come from seeds far from the splits' (build.py: 0 and 1)


@dataclass(frozen=True)
class WarmStart:
    """Model size and supervised schedule of the warm start."""

    hidden_size: int = 64
    num_layers: int = 2
    clean_steps: int = 400
    sloppy_steps: int = 150
    batch_size: int = 64
    learning_rate: float = 3e-3
    teacher_accuracy: float = 0.3
    seed: int = 0


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, total // 20)
    return min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * step / total))


def prompt_text(processor) -> str:
    """The one prompt every picture shares, through the processor's chat template (as grpokit writes it)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    return processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=processor.tokenizer.chat_template
    )


def batch(processor, text: str, images: list, labels: list[str]) -> dict:
    """The model's inputs for teacher forcing ``labels`` (then eos) after the prompt; the loss is on those two."""
    tokenizer = processor.tokenizer
    encoded = processor(text=[text] * len(images), images=images, return_tensors="pt", add_special_tokens=False)
    answer = torch.tensor([[tokenizer.convert_tokens_to_ids(n), tokenizer.eos_token_id] for n in labels])
    prompt = encoded["input_ids"]  # [B, P]: the same ids on every row (one picture size, one question)
    targets = torch.cat([torch.full_like(prompt, -100), answer], 1)
    return {
        "input_ids": torch.cat([prompt, answer], 1),
        "mm_token_type_ids": torch.cat([encoded["mm_token_type_ids"], torch.zeros_like(answer)], 1),
        "pixel_values": encoded["pixel_values"],
        "image_grid_thw": encoded["image_grid_thw"],
        "labels": targets,
    }


def train(config: WarmStart, log=print):
    """(model in eval mode, processor) after the two supervised phases."""
    model, tokenizer, images = build_tiny_qwen2_vl(
        None, words=WORDS, hidden_size=config.hidden_size, num_layers=config.num_layers, image_side=SIDE,
        seed=config.seed,
    )  # fmt: skip
    processor = make_processor("qwen2_vl", images, tokenizer)
    text = prompt_text(processor)
    rng = random.Random(config.seed)
    total = config.clean_steps + config.sloppy_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total))
    model.train()
    start = time.perf_counter()
    for step in range(total):
        drawn = pictures(config.batch_size, seed=WARM_SEED_OFFSET + config.seed * total + step)
        accuracy = 1.0 if step < config.clean_steps else config.teacher_accuracy
        labels = [name if rng.random() < accuracy else next_colour(name) for _, name in drawn]
        loss = model(**batch(processor, text, [p for p, _ in drawn], labels)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log is not None and (step % 50 == 0 or step == total - 1):
            phase = "right colours" if step < config.clean_steps else "sloppy teacher"
            log(f"warm start {step + 1}/{total} ({phase})  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    return model, processor


@torch.no_grad()
def answer_shares(model, processor, count: int = 120, seed: int = 7) -> dict[str, float]:
    """Greedy-free check of a policy: on ``count`` fresh pictures, the mean probability of the right colour, of the
    habit's colour (the next one) and of anything else, for the first answer token."""
    drawn = pictures(count, seed=seed)
    inputs = batch(processor, prompt_text(processor), [p for p, _ in drawn], [n for _, n in drawn])
    inputs.pop("labels")
    width = inputs["input_ids"].shape[1] - 2
    logits = model(**inputs).logits[:, width - 1]  # [B, V]: the first answer token's distribution
    probs = logits.float().softmax(-1)
    ids = {n: processor.tokenizer.convert_tokens_to_ids(n) for n in NAMES}
    right = torch.stack([probs[i, ids[n]] for i, (_, n) in enumerate(drawn)])
    habit = torch.stack([probs[i, ids[next_colour(n)]] for i, (_, n) in enumerate(drawn)])
    return {"right": right.mean().item(), "next": habit.mean().item(), "other": 1 - (right + habit).mean().item()}


def _stamp(config: WarmStart) -> dict:
    return {"version": VERSION, "config": asdict(config)}


def ensure_policy(cache_root: Path, config: WarmStart, force: bool = False, log=print) -> Path:
    """``cache_root/vision-policy-v<VERSION>``, built (model, tokenizer, image processor, a stamp with the recipe)
    when missing, when its stamp names another recipe, or with ``force``; built beside it and renamed into place."""
    target = Path(cache_root) / f"vision-policy-v{VERSION}"
    try:
        if not force and json.loads((target / STAMP_FILE).read_text()) == _stamp(config):
            return target
    except (OSError, ValueError):
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, processor = train(config, log=log)
    finally:
        torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        model.save_pretrained(tmp)
        processor.tokenizer.save_pretrained(tmp)
        processor.image_processor.save_pretrained(tmp)
        (tmp / STAMP_FILE).write_text(json.dumps(_stamp(config), indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
