"""A sparse gradient for the token embedding during the learner's forward and backward."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def sparse_embedding_grad(decoder: torch.nn.Module):
    """Make the decoder's token embedding give a sparse gradient (rows of the tokens seen) while inside.

    The dense gradient of an embedding lookup is a zero-filled [V, H] tensor per call (two calls per
    micro-batch with a shared prefix); the sparse one holds the looked-up rows only. A tied LM head adds
    its dense gradient to it in place; an untied embedding's sparse gradient is made dense once per
    optimizer step by the learner, before clipping. Frozen and already-sparse embeddings are left alone.
    """
    embedding = decoder.get_input_embeddings() if hasattr(decoder, "get_input_embeddings") else None
    if not isinstance(embedding, torch.nn.Embedding) or not embedding.weight.requires_grad or embedding.sparse:
        yield
        return
    embedding.sparse = True
    try:
        yield
    finally:
        embedding.sparse = False
