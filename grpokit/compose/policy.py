"""Building the policy: the model (path, hub id or module) and its tokenizer on their device, LoRA / QLoRA
adapters, dropout off, gradient checkpointing."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from grpokit.config import ConfigError, GRPOConfig
from grpokit.machine.hardware import pick_device, pick_dtype, slow_dtype_warning
from grpokit.machine.precision import choose_precision, enable_tf32, low_precision_weights_warning
from grpokit.models.loading import is_hf_model, load_model, load_tokenizer, lora_config
from grpokit.models.vision import (
    freeze,
    is_processor,
    is_vision_model,
    language_model_linears,
    register_processor,
)


def warn_if_too_big(args: GRPOConfig, path: str) -> None:
    """Warn when a model given by path or hub id will not fit (its size is known before it is loaded)."""
    import os

    from grpokit.compose.memory import memory_warning

    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    warning = memory_warning(args, path, pick_device(args.device), processes=processes)
    if warning:
        warnings.warn(f"grpokit: {warning}", stacklevel=3)


def fsdp_load_device(args: GRPOConfig) -> torch.device | None:
    """Under torchrun with FSDP: rank 0 loads on the CPU, the others on the meta device (sharding fills them from
    rank 0: ``distributed.fsdp.initial_placement``); None otherwise."""
    import os

    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world_size <= 1:
        return None  # one process never imports grpokit.distributed
    from grpokit.algos.algorithms import get_algorithm
    from grpokit.distributed.fsdp import initial_placement

    plain = not args.load_in_4bit and args.lora.r == 0 and not get_algorithm(args.algorithm).uses_critic
    return initial_placement(strategy=args.strategy, world_size=world_size, rank=rank, plain_load=plain)


def build_policy(model: Any, tokenizer: Any, args: GRPOConfig, peft_config: Any = None):
    """(model in train mode on its device, tokenizer, device, uses_lora). ``peft_config``: a peft LoraConfig
    used as given (its settings are in ``args.lora`` too, see :func:`lora_settings`)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    slow = slow_dtype_warning(args.dtype, device)
    if slow:
        warnings.warn(f"grpokit: {slow}", stacklevel=3)
    lossy = low_precision_weights_warning(args.dtype, full_fine_tuning=args.lora.r == 0 and not args.load_in_4bit)
    if lossy:
        warnings.warn(f"grpokit: {lossy}", stacklevel=3)
    enable_tf32(choose_precision(args.dtype, device))
    model = model if model is not None else args.model_name_or_path
    if model is None:
        raise ConfigError("no model: pass model=... to GRPOTrainer or set model.model_name_or_path in the config.")
    if args.load_in_4bit and not isinstance(model, str):
        raise ConfigError(
            "load_in_4bit quantises the model while loading it: give its path or hub id (model.model_name_or_path), "
            "not a loaded module."
        )
    if is_processor(tokenizer):  # TRL's processing_class=processor: its tokenizer, the processor registered with it
        register_processor(tokenizer.tokenizer, tokenizer)
        tokenizer = tokenizer.tokenizer
    if isinstance(model, str):
        name = model
        model = load_model(name, dtype, fsdp_load_device(args) or device, args.trust_remote_code, args.load_in_4bit)
        if tokenizer is None:
            source = args.tokenizer_name_or_path or name
            tokenizer = load_tokenizer(source, args.trust_remote_code, vision=is_vision_model(model))
    elif isinstance(model, torch.nn.Module):
        model = model.to(device=device, dtype=dtype if args.dtype != "auto" else None)
    else:
        raise ConfigError(f"model has type {type(model).__name__}; give a path, a hub id or a torch.nn.Module.")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, args.trust_remote_code)
    if tokenizer is None and args.tokenizer_name_or_path:
        tokenizer = load_tokenizer(args.tokenizer_name_or_path, args.trust_remote_code)
    loaded_from = getattr(getattr(model, "config", None), "_name_or_path", None)
    if tokenizer is None and is_hf_model(model) and loaded_from:  # as TRL: the tokenizer the model was loaded with
        tokenizer = load_tokenizer(loaded_from, args.trust_remote_code, vision=is_vision_model(model))
    if tokenizer is None:
        raise ConfigError(
            "no tokenizer: pass tokenizer=... (an HF tokenizer or any object with encode/decode and eos_token_id)."
        )
    if is_vision_model(model):
        try:
            freeze(model, args)  # freeze_vision_tower, freeze_projector
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    use_lora = args.lora.r > 0
    if use_lora:
        torch.manual_seed(args.seed)  # the adapters' random init (lora_A) follows the seed, not whatever ran before
        model = apply_lora(model, args, peft_config)
    if args.disable_dropout:  # TRL's: no dropout in the policy (nor in its reference copy, made from it)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    if args.gradient_checkpointing and not args.load_in_4bit:  # QLoRA's preparation has enabled it already
        # transformers 5 renamed gradient_checkpointing_enable (kept as a deprecated alias)
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is not None:
            enable()
    model.train()
    return model, tokenizer, device, use_lora


def apply_lora(model: torch.nn.Module, args: GRPOConfig, peft_config: Any = None) -> torch.nn.Module:
    """Wrap the policy with peft LoRA adapters (Hu et al. 2021): only the adapters train.

    With ``load_in_4bit`` the 4-bit base is first prepared as in QLoRA (peft's
    ``prepare_model_for_kbit_training``: norms in float32, inputs that carry gradients).
    The reference policy is this same model with its adapters disabled (see reference.py).
    """
    try:
        from peft import get_peft_model, prepare_model_for_kbit_training
    except ImportError:
        raise ImportError("lora.r > 0 needs peft: pip install 'grpokit[lora]'.") from None
    if not is_hf_model(model):
        raise ConfigError(
            "LoRA (lora.r > 0) is supported for Hugging Face models; for a custom module, train it fully (lora.r: 0)."
        )
    if args.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    if peft_config is None:
        peft_config = lora_config(args.lora)
        if is_vision_model(model) and args.lora.target_modules == "all-linear":  # the language model's, not the tower's
            peft_config.target_modules = language_model_linears(model)
    return get_peft_model(model, _causal_lm(peft_config))


def lora_settings(peft_config: Any) -> dict:
    """grpokit's ``lora`` section for a peft ``LoraConfig`` (TRL's ``peft_config=``)."""
    if type(peft_config).__name__ != "LoraConfig" or not hasattr(peft_config, "r"):
        raise ConfigError(
            f"peft_config is a {type(peft_config).__name__}; grpokit trains LoRA adapters: pass a peft.LoraConfig."
        )
    targets = peft_config.target_modules
    if isinstance(targets, (set, frozenset, tuple)):
        targets = sorted(targets)
    return {
        "r": peft_config.r,
        "alpha": peft_config.lora_alpha,
        "dropout": peft_config.lora_dropout,
        "target_modules": targets,
    }


def _causal_lm(peft_config: Any):
    """A copy of ``peft_config`` with task_type CAUSAL_LM when it has none (TRL sets it the same way)."""
    import copy

    if peft_config.task_type is not None:
        return peft_config
    peft_config = copy.deepcopy(peft_config)
    peft_config.task_type = "CAUSAL_LM"
    return peft_config
