"""PPO's critic in training: the value model (``train/learning/value_model.py``), its own AdamW and LR schedule.

The learner asks it for the values of a generated batch before the update (``values``, no gradient: the
old values of the clipped value loss and GAE's V) and gives it one optimizer step per policy mini-batch
(``step``: micro-batches of ``per_device_train_batch_size`` rows, ``value_loss`` x vf_coef aggregated as the
run's ``loss_type`` aggregates (its registry entry, ``algos.loss_registry``), gradients clipped to
``max_grad_norm``). Its weights, optimizer and schedule are saved in checkpoints (``state``) and restored on
resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algos.loss_registry import get_loss
from grpokit.algos.value import value_loss
from grpokit.errors import ConfigError
from grpokit.kernels import Kernels
from grpokit.machine.hardware import autocast
from grpokit.machine.precision import grad_scaler
from grpokit.train.learning.optimizer import make_optimizer, make_schedule
from grpokit.train.learning.optimizer_settings import OptimizerSettings
from grpokit.train.learning.policy_logprobs import Batch
from grpokit.train.learning.value_model import ValueModel


@dataclass(frozen=True)
class CriticSpec:
    """The critic's own settings, each field the config key of its name (filled by
    ``grpokit.compose.specs.part_settings``; ``CriticSettings``, ``UpdateSettings`` ... own them) but three the
    composition root derives: ``optim`` (the policy's optimizer settings, the 8-bit AdamW included), ``total_steps``
    (the run's optimizer steps, which the schedule spans) and ``lora``.

    The value loss: ``cliprange_value``, ``vf_coef``, aggregated by ``loss_type`` (``max_completion_length``:
    dr_grpo's constant); micro-batches of ``per_device_train_batch_size`` rows; gradients clipped to
    ``max_grad_norm`` (0: off). Built from ``value_model_name_or_path`` (None: a copy of the policy's trunk),
    with LoRA adapters on its trunk when ``lora`` is given (the run trains LoRA), trained by ``optim``'s optimizer
    and schedule at ``critic_learning_rate`` (None: optim's)."""

    per_device_train_batch_size: int
    cliprange_value: float
    vf_coef: float
    loss_type: str
    max_completion_length: int
    max_grad_norm: float
    critic_learning_rate: float | None
    value_model_name_or_path: str | None
    trust_remote_code: bool
    optim: OptimizerSettings
    total_steps: int
    lora: Any = None  # the lora section (peft's settings), or None


class Critic:
    """``model``: the ValueModel; ``optimizer`` and ``scheduler`` its own; ``spec`` its :class:`CriticSpec`."""

    def __init__(self, model: ValueModel, optimizer, scheduler, spec: CriticSpec, autocast_dtype=None, kernels=None):
        self.model, self.optimizer, self.scheduler, self.spec = model, optimizer, scheduler, spec
        self.device = model.head.weight.device
        self.autocast_dtype = autocast_dtype
        self.scaler = grad_scaler(self.device, autocast_dtype)  # fp16 autocast on CUDA only
        self.kernels = kernels if kernels is not None else Kernels.select(self.device, autocast_dtype)
        self.loss_kind = get_loss(spec.loss_type)  # the policy loss's aggregation, and how its micro-batches combine

    @classmethod
    def build(
        cls, policy: torch.nn.Module, spec: CriticSpec, *, device: torch.device, dtype, autocast_dtype, kernels
    ) -> Critic:
        """The critic of a run: on a copy of ``policy``'s trunk, or ``value_model_name_or_path``; LoRA adapters
        on its trunk when the run trains LoRA; AdamW at the critic's learning rate with the policy's schedule."""
        try:
            if spec.value_model_name_or_path:
                model = ValueModel.from_pretrained(spec.value_model_name_or_path, dtype, device, spec.trust_remote_code)
            else:
                model = ValueModel.from_policy(policy)
        except ValueError as exc:
            raise ConfigError(
                f"algorithm: ppo: {exc}. The critic needs a Hugging Face model: give one as the policy or as "
                "value_model_name_or_path."
            ) from None
        if spec.lora is not None:
            from grpokit.models.loading import lora_config

            config = lora_config(spec.lora)
            config.task_type = "FEATURE_EXTRACTION"  # the trunk returns hidden states
            model.add_lora(config)
        else:
            model.requires_grad_(True)  # a trunk copied from a LoRA policy comes frozen
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, spec.optim, device, spec.critic_learning_rate)
        scheduler = make_schedule(optimizer, spec.optim, spec.total_steps)
        return cls(model, optimizer, scheduler, spec, autocast_dtype, kernels)

    def values(self, batch: Batch) -> torch.Tensor:
        """[N, T] float32 values of the batch's completion tokens, 0 at padding, without gradient."""
        rows = self.spec.per_device_train_batch_size
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.autocast_dtype):
            out = [self.model(batch.rows(slice(i, i + rows)), self.kernels) for i in range(0, len(batch), rows)]
        self.model.train()
        return torch.cat(out)  # [N, T]

    def step(
        self, batch: Batch, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *, num_items
    ) -> dict[str, float]:
        """One optimizer step on a mini-batch: the clipped value loss x vf_coef over its micro-batches.
        Metrics: value_loss (before vf_coef, the micro-batches' mean, dapo's parts summed), value_clip_frac,
        critic/grad_norm, critic/learning_rate, and nonfinite (the step was skipped)."""
        spec = self.spec
        mb = spec.per_device_train_batch_size
        num_micro = math.ceil(len(batch) / mb)
        no_autocast = torch.autocast(self.device.type, enabled=False)
        total, parts = 0.0, []
        for start in range(0, len(batch), mb):
            rows = slice(start, start + mb)
            with autocast(self.device, self.autocast_dtype):
                values = self.model(batch.rows(rows), self.kernels)  # [mb, T]
            with no_autocast:
                loss, metrics = value_loss(
                    values,
                    old_values[rows],
                    returns[rows],
                    mask[rows],
                    spec.cliprange_value,
                    spec.vf_coef,
                    self.loss_kind.aggregation,
                    num_items_in_batch=num_items,
                    max_completion_length=spec.max_completion_length,
                )
                scaled = loss / self.loss_kind.micro_batch_divisor(num_micro)  # as the policy's micro-batches
                self.scaler.scale(scaled).backward()
            total += float(scaled.detach())
            parts.append(metrics)
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = spec.max_grad_norm if spec.max_grad_norm > 0 else float("inf")
        self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        nonfinite = not (math.isfinite(total) and (math.isfinite(grad_norm) or self.scaler.is_enabled()))
        lr = self.scheduler.get_last_lr()[0]
        if not nonfinite:
            self.scaler.step(self.optimizer)  # under a GradScaler: skipped on overflow, and the scale lowered
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        summed = sum(p["value_loss"] for p in parts)
        return {
            "value_loss": summed / self.loss_kind.micro_batch_divisor(len(parts)),
            "value_clip_frac": sum(p["value_clip_frac"] for p in parts) / len(parts),
            "critic/grad_norm": grad_norm,
            "critic/learning_rate": lr,
            "nonfinite": float(nonfinite),
        }

    def state(self) -> tuple[torch.nn.Module, dict]:
        """(the module whose weights a checkpoint saves, {optimizer, scheduler} states)."""
        return self.model, {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_states(self, states: dict) -> None:
        """Restore the optimizer and scheduler from :meth:`state`'s dict (the weights are loaded by the caller)."""
        self.optimizer.load_state_dict(states["optimizer"])
        self.scheduler.load_state_dict(states["scheduler"])
