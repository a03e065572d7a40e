"""Terms of the policy objective beside the policy loss, as TRL's GRPOTrainer adds them: the entropy bonus
(``entropy_coef``, static or adaptive: ``algos.entropy_bonus``) and a mixture-of-experts router's load-balancing
loss (``router_aux_loss_coef``: ``algos.router_aux``).

Both need more from the policy's forward than its log-probs: the entropy with its gradient (the fused head's is
computed without one) and the model's ``aux_loss``. While one is on, the learner's forward is :func:`policy_forward`:
the logits of the completion positions in one forward over prompt and completion, log-probs and entropy from them.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from grpokit.algos.entropy_bonus import EntropyController, mean_entropy
from grpokit.algos.level_warnings import sequence_level_warning
from grpokit.algos.router_aux import router_aux_settings, router_aux_term
from grpokit.train.learning.terms_settings import LossTermsSettings

logger = logging.getLogger(__name__)

ENTROPY_COEF = "entropy_coef"  # TRL's logged name of the coefficient (each optimizer step)
AUX_LOSS = "aux_loss"  # TRL's logged name of the router's load-balancing loss


class LossTerms:
    """The run's extra terms for ``model``: ``entropy`` (the controller; ``entropy.coef`` is TRL's ``entropy_coef``
    attribute), ``aux_coef`` and ``aux_enabled`` (TRL's ``router_aux_loss_coef`` and ``aux_loss_enabled``)."""

    def __init__(self, spec: LossTermsSettings, model: torch.nn.Module | None = None):
        self.entropy = EntropyController(
            coef=spec.entropy_coef,
            adaptive=spec.use_adaptive_entropy,
            target=spec.entropy_target,
            delta=spec.entropy_coef_delta,
            low=spec.entropy_coef_min,
            high=spec.entropy_coef_max,
        )
        config = _model_config(model)
        if config is None:
            if spec.router_aux_loss_coef:
                raise ValueError(
                    f"router_aux_loss_coef is set to {spec.router_aux_loss_coef}, but the model has no Hugging Face "
                    "config with router logits (a custom module); remove router_aux_loss_coef."
                )
            self.aux_coef, self.aux_enabled = 0.0, False
        else:
            self.aux_coef, self.aux_enabled = router_aux_settings(spec.router_aux_loss_coef, config)

    @property
    def entropy_coef(self) -> float:
        """TRL's ``trainer.entropy_coef``: the bonus's coefficient now (adaptive control moves it)."""
        return self.entropy.coef

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's ``trainer.aux_loss_enabled``: whether the router's load-balancing loss is in the objective."""
        return self.aux_enabled

    @property
    def active(self) -> bool:
        """Whether any term is on (the learner then runs :func:`policy_forward`)."""
        return self.entropy.enabled or self.aux_enabled

    def micro_batch_term(self, entropy, mask, micro_tokens, aux_loss, rows_share: float):
        """(the terms' share of a micro-batch's objective, before the division by the accumulation steps; metrics).

        ``entropy`` [n, T] with its gradient and ``mask`` [n, T] the tokens the loss acts on, for ``n`` rows of a
        micro-batch of ``micro_tokens`` such tokens; ``aux_loss`` the router loss of these rows' forward (None: off);
        ``rows_share`` their share of the micro-batch's rows (1 for the whole)."""
        term = entropy.new_zeros(())
        metrics = {}
        if self.entropy.enabled:
            term = term - self.entropy.applied() * mean_entropy(entropy, mask, micro_tokens)
            self.entropy.observe(float((entropy.detach() * mask).sum()), float(mask.sum()))
        if self.aux_enabled and aux_loss is not None:
            term = term + router_aux_term(aux_loss.float(), self.aux_coef, 1) * rows_share
            metrics[AUX_LOSS] = float(aux_loss.detach())
        return term, metrics

    def end_optimizer_step(self, procs) -> dict:
        """The adaptive update at the end of an optimizer step, over every process's tokens; {entropy_coef} when
        the bonus is on."""
        if not self.entropy.enabled:
            return {}

        def reduce(values):
            return procs.sum(torch.tensor(values, dtype=torch.float64)).tolist()

        return {ENTROPY_COEF: self.entropy.step(reduce if procs.enabled else None)}


def _model_config(model):
    """The Hugging Face config of ``model`` (under peft, DDP or FSDP wrappers), or None for a custom module."""
    seen = model
    for _ in range(4):
        config = getattr(seen, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            return config
        seen = getattr(seen, "module", None) or getattr(seen, "base_model", None)
        if seen is None:
            return None
    return None


def policy_forward(model, batch, temperature: float, kernels, *, router_aux: bool, at=None):
    """(logprobs [n, T], entropy [n, T] with its gradient, the router's aux_loss or None, log-probs [n, T, k] at the
    ids ``at`` [n, T, k] or None) of ``batch``'s completion tokens at ``temperature``: one forward over prompt and
    completion (``router_aux``: asking for router logits)."""
    from grpokit.algos import entropy_from_logits, selective_logprobs
    from grpokit.train.learning.policy_logprobs import _trim_left, completion_features, full_forward_image_inputs

    T = batch.completion_ids.size(1)
    width = max(int(batch.completion_mask.sum(1).max()), 1)
    ids = batch.completion_ids[:, :width]  # [n, w]
    aux = None
    if router_aux and batch.prompt_ids is not None:
        groups, inverse = torch.unique(batch.group_index, return_inverse=True)
        prompt_ids, prompt_mask = _trim_left(batch.prompt_ids[groups], batch.prompt_mask[groups])
        if batch.prompts is not None:  # a VLM's rows: each with its prompt's images (and M-RoPE positions)
            chosen = [batch.prompts[g] for g in groups.tolist()]
            inputs = full_forward_image_inputs(model, batch, width, chosen, prompt_ids, prompt_mask)
        else:
            mask = torch.cat([prompt_mask[inverse], batch.completion_mask[:, :width].long()], dim=1)  # [n, P+w]
            inputs = {"input_ids": torch.cat([prompt_ids[inverse], ids], dim=1), "attention_mask": mask,
                      "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}  # fmt: skip
        with kernels.attention(model), kernels.mlp(model), kernels.norms(model):
            out = model(**inputs, use_cache=False, logits_to_keep=width + 1, output_router_logits=True)
        logits = out.logits[:, -(width + 1) : -1]  # [n, w, V]: position t predicts completion token t
        aux = getattr(out, "aux_loss", None)
    else:
        logits = completion_features(model, None, batch, width, kernels)  # [n, w, V]
    logprobs = selective_logprobs(logits, ids, temperature=temperature)  # [n, w]
    entropy = entropy_from_logits(logits.float(), temperature=temperature)  # [n, w], differentiable
    real = batch.completion_mask[:, :width].to(logprobs.dtype)
    picked = None
    if at is not None:
        picked = torch.log_softmax(logits.float() / temperature, -1).gather(-1, at[:, :width]) * real[..., None]
        picked = F.pad(picked, (0, 0, 0, T - width))  # [n, T, k]
    return F.pad(logprobs * real, (0, T - width)), F.pad(entropy * real, (0, T - width)), aux, picked


def warn_sequence_level(importance_sampling_level: str, loss_type: str, aggregation: str) -> None:
    """TRL's warning (logged, as TRL logs it) for sequence-level ratios under a loss that sums tokens."""
    message = sequence_level_warning(importance_sampling_level, loss_type, aggregation)
    if message is not None:
        logger.warning(message)
