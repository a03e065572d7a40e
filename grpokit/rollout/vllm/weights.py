"""The learner's weights into vLLM, through vLLM's supported reload path, and the check that they arrived.

- :func:`vllm_weight_items`: (name, tensor) pairs under the plain Hugging Face model's names. With LoRA the
  merged weight of each adapted layer is built out of place, ``W + delta`` (delta = B A x scaling of the
  active adapters, the rule of ``kernels/fused_decoder.py``): the base weights are never written, so a bf16
  base (and with it the reference, the base with adapters off) cannot drift over syncs, as peft's
  ``merge_adapter`` / ``unmerge_adapter`` round trip does in bf16.
- :func:`push_weights`: ``llm.collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)``
  (vLLM's in-place reload: its loader, post-load processing such as the CPU build's weight packing, and its
  missing-weight check), then :func:`repack_tied_head` in vLLM's model (a head tied to the input embeddings is
  not itself loaded, so a packed copy of it would stay stale), then ``reset_prefix_cache()``.
- :func:`sync_gap_warning`: the learner's and vLLM's log-probs of the sampled tokens
  (``sampling_is/logprob_abs_diff``) against what a correct sync gives; a warning line when the gap says the
  weights did not arrive.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def _lora_weight(module: torch.nn.Module, base: torch.Tensor) -> torch.Tensor:
    """The weight a peft LoRA layer computes with, out of place: ``base`` plus its active adapters' deltas
    (none when merged already, or with adapters disabled)."""
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return base
    weight = base
    for name in module.active_adapters:
        if name in module.lora_A:
            weight = weight + module.get_delta_weight(name).to(base.dtype)  # a new tensor: base is not written
    return weight


def vllm_weight_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the policy under the plain HF model's names, which vLLM's loader expects. A
    plain model's are its parameters (views, no copy). A peft model's: the LoRA factors are skipped,
    ``base_model.model.`` / ``.base_layer`` / ``modules_to_save.default.`` removed from the names, and each
    adapted layer's weight is its base weight plus the adapters' deltas, built one layer at a time. An FSDP2-sharded
    model's: each parameter all-gathered (``full_tensor``) only when the consumer asks for it, so no rank holds more
    than the parameters vLLM's loader is still buffering (collective: every rank iterates to the end, in order)."""
    peft = hasattr(model, "get_base_model")
    for name, param in model.named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP2): this parameter's whole tensor, gathered now
            tensor = tensor.full_tensor()
        if peft:
            if "lora_" in name or "original_module" in name:
                continue
            if name.endswith(".base_layer.weight"):
                owner = model.get_submodule(name.removesuffix(".base_layer.weight"))
                if hasattr(owner, "get_delta_weight"):
                    tensor = _lora_weight(owner, tensor)
            name = (
                name.removeprefix("base_model.model.")
                .replace(".base_layer", "")
                .replace("modules_to_save.default.", "")
            )
        yield name, tensor


def repack_tied_head(model: torch.nn.Module) -> int:
    """Run in vLLM's worker (``llm.apply_model``): redo the post-load processing of an LM head that shares its
    weight with the input embeddings. The reload loads the embeddings (the checkpoint has no head of its own),
    so the head's processed form, e.g. the CPU build's packed matmul weight, would keep the old values.
    Returns the number of heads re-processed (0 or 1)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = [m for m in model.modules() if type(m) is VocabParallelEmbedding]
    done = 0
    for module in model.modules():
        if isinstance(module, ParallelLMHead) and any(module.weight is e.weight for e in embeddings):
            module.quant_method.process_weights_after_loading(module)
            done += 1
    return done


@torch.no_grad()
def push_weights(llm, policy: torch.nn.Module, items=None) -> None:
    """Copy ``policy``'s weights into the colocated ``vllm.LLM`` by vLLM's own in-place reload (module
    docstring); the tensors go tensor to tensor in this process (the external launcher). ``items``: the (name,
    tensor) pairs to send instead of :func:`vllm_weight_items` of ``policy`` (e.g. counted as they stream)."""
    items = vllm_weight_items(policy) if items is None else items
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
    llm.apply_model(repack_tied_head)
    llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights


# The mean |learner - vLLM| log-prob of the sampled tokens above which a step's gap says the weights vLLM samples
# with are not the learner's. float32 on both sides: a correct sync measured <= 1.5e-6 on vLLM's CPU build, a head
# left stale 2e-4..9e-4 on a tiny model (a real model's stale weights: far more). 16-bit on either side: the
# rounding alone gives ~1e-2 (TRL's reports), so only a gap of 0.1 nats per token is called broken.
SYNC_GAP_LIMITS = {"float32": 1e-4, "16-bit": 0.1}


def sync_gap_limit(vllm_dtype: str, learner_dtype: str) -> float:
    """The largest gap a correct sync gives for these dtypes (see SYNC_GAP_LIMITS)."""
    both_fp32 = vllm_dtype == "float32" and learner_dtype == "float32"
    return SYNC_GAP_LIMITS["float32" if both_fp32 else "16-bit"]


def sync_gap_warning(step: int, gap: float | None, limit: float, metric: str = "sampling_is/logprob_abs_diff"):
    """A warning line when ``gap`` (``metric`` of ``step``) exceeds ``limit``, else None."""
    if gap is None or not gap > limit:
        return None
    return (
        f"step {step}: vLLM's log-probs of the sampled tokens differ from the learner's by {gap:.3g} per token "
        f"({metric}; a correct weight sync stays under {limit:g} here): vLLM is sampling with "
        "other weights than the learner's. Check the vLLM version against docs/vllm.md, or set generation.engine: hf."
    )


# The mean gap above which a run stops (vllm_max_logprob_gap: null). float32 on both sides: the warning's own limit,
# 1e-4, ~1000x what a correct sync gives (~1e-7): nothing but other weights moves float32 log-probs that far (a
# skipped push, a stale tied head: 2e-4 and up). Either side 16-bit: 1 nat per token, ~100x bf16's rounding (~1e-2
# on real models, TRL's reports; ~6e-4 on the tiny test model): a sampler that far from the learner has the typical
# token's importance weight exp(1) = 2.7 against the default cap of 3, so the truncated correction stops correcting.
SYNC_GAP_STOPS = {"float32": 1e-4, "16-bit": 1.0}


class SyncGapError(RuntimeError):
    """vLLM samples with other weights than the learner's: the run stops (one line naming the engine's path)."""


class SyncGapCheck:
    """The check of a vLLM engine's weight sync on each step's ``sampling_is/logprob_abs_diff``: ``warning`` once
    above the dtypes' limit (:func:`sync_gap_limit`), ``stop`` (SyncGapError) above ``max_gap`` (None: by dtype,
    SYNC_GAP_STOPS). ``path`` names the engine in both lines (``colocated vLLM``, ``vLLM server URL`` ...). ``metric``:
    the step's metric read (sampling ahead: a gap measured against a copy at the sampling version instead)."""

    def __init__(self, path: str, vllm_dtype: str, learner_dtype: str, max_gap: float | None = None):
        self.path = path
        self.limit = sync_gap_limit(vllm_dtype, learner_dtype)
        both_fp32 = vllm_dtype == "float32" and learner_dtype == "float32"
        self.max_gap = max_gap if max_gap is not None else SYNC_GAP_STOPS["float32" if both_fp32 else "16-bit"]
        self._warned = False
        self.metric = "sampling_is/logprob_abs_diff"

    def warning(self, step: int, metrics: dict) -> str | None:
        if self._warned:
            return None
        message = sync_gap_warning(step, metrics.get(self.metric), self.limit, self.metric)
        self._warned = message is not None
        return message and f"{self.path}: {message}"

    def stop(self, step: int, metrics: dict) -> None:
        gap = metrics.get(self.metric)
        if gap is not None and gap > self.max_gap:
            raise SyncGapError(
                f"step {step}: {self.path} samples with other weights than the learner's: its log-probs of the "
                f"sampled tokens differ from the learner's by {gap:.3g} per token ({self.metric}), "
                f"above vllm_max_logprob_gap={self.max_gap:g}; the weight sync is broken (docs/vllm.md, 'The check "
                "of the sync'). Check the vLLM version and the server's flags, or set generation.engine: hf."
            )
