"""A mixture-of-experts router's load-balancing loss in the policy objective, as TRL's GRPOTrainer adds it.

A model whose config has ``output_router_logits`` (Mixtral, Qwen2/3-MoE, GPT-OSS ...) returns its routers'
load-balancing loss (``outputs.aux_loss``, Switch Transformer's) when asked for router logits. The loss becomes

    L = L_policy + coef x aux / accumulation steps      (each micro-batch)

with coef = ``router_aux_loss_coef`` when given, else the model config's own ``router_aux_loss_coef`` (0 when it
declares none): on for every MoE model that has a coefficient, as in TRL.
"""

from __future__ import annotations

from typing import Any


def router_aux_settings(configured: float | None, model_config: Any) -> tuple[float, bool]:
    """(coef, enabled) for the model's config (its text config for a multimodal one). ``configured``: the run's
    ``router_aux_loss_coef`` (None: the model's). A coefficient for a model without router logits is an error."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    moe = text is not None and hasattr(text, "output_router_logits")
    coef = float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0) if configured is None else float(configured)
    if configured and not moe:
        raise ValueError(
            f"router_aux_loss_coef is set to {configured}, but the model is not a mixture-of-experts model that "
            "returns its router logits, so there is no auxiliary loss to weight; remove router_aux_loss_coef."
        )
    return coef, moe and coef != 0.0


def router_aux_term(aux_loss, coef: float, accumulation_steps: int):
    """coef x aux / accumulation steps: one micro-batch's share of the objective."""
    return coef * aux_loss / accumulation_steps
