"""The policy's warm start: a tiny Llama that has seen the task through a sloppy teacher.

GRPO only sharpens what a policy can already sample. The warm start therefore trains a random
Llama with teacher forcing on ``prompt -> label <eos>``, where the label is the real span with
probability ``teacher_accuracy`` and otherwise a :func:`spans.corrupt` near miss, drawn afresh each
time. The model learns the task's shape and the teacher's mistakes; the right span stays one of a
few likely answers, and the judge's reward has a signal to work with.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from spans import Text, corrupt, vocabulary

from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer


@dataclass(frozen=True)
class PolicyConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 1500
    batch_size: int = 64
    learning_rate: float = 3e-3
    teacher_accuracy: float = 0.5
    seed: int = 0


def fill_in_tokenizer():
    """Word-level tokenizer over the task's words (pad, bos, eos, unk are ids 0-3)."""
    return build_word_tokenizer(vocabulary())


def warm_start(texts: list[Text], tokenizer, config: PolicyConfig, log=print):
    """A LlamaForCausalLM trained on sloppy labels of ``texts`` (the training split); eval mode."""
    model, _ = build_tiny_causal_lm(
        None,
        tokenizer,
        arch="llama",
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        max_positions=32,
        seed=config.seed,
    )
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / config.steps)
    rng = random.Random(config.seed)
    model.train()
    start = time.perf_counter()
    for step in range(config.steps):
        rows, targets = [], []
        for _ in range(config.batch_size):
            text = texts[rng.randrange(len(texts))]
            label = text.answer if rng.random() < config.teacher_accuracy else corrupt(text, rng)
            prompt_ids = tokenizer.encode(text.prompt)
            label_ids = [*tokenizer.encode(label), eos]
            rows.append(prompt_ids + label_ids)
            targets.append([-100] * len(prompt_ids) + label_ids)  # the prompt carries no loss
        width = max(len(r) for r in rows)
        # right padding needs no attention mask under causal attention: pads come after every real token
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log and (step % 200 == 0 or step == config.steps - 1):
            log(
                f"policy warm start step {step + 1}/{config.steps}  loss {loss.item():.3f}  "
                f"{time.perf_counter() - start:.0f}s"
            )
    return model.eval()
