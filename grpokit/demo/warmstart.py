"""Warm start for ``grpokit demo``: a tiny model that can add but is sloppy about it.

GRPO only sharpens what a policy can already sample: a group of G completions that are all wrong
(or all right) has zero advantage and teaches nothing. A random-init model therefore needs a short
supervised phase first, and its shape decides whether GRPO then gets anywhere in a minute or two.

The recipe (measured choices in ``examples/arithmetic/README.md``):

1. ``clean_steps`` of teacher forcing on right answers, so the model computes sums crisply.
2. ``sloppy_steps`` on labels from a *sloppy teacher* that is right with probability
   ``teacher_accuracy`` and otherwise answers one too many (``23+45=69``). The label is drawn
   afresh every time an example is seen, so the model learns the teacher's habit (a single,
   prompt-independent "+1" mode on top of the right sum) rather than one wrong answer per question.

The result samples the right answer about a third of the time on held-out questions (its greedy
answer is usually the "+1" one) while the right answer stays among the few likely ones (high
pass@8). GRPO with a correctness reward only has to switch the habit off, which it does in about a
hundred steps; a policy that is weak because it is undertrained has no such shared mode to remove,
and improves far more slowly.

The model is a Llama-style decoder: its rotary positions make left-padded batches (as in batched
sampling) behave exactly like unpadded ones.

Training runs single-threaded (:func:`single_thread`): this model's matrices are too small for a
second thread to pay off, and on a busy 2-core machine two threads contend and run many times
slower (measured: 1.8 s against 0.12 s for the same GRPO step).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpokit.data.arithmetic import ALPHABET, arithmetic_splits
from grpokit.data.char_tokenizer import build_char_tokenizer
from grpokit.system.cached_folders import default_cache_root

# Bump when the recipe changes so that cached policies from older versions are rebuilt.
VERSION = 1
STAMP_FILE = "grpokit_demo.json"


@dataclass(frozen=True)
class WarmStartConfig:
    """Model size and supervised schedule of the demo's warm start (task: ``builtin:arithmetic``)."""

    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    clean_steps: int = 900
    """Optimizer steps on right answers (learn to add)."""
    sloppy_steps: int = 200
    """Optimizer steps on the sloppy teacher's labels after that (learn its habit)."""
    batch_size: int = 128
    learning_rate: float = 3e-3
    """Peak AdamW rate (linear warmup over 5 % of the steps, then cosine decay to 0)."""
    teacher_accuracy: float = 0.3
    """Probability that a sloppy label is right; otherwise it is one too many."""
    seed: int = 0
    """Seed of model init, batch order and label noise."""


@contextmanager
def single_thread():
    """Run the block with one torch intra-op thread, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_model(tokenizer, config: WarmStartConfig) -> torch.nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` sized by ``config``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=4 * config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(config.seed)
    return LlamaForCausalLM(model_config)


def sloppy_answer(answer: int, teacher_accuracy: float, rng: random.Random) -> int:
    """The sloppy teacher's label: ``answer`` with probability ``teacher_accuracy``, else ``answer + 1``."""
    return answer if rng.random() < teacher_accuracy else answer + 1


def _lr_factor(step: int, total: int) -> float:
    # Linear warmup (Adam's moment estimates settle before the high peak rate), then cosine to 0.
    warmup = max(1, total // 20)
    return min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * step / total))


def train_warm_start(config: WarmStartConfig, log=None):
    """Run the supervised phases on the train split; return (model in eval mode, tokenizer).

    Each step draws ``batch_size`` training questions and minimises the cross-entropy of
    ``label + <eos>`` given ``<bos> + prompt`` (teacher forcing; prompt tokens carry no loss).
    Batches are right-padded: under causal attention a pad after a sequence cannot affect it, so
    no attention mask is needed.
    """
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_model(tokenizer, config)
    train, _ = arithmetic_splits()
    prompt_ids = [tokenizer(row["prompt"])["input_ids"] for row in train]
    answers = [int(row["answer"]) for row in train]
    rng = random.Random(config.seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    total = config.clean_steps + config.sloppy_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total))
    model.train()
    start = time.perf_counter()
    for step in range(total):
        accuracy = 1.0 if step < config.clean_steps else config.teacher_accuracy
        rows, targets = [], []
        for _ in range(config.batch_size):
            i = rng.randrange(len(train))
            label = str(sloppy_answer(answers[i], accuracy, rng))
            label_ids = tokenizer(label, add_special_tokens=False)["input_ids"] + [eos]
            rows.append(prompt_ids[i] + label_ids)
            targets.append([-100] * len(prompt_ids[i]) + label_ids)
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # [batch, width]
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])  # [batch, width]
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log is not None and (step % 100 == 0 or step == total - 1):
            phase = "right answers" if step < config.clean_steps else "sloppy teacher"
            log(f"warm start {step + 1}/{total} ({phase})  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    return model, tokenizer


def _stamp(config: WarmStartConfig) -> dict:
    return {"version": VERSION, "config": asdict(config)}


def _is_current(folder: Path, config: WarmStartConfig) -> bool:
    try:
        return json.loads((folder / STAMP_FILE).read_text()) == _stamp(config)
    except (OSError, ValueError):
        return False


def ensure_demo_policy(
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    config: WarmStartConfig | None = None,
    log=None,
) -> Path:
    """Return the folder of the warm-started demo policy, building it first if needed.

    The folder is ``<cache_dir>/demo-policy-v<VERSION>`` (``cache_dir`` defaults to
    :func:`default_cache_root`) and holds the model and tokenizer (``save_pretrained``) plus a
    ``grpokit_demo.json`` stamp with the version and the config. It is rebuilt when ``force`` is
    set, when the stamp is missing (a partial or foreign folder) or when it names another version
    or config. The model is written to a temporary folder beside it and renamed into place, so an
    interrupted build never leaves a folder that looks complete.
    """
    config = config or WarmStartConfig()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    target = root / f"demo-policy-v{VERSION}"
    if not force and _is_current(target, config):
        return target

    root.mkdir(parents=True, exist_ok=True)
    with single_thread():
        model, tokenizer = train_warm_start(config, log=log)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / STAMP_FILE).write_text(json.dumps(_stamp(config), indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
