"""The forms of TRL's values that need more than a rename (grpokit/config/trl_keys.py maps the keys): ``report_to``'s
sinks, the one warning naming the TRL keys grpokit does not act on, Accelerate's settings, a TRL key read back as
given, and LoRA's output-head check under Liger."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from grpokit.config.trl_defaults import GRPOKIT_SINKS, INTEGRATIONS
from grpokit.rollout.generation_options import _same


class TRLValueError(ValueError):
    """A TRL key whose value grpokit cannot honour (raised as a ConfigError by the config)."""


def report_sinks(value: Any) -> tuple[list, list]:
    """(grpokit sinks, TRL integrations grpokit does not write) for a ``report_to`` value.

    A list of grpokit sinks is taken as written. TRL's forms (a string, "none", "all", integration names)
    keep grpokit's console and metrics.jsonl and add tensorboard / wandb / mlflow / trackio when named ("all": when
    installed).
    A name that is neither is left in the list, for the config's check to refuse with a suggestion.
    """
    items = [value] if isinstance(value, str) else list(value or [])
    if not isinstance(value, str) and all(item in GRPOKIT_SINKS for item in items):
        return items, []
    sinks, extra = ["console", "jsonl"], []
    for item in items:
        if item == "all":
            named = ("tensorboard", "wandb", "mlflow", "trackio")
            sinks += [name for name in named if importlib.util.find_spec(name) is not None]
        elif item in GRPOKIT_SINKS or item not in (*INTEGRATIONS, "none"):
            sinks.append(item)
        elif item != "none":
            extra.append(item)
    return list(dict.fromkeys(sinks)), extra


def unused_message(unused: dict[str, Any]) -> str:
    names = ", ".join(f"{k}={v!r}" for k, v in unused.items())
    return (
        f"grpokit: these TRL settings are accepted but not acted on: {names}. "
        "grpokit's behaviour for each is in docs/from_trl.md."
    )


@dataclass
class AcceleratorConfig:
    """TRL's ``args.accelerator_config`` as read back (transformers' AcceleratorConfig fields grpokit knows).
    grpokit has no accelerate: every process reads its own batches, which is ``dispatch_batches=False``."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    gradient_accumulation_kwargs: dict | None = None


def accelerator_settings(value: Any) -> dict:
    """``accelerator_config`` (None, a dict, an AcceleratorConfig or a JSON file path) as a dict of the keys it sets
    to other than their defaults."""
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        try:
            with open(value) as f:
                value = json.load(f)
        except (OSError, ValueError) as exc:
            raise TRLValueError(f"accelerator_config={value!r} is not a readable JSON file ({exc}).") from None
    if not isinstance(value, dict) and not hasattr(value, "__dict__"):
        raise TRLValueError(
            f"accelerator_config={value!r} has the wrong type: expected a dict, an AcceleratorConfig or a JSON file."
        )
    items = value.items() if isinstance(value, dict) else vars(value).items()
    return {k: v for k, v in items if not _same(v, getattr(AcceleratorConfig, k, object()))}


def read_form(key: str, value: Any) -> Any:
    """A TRL-only key's value as TRL's trainer.args shows it (``accelerator_config`` as an object)."""
    if key == "accelerator_config":
        known = {k: v for k, v in accelerator_settings(value).items() if k in AcceleratorConfig.__dataclass_fields__}
        return AcceleratorConfig(**known)
    return value


def lora_head_check(use_liger_kernel: bool, target_modules: Any) -> None:
    """TRL's rule: ``use_liger_kernel`` computes the loss from ``lm_head.weight`` directly, so a LoRA adapter on
    ``lm_head`` would not train; refused (TRLValueError) instead of training a silently frozen head."""
    targets = [target_modules] if isinstance(target_modules, str) else list(target_modules or [])
    if use_liger_kernel and any(t == "lm_head" or str(t).endswith(".lm_head") for t in targets):
        raise TRLValueError(
            "use_liger_kernel=True fuses the LM head into the loss, which reads lm_head.weight directly: a LoRA "
            "adapter on lm_head would never train. Remove 'lm_head' from the LoRA target_modules, or set "
            "use_liger_kernel=False."
        )
