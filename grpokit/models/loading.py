"""Loading policies and tokenizers, and one way to get logits from any supported model.

Two kinds of model are supported without changes to them:

* Hugging Face causal LMs (and peft-wrapped ones): called with attention_mask, position_ids,
  a KV cache and ``logits_to_keep`` so only the positions that matter reach the LM head.
* Any ``torch.nn.Module`` whose ``forward(input_ids)`` returns logits [B, L, V] (or an object with
  ``.logits``, or a tuple whose first item is the logits), with a tokenizer that has
  ``encode``/``decode`` and ``eos_token_id``: a transformers tokenizer or a plain Python object
  (``pad_token_id`` is optional, EOS pads when it is missing; ``decode`` need not take
  ``skip_special_tokens``). Such a model is sampled without a KV cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.models.lora_settings import LoraSettings
from grpokit.system.paths import expand_path


def is_hf_model(model: torch.nn.Module) -> bool:
    """True for transformers models and peft wrappers of them (they accept attention_mask and a KV cache)."""
    from transformers import PreTrainedModel

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return isinstance(base, PreTrainedModel)


def activation_checkpointing(model: torch.nn.Module) -> bool:
    """True when an HF model (or a peft wrapper of one) recomputes activations in backward."""
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return bool(checkpointing)


def logits_of(output: Any) -> torch.Tensor:
    """Logits from a model output: a tensor, a tuple whose first item is the logits, or an object with .logits."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    raise TypeError(
        f"model forward returned {type(output).__name__}; expected logits [B, L, V] or an object with .logits."
    )


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False, vision: bool = False):
    """A HF tokenizer with a pad token (EOS is used as pad when the tokenizer has none). ``vision``: the tokenizer of
    the folder's processor, registered with it (:func:`grpokit.models.vision.register_processor`)."""
    from transformers import AutoTokenizer

    if vision:
        from grpokit.models.vision import load_processor, register_processor

        processor = load_processor(model_source(name_or_path), trust_remote_code)
        ensure_pad_token(processor.tokenizer)
        register_processor(processor.tokenizer, processor)
        return processor.tokenizer

    tokenizer = _from_pretrained(
        AutoTokenizer, expand_path(name_or_path), "tokenizer", trust_remote_code=trust_remote_code
    )
    ensure_pad_token(tokenizer)
    return tokenizer


def ensure_pad_token(tokenizer) -> None:
    """Use EOS as the pad token when a tokenizer has none; pads are always masked out."""
    if getattr(tokenizer, "pad_token_id", None) is None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(
                "the tokenizer has neither a pad token nor an EOS token; add an EOS token so completions can end."
            )
        if hasattr(tokenizer, "pad_token") and getattr(tokenizer, "eos_token", None) is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            tokenizer.pad_token_id = tokenizer.eos_token_id


def load_model(
    name_or_path: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool = False,
    load_in_4bit: bool = False,
):
    """A HF causal LM from a local folder or hub id, in ``dtype`` on ``device`` (``meta``: built without weights).

    ``load_in_4bit``: the Linear layers' weights (not the LM head) quantised to 4-bit NF4 with double
    quantisation, computing in ``dtype`` (QLoRA, Dettmers et al. 2023), through bitsandbytes, on CUDA or CPU.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit.models.vision import is_vision_config, vision_model_class

    source = model_source(name_or_path)
    config = _from_pretrained(AutoConfig, source, "model", trust_remote_code=trust_remote_code)
    # a vision-language model: AutoModelForImageTextToText (grpokit.models.vision)
    auto_class = vision_model_class(config) if is_vision_config(config) else AutoModelForCausalLM
    if device.type == "meta":  # the architecture only, no weights read (FSDP's other ranks: distributed/fsdp.py)
        with torch.device("meta"):
            return auto_class.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    if not load_in_4bit:
        model = _from_pretrained(auto_class, source, "model", dtype=dtype, trust_remote_code=trust_remote_code)
        return model.to(device)
    # quantised weights cannot be moved with .to(): they are placed on the device while loading
    model = _from_pretrained(
        auto_class,
        source,
        "model",
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        quantization_config=four_bit_config(dtype),
        device_map={"": device},
    )
    keep_4bit_layout(model)
    return model


def model_source(name_or_path: str) -> str:
    """A local folder (``~`` and variables expanded; it must exist) or a hub id, as ``from_pretrained`` takes it."""
    local = Path(expand_path(name_or_path))
    looks_local = name_or_path.startswith((".", "/", "~", "$")) or local.exists()
    if looks_local and not local.is_dir():
        raise FileNotFoundError(
            f"model path {name_or_path!r} does not exist; give a local model folder or a hub id such as "
            "'Qwen/Qwen2.5-0.5B'."
        )
    return str(local) if looks_local else name_or_path


def model_config(name_or_path: str, trust_remote_code: bool = False):
    """The HF config of a local folder or hub id (no weights read)."""
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, model_source(name_or_path), "model config", trust_remote_code=trust_remote_code)


def _from_pretrained(cls, source: str, what: str, **kwargs):
    """``cls.from_pretrained`` with one clear message when the folder or hub id cannot be read (a typo, no network,
    HF_HUB_OFFLINE without the files cached, a gated repo, a folder without config.json) instead of a transformers
    traceback, within seconds when the hub cannot be reached (:func:`grpokit.models.hub.from_pretrained`)."""
    from grpokit.models.hub import from_pretrained

    return from_pretrained(cls, source, what, **kwargs)


# bitsandbytes runs Linear4bit on CPU from this version on
MIN_BITSANDBYTES = "0.48"


def lora_config(lora: LoraSettings):
    """peft's LoraConfig for the config's ``lora`` section (a causal LM's adapters)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def four_bit_config(dtype: torch.dtype):
    """The ``BitsAndBytesConfig`` of QLoRA: NF4 weights, double quantisation, ``dtype`` compute."""
    from packaging.version import Version

    try:
        import bitsandbytes
    except ImportError:
        raise ImportError("load_in_4bit needs bitsandbytes: pip install 'grpokit[qlora]'.") from None
    if Version(bitsandbytes.__version__) < Version(MIN_BITSANDBYTES):
        raise ImportError(
            f"load_in_4bit needs bitsandbytes >= {MIN_BITSANDBYTES} (4-bit layers on CPU and CUDA), "
            f"but {bitsandbytes.__version__} is installed: pip install -U 'grpokit[qlora]'."
        )
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )


def keep_4bit_layout(model: torch.nn.Module) -> int:
    """Keep ``model``'s bitsandbytes 4-bit layers on their training layout; returns how many there are.

    On CPUs with AVX512-BF16, a Linear4bit called in eval mode without gradients (as in sampling) rewrites
    its weight in place into a CPU-only packed layout and from then on multiplies with a bf16 kernel that has
    no backward, whatever the mode: the adapters below it get no gradient, silently, and the numbers differ
    from those of the training pass. With this off, every call dequantises the NF4 weight and runs
    ``F.linear`` in the compute dtype, in training as in sampling.
    """
    from bitsandbytes.nn import Linear4bit

    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt. A chat template already holds BOS, so no special tokens are added then."""
    if callable(tokenizer) and hasattr(tokenizer, "pad_token_id") and hasattr(tokenizer, "convert_ids_to_tokens"):
        return tokenizer(text, add_special_tokens=not chat)["input_ids"]
    return list(tokenizer.encode(text))


def decode(tokenizer, ids: list[int]) -> str:
    """Text of completion ids (special tokens dropped for HF tokenizers)."""
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:
        return tokenizer.decode(ids)


def eos_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids = [getattr(tokenizer, "eos_token_id", None)]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += extra if isinstance(extra, list) else [extra]
    found = sorted({int(i) for i in ids if i is not None})
    if not found:
        raise ValueError("no EOS token: the tokenizer has no eos_token_id; set one so completions can stop.")
    return found
