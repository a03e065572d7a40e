"""Tiny random-init models and tokenizers built locally (no hub), for tests, examples and benchmarks."""

from __future__ import annotations

from pathlib import Path

import torch

VLLM_HEAD_DIM = 32  # the narrowest attention head vLLM's CPU build runs (the defaults here give 16)


def build_word_tokenizer(words: list[str]):
    """A word-level ``PreTrainedTokenizerFast`` (whitespace split) over ``words`` plus pad/bos/eos/unk (ids 0-3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for w in words:
        vocab.setdefault(w, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def build_tiny_causal_lm(
    path: str | Path | None = None,
    tokenizer=None,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    head_dim: int | None = None,
):
    """A random-init causal LM (``llama``, ``qwen2`` or ``gpt2``) sized for ``tokenizer``.

    ``head_dim``: the attention heads' width (llama and qwen2; None = hidden_size / num_heads, 16 with the
    defaults). vLLM's CPU attention needs at least 32: ``head_dim=32`` (see :data:`VLLM_HEAD_DIM`).

    Saved with ``save_pretrained`` (model and tokenizer) when ``path`` is given, so the real
    ``from_pretrained`` path can be exercised on it.
    """
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    if tokenizer is None:
        tokenizer = build_word_tokenizer([f"w{i}" for i in range(60)])
    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )
    if arch == "gpt2":
        config = GPT2Config(
            n_embd=hidden_size, n_layer=num_layers, n_head=num_heads, n_positions=max_positions, **common
        )
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
        config = cls(
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads or num_heads,
            intermediate_size=intermediate_size or 4 * hidden_size,
            max_position_embeddings=max_positions,
            **common,
            **({} if head_dim is None else {"head_dim": head_dim}),
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer


def build_tiny_reward_model(path: str | Path | None, tokenizer, hidden_size: int = 32, seed: int = 0):
    """A random-init one-layer ``LlamaForSequenceClassification`` with one output (a reward model as TRL loads one:
    ``num_labels=1``) sized for ``tokenizer``, saved with it to ``path`` when given; returns (model, tokenizer)."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer


class TinyGPT(torch.nn.Module):
    """A nanoGPT-style custom module: ``forward(input_ids) -> logits [B, L, V]``, no HF machinery."""

    def __init__(self, vocab_size: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, max_len: int = 256):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, d_model)
        self.pos = torch.nn.Embedding(max_len, d_model)
        layer = torch.nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        L = input_ids.size(1)
        x = self.tok(input_ids) + self.pos(torch.arange(L, device=input_ids.device))  # [B, L, D]
        causal = torch.nn.Transformer.generate_square_subsequent_mask(L, device=input_ids.device)
        return self.head(self.blocks(x, mask=causal, is_causal=True))  # [B, L, V]
