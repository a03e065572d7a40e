"""A character-level GPT for SMILES, written as plain PyTorch (nanoGPT style), and its pre-training.

grpokit trains this module as it is: it only needs ``forward(input_ids) -> logits [B, L, V]``.
The model knows nothing about grpokit, attention masks or KV caches.

Pre-training is maximum likelihood on ``^SMILES$`` strings (teacher forcing). The result is cached
in a folder keyed by a hash of the recipe, so a second run of the example skips it.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model

from grpokit.data.smiles import BOS, EOS, SmilesTokenizer
from grpokit.system.cached_folders import cached_folder


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    """Longest sequence (prompt + completion) the model sees."""
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 4


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each with a residual."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # 3 x [B, L, D]
        q, k, v = (t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D/H]
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, L, D/H]
        x = x + self.proj(attn.transpose(1, 2).reshape(B, L, D))
        return x + self.mlp(self.ln2(x))


class CharGPT(torch.nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, a final norm and a tied LM head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok = torch.nn.Embedding(config.vocab_size, config.d_model)
        self.pos = torch.nn.Embedding(config.block_size, config.d_model)
        self.blocks = torch.nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln = torch.nn.LayerNorm(config.d_model)
        # GPT-2 initialisation: with N(0, 1) embeddings the tied head would start with logits of std ~sqrt(d_model).
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        L = input_ids.size(1)
        if L > self.config.block_size:
            raise ValueError(f"sequence of {L} tokens is longer than block_size={self.config.block_size}")
        x = self.tok(input_ids) + self.pos(torch.arange(L, device=input_ids.device))  # [B, L, D]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T  # [B, L, V]


@dataclass(frozen=True)
class PretrainConfig:
    d_model: int = 96
    n_layers: int = 3
    n_heads: int = 4
    block_size: int = 64
    steps: int = 2000
    batch_size: int = 64
    learning_rate: float = 2e-3
    seed: int = 0


def pretrain(smiles: list[str], config: PretrainConfig, log=print) -> tuple[CharGPT, SmilesTokenizer]:
    """Maximum likelihood on ``^s$`` for random batches of ``smiles``; linear warmup then cosine decay."""
    tokenizer = SmilesTokenizer.from_smiles(smiles)
    torch.manual_seed(config.seed)
    model = CharGPT(GPTConfig(len(tokenizer), config.block_size, config.d_model, config.n_layers, config.n_heads))
    encoded = [tokenizer.encode(BOS + s + EOS) for s in smiles if len(s) + 2 <= config.block_size]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / config.steps))
    )
    rng = random.Random(config.seed)
    model.train()
    start = time.perf_counter()
    for step in range(config.steps):
        rows = [encoded[rng.randrange(len(encoded))] for _ in range(config.batch_size)]
        width = max(len(r) for r in rows)
        batch = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # [B, W]
        targets = batch[:, 1:].masked_fill(batch[:, 1:] == tokenizer.pad_token_id, -100)  # pads carry no loss
        logits = model(batch[:, :-1])  # [B, W-1, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if log and (step % 250 == 0 or step == config.steps - 1):
            log(f"pretrain step {step + 1}/{config.steps}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    return model, tokenizer


def load_or_pretrain(
    smiles: list[str], config: PretrainConfig, cache_dir: str | Path, log=print
) -> tuple[CharGPT, SmilesTokenizer, Path]:
    """The pre-trained model from ``cache_dir/chargpt-<hash>``, training and saving it first if missing.

    The hash covers the recipe and the data, so changing either builds a new model; an interrupted build is never
    taken as complete (:func:`grpokit.system.cached_folders.cached_folder`).
    """
    recipe = {"config": asdict(config), "data": hashlib.sha256("\n".join(smiles).encode()).hexdigest()}

    def build(folder: Path) -> None:
        model, tokenizer = pretrain(smiles, config, log)
        save_model(model, str(folder / "model.safetensors"))
        tokenizer.save_pretrained(folder)

    folder = cached_folder(cache_dir, "chargpt", recipe, build)
    tokenizer = SmilesTokenizer.from_pretrained(folder)
    model = CharGPT(GPTConfig(len(tokenizer), config.block_size, config.d_model, config.n_layers, config.n_heads))
    load_model(model, str(folder / "model.safetensors"))
    return model.eval(), tokenizer, folder
