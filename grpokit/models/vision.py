"""Vision-language models: loading one with its processor (without torchvision), its parts (vision tower, projector,
language model), freezing them, and the processor a run's tokenizer came with.

``model_name_or_path`` may name any ``AutoModelForImageTextToText`` (or ``AutoModelForVision2Seq``) model: its config
has a ``vision_config``. Its processor is ``AutoProcessor``'s; where that needs torchvision (transformers' Qwen2-VL
processors check a video processor through it), the processor is built from the PIL image processor and the tokenizer
with no video processor (:func:`make_processor`): grpokit trains on images, never on videos.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from grpokit.models.vision_settings import VisionModelSettings

# a run's tokenizer -> the processor it came with (the prompts' images are encoded by it: grpokit.data.images)
_PROCESSORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

TOWER_NAMES = ("visual", "vision_tower", "vision_model")
PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector", "merger")


def is_vision_config(config: Any) -> bool:
    """Whether an HF config is a vision-language model's (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def is_vision_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (an HF model, a peft wrapper of one, or DDP/FSDP around them) is a vision-language model."""
    inner = getattr(model, "module", model)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return is_vision_config(getattr(base, "config", None))


def is_processor(value: Any) -> bool:
    """Whether ``value`` is a multimodal processor (TRL's ``processing_class=processor``), not a tokenizer."""
    return hasattr(value, "tokenizer") and hasattr(value, "image_processor")


def register_processor(tokenizer: Any, processor: Any) -> None:
    """Remember that ``tokenizer`` is ``processor``'s: prompts with images are encoded through it."""
    _PROCESSORS[tokenizer] = processor


def processor_of(tokenizer: Any) -> Any:
    """The processor registered for ``tokenizer``, or None (a text-only run)."""
    try:
        return _PROCESSORS.get(tokenizer)
    except TypeError:  # not weak-referenceable: a plain tokenizer object of a custom model
        return None


def vision_model_class(config: Any):
    """The transformers auto class that builds a vision-language model of ``config``, or a one-line refusal."""
    import transformers

    for name in ("AutoModelForImageTextToText", "AutoModelForVision2Seq"):
        auto = getattr(transformers, name, None)
        if auto is not None and type(config) in auto._model_mapping:
            return auto
    raise ValueError(
        f"model type {config.model_type!r} has a vision tower but neither AutoModelForImageTextToText nor "
        "AutoModelForVision2Seq knows it in this transformers; upgrade transformers or give a loaded model."
    )


def make_processor(model_type: str, image_processor: Any, tokenizer: Any, chat_template: str | None = None):
    """The processor class transformers names for ``model_type``, built from an image processor and a tokenizer with
    no video processor: transformers checks each part's class, and a video processor's class needs torchvision, so
    the check is skipped for the parts left out (None)."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise ValueError(
            f"transformers has no processor class for model type {model_type!r}; pass processing_class= a processor."
        )
    without_video = type(cls.__name__, (cls,), {"check_argument_for_proper_class": _check_unless_none})
    parts = {"image_processor": image_processor, "tokenizer": tokenizer}
    extra = {a: None for a in cls.get_attributes() if a not in parts}
    template = chat_template or getattr(tokenizer, "chat_template", None)
    return without_video(**parts, **extra, chat_template=template)


def _check_unless_none(self, name: str, value: Any):
    return None if value is None else super(type(self), self).check_argument_for_proper_class(name, value)


def load_processor(source: str, trust_remote_code: bool = False):
    """``AutoProcessor`` of a local folder or hub id; without torchvision, the same processor built from its image
    processor (the PIL one) and tokenizer (:func:`make_processor`). One error line when neither can be built."""
    from transformers import AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (ImportError, ValueError, AttributeError, TypeError, OSError) as first:
        try:
            image_processor = AutoImageProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
            return make_processor(config.model_type, image_processor, tokenizer)
        except (ImportError, ValueError, AttributeError, TypeError, OSError) as second:
            raise ValueError(
                f"cannot build the processor of {source!r}: AutoProcessor failed ({_first_line(first)}) and so did "
                f"its image processor + tokenizer ({_first_line(second)}); the folder needs preprocessor_config.json "
                "and a tokenizer."
            ) from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def parts(model: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """The model's ``tower`` (vision encoder, its projector left out), ``projector`` and ``language_model``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", base)
    tower = next((getattr(inner, n) for n in TOWER_NAMES if hasattr(inner, n)), None)
    projector = next((getattr(inner, n) for n in PROJECTOR_NAMES if hasattr(inner, n)), None)
    if projector is None and tower is not None:  # Qwen2-VL: the merger inside the tower projects to the LM's width
        projector = next((getattr(tower, n) for n in PROJECTOR_NAMES if hasattr(tower, n)), None)
    language = getattr(inner, "language_model", None)
    return {"tower": tower, "projector": projector, "language_model": language}


def freeze(model: torch.nn.Module, settings: VisionModelSettings) -> int:
    """Freeze the vision tower (``freeze_vision_tower``, its projector left out) and the projector
    (``freeze_projector``); returns how many parameters were frozen. One error line when the model has no such part."""
    found = parts(model)
    frozen = 0
    wanted = [("tower", settings.freeze_vision_tower), ("projector", settings.freeze_projector)]
    projector_params = {id(p) for p in found["projector"].parameters()} if found["projector"] is not None else set()
    for part, on in wanted:
        if not on:
            continue
        module = found[part]
        if module is None:
            key = "freeze_vision_tower" if part == "tower" else "freeze_projector"
            raise ValueError(
                f"{key}: this model has no {part} grpokit can find ({type(model).__name__}); set it false."
            )
        for p in module.parameters():
            if part == "tower" and id(p) in projector_params:
                continue
            if p.requires_grad:
                p.requires_grad_(False)
                frozen += 1
    return frozen


def language_model_linears(model: torch.nn.Module) -> list[str]:
    """Full names of the Linear layers of the language model (LoRA's default targets on a vision-language model: the
    vision tower and the projector keep their weights, as in TRL's and verl's VLM recipes)."""
    language = parts(model)["language_model"]
    if language is None:
        raise ValueError("LoRA on a vision-language model: grpokit cannot find its language model; set target_modules.")
    inside = {id(m) for m in language.modules()}
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and id(m) in inside]


def decoder_of(base: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose ``last_hidden_state`` the LM head reads, taking the model's pixel inputs: the inner model of a
    vision-language model (its ``get_decoder()`` is the language model alone, which takes no images)."""
    if is_vision_config(getattr(base, "config", None)):
        return getattr(base, "model", None)
    return base.get_decoder() if hasattr(base, "get_decoder") else None
