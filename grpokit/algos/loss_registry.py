"""Policy losses by name (``loss_type``): what each computes per token and how it is normalised.

A loss is a function ``(terms, spec) -> (per_token [N, T] or [N, 1], metrics)`` of one micro-batch's
``losses.PolicyTerms`` (log-probs, importance ratio, advantages, mask) and the run's ``losses.LossSpec``.
:func:`register_loss` files it under a name with its *aggregation* (how ``masked.aggregate`` turns the
per-token values into one number, one of ``names.AGGREGATIONS``), which also says how the learner combines
micro-batches: a batch-normalised aggregation (``dapo``'s, divided by the generation batch's token count)
adds them up, the others are micro-batch means the learner averages. ``losses.policy_loss`` adds what every
loss shares (the off-policy and entropy masks, vLLM's importance weights, the KL term).

The config's ``loss_type`` values are this registry's names, so a new loss is one module with one
``@register_loss`` (and, for a user, the module named in ``algo.imports``); nothing else lists them.
Importing this module loads no torch (the config validates names with it): the built-in losses import
torch inside their functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from grpokit.algos.names import AGGREGATIONS, BATCH_NORMALISED
from grpokit.system.registry import Registry

# (terms: losses.PolicyTerms, spec: losses.LossSpec) -> (per-token loss tensor, metrics); not imported here, since
# losses.py imports this module
PerTokenLoss = Callable[[Any, Any], tuple[Any, dict[str, float]]]


@dataclass(frozen=True)
class LossSettings:
    """What a loss's ``check`` sees: the settings every policy loss shares, and ``params``, this loss's own
    parameters (an instance of the dataclass it registered, or None). Never the whole config."""

    loss_type: str
    epsilon: float
    epsilon_high: float | None
    importance_sampling_level: str
    params: Any = None


def _no_advice(settings: LossSettings) -> list[str]:
    return []


@dataclass(frozen=True)
class PolicyLossType:
    """A registered loss.

    name: its ``loss_type``. per_token: ``(terms, spec) -> (per-token loss [N, T] or [N, 1], metrics)``.
    aggregation: one of ``names.AGGREGATIONS``, used for the policy term and the KL term (and PPO's value loss).
    weighs_sampling_itself: the loss folds vLLM's importance weights (``terms.sampling_weights``) into its own
    weight, so ``policy_loss`` does not multiply its per-token loss by them (vespo).
    check: ``settings -> advice`` (``settings``: a :class:`LossSettings`): raises ValueError for settings the loss
    cannot run with (one line naming the fix); returns lines of advice for settings that run but are likely not what
    was meant (the config warns).
    params: the loss's own parameter dataclass (its fields are config keys, each with its default), or None.
    clipped: ``(terms, spec) -> bool [N, T] or [N, 1]``, the tokens the loss clips (no gradient), for the per-token
    loss weight ``losses.policy_loss`` can report (the report's Tokens view); None: a loss that clips none.
    """

    name: str
    per_token: PerTokenLoss
    aggregation: str
    weighs_sampling_itself: bool = False
    check: Callable[[LossSettings], list[str]] = _no_advice
    params: type | None = None
    clipped: Callable[[Any, Any], Any] | None = None

    def make_params(self, values: Mapping[str, Any]) -> Any:
        """This loss's parameters from ``values`` (a mapping of config keys; the missing ones keep their
        defaults), or None for a loss without parameters."""
        if self.params is None:
            return None
        return self.params(**{f.name: values[f.name] for f in fields(self.params) if f.name in values})

    @property
    def batch_normalised(self) -> bool:
        """Each micro-batch's loss is already divided by the whole generation batch's token count, so the
        micro-batches' losses add up to the batch's (otherwise each is its own micro-batch's mean)."""
        return self.aggregation in BATCH_NORMALISED

    def micro_batch_divisor(self, num_micro: int) -> int:
        """What the sum of ``num_micro`` micro-batch losses (or policy-loss metrics) is divided by for the
        batch's: 1 when batch-normalised, else ``num_micro`` (their mean)."""
        return 1 if self.batch_normalised else num_micro


def _loss_entry(
    name: str,
    fn: PerTokenLoss,
    *,
    aggregation: str,
    weighs_sampling_itself: bool = False,
    check: Callable[[LossSettings], list[str]] | None = None,
    params: type | None = None,
    clipped: Callable[[Any, Any], Any] | None = None,
) -> PolicyLossType:
    """The entry of ``fn(terms, spec) -> (per_token, metrics)`` as ``loss_type: name``.

    ``aggregation``: how the per-token loss becomes one number (``names.AGGREGATIONS``: grpo = mean over sequences
    of each one's token mean, bnpo = token mean of the micro-batch, dapo = token sum / tokens of the generation batch,
    dr_grpo = token sum / (N * max_completion_length), luspo = mean over sequences of each one's token sum).
    ``check``, ``params`` (the loss's own parameter dataclass), ``clipped``: see :class:`PolicyLossType`."""
    return PolicyLossType(name, fn, aggregation, weighs_sampling_itself, check or _no_advice, params, clipped)


def _loss_fields(aggregation: str, **fields: Any) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; valid choices: {', '.join(AGGREGATIONS)}")


LOSSES = Registry("loss_type", entry=_loss_entry, fields=_loss_fields)
# ``@register_loss(name, aggregation=...)``: the registry's decorator (fields: :func:`_loss_entry`'s); registering a
# name twice with different functions is refused, unless it is the same function again (its module imported anew).
register_loss = LOSSES.register


# The modules of the built-in losses, which register them when imported (on the first look-up, in this order).
BUILT_IN = ("clipped", "cispo", "sapo", "luspo", "vespo")


def loss_types() -> tuple[str, ...]:
    """The registered ``loss_type`` names: the built-ins in the order of :data:`BUILT_IN`, their modules (whichever
    was imported first), then the others in the order they were registered."""
    for module in BUILT_IN:
        importlib.import_module(f"grpokit.algos.{module}")
    place = {f"grpokit.algos.{module}": i for i, module in enumerate(BUILT_IN)}
    return tuple(sorted(LOSSES, key=lambda name: place.get(LOSSES[name].per_token.__module__, len(place))))


def get_loss(name: str) -> PolicyLossType:
    """The loss registered as ``name``; a ValueError listing the names otherwise."""
    return LOSSES.entry(name, list(loss_types()))
