"""The judge: a small PyTorch sequence scorer that tells real texts from ones with a corrupted span.

It reads the text with the proposed span written into the gap (``spans.fill``) and returns one
logit per sequence: high when the text reads as a real run of the list. It is a plain
``torch.nn.Module`` whose ``forward(input_ids, attention_mask)`` returns scores [B], which is what
grpokit's built-in ``reward_model`` reward accepts (``output="sigmoid"`` turns the logit into a
score in [0, 1]); :func:`judge_reward` adds the one step the built-in does not do, filling the gap.

Training: binary cross-entropy on balanced batches of real texts (label 1) and texts whose span
is a :func:`spans.corrupt` near miss (label 0), drawn afresh at every step.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from spans import Text, corrupt, fill

from grpokit.rewards import get_reward


@dataclass(frozen=True)
class JudgeConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    steps: int = 1500
    batch_size: int = 64
    learning_rate: float = 2e-3
    seed: int = 0


class Judge(torch.nn.Module):
    """Bidirectional transformer encoder, masked mean pooling, a linear score."""

    def __init__(self, vocab_size: int, config: JudgeConfig, max_len: int = 32):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, config.d_model)
        self.pos = torch.nn.Embedding(max_len, config.d_model)
        layer = torch.nn.TransformerEncoderLayer(
            config.d_model, config.n_heads, 4 * config.d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.score = torch.nn.Linear(config.d_model, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        L = input_ids.size(1)
        x = self.tok(input_ids) + self.pos(torch.arange(L, device=input_ids.device))  # [B, L, D]
        x = self.encoder(x, src_key_padding_mask=attention_mask == 0)  # [B, L, D]
        weights = attention_mask[..., None].float()  # [B, L, 1]
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # [B, D]
        return self.score(pooled).squeeze(-1)  # [B]


def encode_batch(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and attention mask [B, L]."""
    ids = [tokenizer.encode(t) for t in texts]
    width = max(len(i) for i in ids)
    input_ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    return input_ids, mask


def labelled_batch(texts: list[Text], rng: random.Random, size: int) -> tuple[list[str], torch.Tensor]:
    """``size`` judge inputs, half real answers and half corrupted ones, with labels [size]."""
    picked = [texts[rng.randrange(len(texts))] for _ in range(size)]
    inputs = [fill(t.prompt, t.answer if i % 2 == 0 else corrupt(t, rng)) for i, t in enumerate(picked)]
    labels = torch.tensor([1.0 - i % 2 for i in range(size)])
    return inputs, labels


def train_judge(texts: list[Text], tokenizer, config: JudgeConfig, log=print) -> Judge:
    """Fit the judge on ``texts`` (the training split only); returns it frozen, in eval mode."""
    torch.manual_seed(config.seed)
    judge = Judge(len(tokenizer), config)
    optimizer = torch.optim.AdamW(judge.parameters(), lr=config.learning_rate)
    rng = random.Random(config.seed)
    start = time.perf_counter()
    for step in range(config.steps):
        inputs, labels = labelled_batch(texts, rng, config.batch_size)
        loss = F.binary_cross_entropy_with_logits(judge(*encode_batch(tokenizer, inputs)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if log and (step % 200 == 0 or step == config.steps - 1):
            log(f"judge step {step + 1}/{config.steps}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    judge.eval().requires_grad_(False)
    return judge


@torch.no_grad()
def judge_accuracy(judge: Judge, tokenizer, texts: list[Text], seed: int = 1) -> float:
    """Fraction of real texts scored > 0 and corrupted ones scored < 0, one of each per text of ``texts``."""
    rng = random.Random(seed)
    inputs = [fill(t.prompt, t.answer) for t in texts] + [fill(t.prompt, corrupt(t, rng)) for t in texts]
    labels = torch.tensor([1.0] * len(texts) + [0.0] * len(texts))
    scores = judge(*encode_batch(tokenizer, inputs))
    return float(((scores > 0).float() == labels).float().mean())


def judge_reward(model: Judge, tokenizer):
    """The GRPO reward ``judge``: sigmoid of the judge's logit on the prompt's text with the completion in the gap."""
    score = get_reward("reward_model", model=model, tokenizer=tokenizer, output="sigmoid", text="completion")

    def judge(prompts: list[str], completions: list[str], **columns) -> list[float]:
        return score(prompts, [fill(p, c) for p, c in zip(prompts, completions)])

    return judge
