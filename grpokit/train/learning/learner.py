"""The policy update: log-probs, the run's policy loss (a registered loss type) with KL, micro-batches, clipping, AdamW.

One call to :meth:`Learner.update` consumes one generated batch: the reference pass (skipped when
beta = 0), the old-policy pass (only when num_iterations > 1; otherwise old = logp.detach(), as in
TRL), then ``num_iterations`` optimizer steps, each accumulating gradients over micro-batches.

With ``autocast_dtype`` (bf16 on CPUs with native bf16 matmul) the forward passes run under
autocast, in one region per optimizer step (each weight cast once per step), and their backward
replays the recorded dtypes; weights, gradients and AdamW stay float32 and the loss is computed
from float32 log-probs. On CPU the policy's Linears take their casts from ``Kernels.cast_linears``, opened once
per update: one cast per weight and optimizer step, shared by the old-policy pass (an optimizer step hook drops
them). The frozen reference copy keeps its Linear weights in the autocast dtype
(the same values autocast computes with; half the memory), and with ``ref_model_dtype: bfloat16`` all
its weights in bf16 (:meth:`Reference.store_in`). The update's metrics include the time
of each phase (``time/policy_logprobs``, ``time/backward``, ``time/optimizer``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from grpokit.algos.distill import TeacherTopK
from grpokit.algos.kl_control import KLController
from grpokit.algos.loss_registry import get_loss
from grpokit.algos.losses import LossSpec, policy_loss
from grpokit.algos.masked import chunk_share
from grpokit.algos.names import KL, POLICY_LOSS
from grpokit.algos.token_masks import high_entropy_mask
from grpokit.kernels import Kernels
from grpokit.machine.hardware import autocast
from grpokit.machine.precision import grad_scaler
from grpokit.system.processes import SingleProcess, is_sharded
from grpokit.train.learning.accelerator import gather_ragged
from grpokit.train.learning.batch_means import global_means, part_sums
from grpokit.train.learning.distill_term import distill_term
from grpokit.train.learning.loss_terms import LossTerms, policy_forward, warn_sequence_level
from grpokit.train.learning.policy_logprobs import Batch, batched_logprobs, completion_logprobs, completion_topk
from grpokit.train.learning.reference import Reference
from grpokit.train.learning.terms_settings import LossTermsSettings


@dataclass(frozen=True)
class LearnerSpec:
    """The learner's own settings, built once from the run's config by the composition root
    (:func:`grpokit.compose.specs.learner_spec`).

    loss: ``algos.policy_loss``'s settings (beta: the starting coefficient; 0 with kl_in_reward). beta: the KL
    coefficient (0: no reference pass); target_kl: the adaptive controller's target (None: beta stays);
    kl_horizon: its horizon. per_device_train_batch_size: rows per micro-batch; num_mini_batches and
    num_iterations: optimizer steps per generation batch (mini-batches x passes). reference_casts: the frozen
    reference may keep its Linear weights in the autocast dtype (not with reference resyncs, whose small mix-ups
    need float32); reference_in_bf16: every weight of the reference in bf16 (``ref_model_dtype: bfloat16``);
    top_entropy_quantile: the loss covers the tokens in this top quantile of entropy (1: all).
    backward_chunk_rows: rows per forward and backward pass within a micro-batch (None: the whole micro-batch); the
    loss, its normalisation and the metrics stay the micro-batch's (``algos.chunk_share``), only fewer activations
    are kept for the backward at a time. Not below the micro-batch with top_entropy_quantile < 1, whose quantile
    needs the whole micro-batch's entropies (the composition root does not choose it then).
    terms: the entropy bonus and the MoE router's loss (``train.learning.loss_terms``; off by default).
    distill_loss, distill_coef: the teacher's top-k term (forward_kl_topk, jsd) of a step given ``teacher_topk``
    (``train.learning.distill_term``).
    """

    loss: LossSpec
    loss_type: str
    temperature: float
    per_device_train_batch_size: int
    num_mini_batches: int
    num_iterations: int
    max_grad_norm: float
    beta: float
    kl_in_reward: bool
    target_kl: float | None
    kl_horizon: float
    reference_casts: bool
    reference_in_bf16: bool
    top_entropy_quantile: float
    backward_chunk_rows: int | None
    terms: LossTermsSettings
    distill_loss: str
    distill_coef: float


@dataclass(frozen=True)
class TrainingBatch:
    """One generation batch (or a mini-batch of it) as the learner trains on it: the ``batch`` layout, advantages
    [N] or [N, T], the loss mask [N, T], and the optional per-token tensors [N, T] (None: not used this run)."""

    batch: Batch
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    sampling_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    teacher_topk: TeacherTopK | None = None  # [N, T, k] ids and log-probs, [N, T] tail (distill_loss top-k terms)

    def rows(self, rows: slice) -> TrainingBatch:
        """The rows ``rows`` of every tensor (and of the batch layout)."""
        tensors = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows]
            for f in dataclasses.fields(self)
            if f.name != "batch"
        }
        return TrainingBatch(self.batch.rows(rows), **tensors)


class Learner:
    def __init__(
        self,
        model,
        reference: Reference | None,
        optimizer,
        scheduler,
        learner_spec: LearnerSpec,
        *,
        autocast_dtype: torch.dtype | None = None,
        kernels: Kernels | None = None,
        critic=None,
        procs=None,
    ):
        """``learner_spec``: the learner's settings (a :class:`LearnerSpec`, built by
        :func:`grpokit.compose.specs.learner_spec`). ``kernels``: the run's choice of kernels (default:
        chosen here for the model's device and ``autocast_dtype``). ``critic``: a ``learning.critic.Critic`` trained
        alongside (algorithms with a critic). ``procs``: the run's processes (``processes.SingleProcess`` by
        default), for the entropy quantile over every process's tokens (``top_entropy_quantile``)."""
        self.model = model
        self.critic = critic
        self.reference = reference
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.learner_spec = learner_spec
        self.procs = procs if procs is not None else SingleProcess()
        self.loss_spec = learner_spec.loss
        self.loss_kind = get_loss(learner_spec.loss_type)  # its aggregation says how micro-batch losses combine
        # beta across steps: the loss of each update uses the controller's current beta (fixed unless adaptive)
        self.kl_controller = KLController(learner_spec.beta, learner_spec.target_kl, learner_spec.kl_horizon)
        self.terms = LossTerms(learner_spec.terms, model)  # entropy bonus, router loss (TRL's entropy_coef ...)
        self._token_values: dict[str, torch.Tensor] | None = None  # update(keep_token_values=True)'s
        warn_sequence_level(
            learner_spec.loss.importance_sampling_level, learner_spec.loss_type, self.loss_kind.aggregation
        )
        self.autocast_dtype = autocast_dtype
        # fp16 autocast on CUDA: a loss scale (disabled, a pass-through, otherwise)
        self.scaler = grad_scaler(next(model.parameters()).device, autocast_dtype)
        self.kernels = (
            kernels if kernels is not None else Kernels.select(next(model.parameters()).device, autocast_dtype)
        )
        if self.kernels.cast_once_linears and hasattr(optimizer, "register_step_post_hook"):
            optimizer.register_step_post_hook(self.kernels.drop_linear_casts)  # its casts are of the old weights
        if reference is not None and reference.model is not None and not is_sharded(reference.model):
            if autocast_dtype is not None and learner_spec.reference_casts:
                # the frozen copy only runs under autocast: its Linear weights can live in the autocast dtype
                # (exactly the values autocast would use); not with ref syncs, whose small mix-ups need float32,
                # nor once FSDP has sharded it (its shards must keep the dtype they were sharded with)
                self.kernels.store_reference(reference.model)
            if learner_spec.reference_in_bf16:  # the rest of its weights too (config: it changes the numbers)
                reference.store_in(torch.bfloat16)

    def autocast(self):
        return autocast(next(self.model.parameters()).device, self.autocast_dtype)

    def reference_logprobs(self, batch: Batch) -> torch.Tensor | None:
        """[N, T] reference log-probs, or None when beta = 0."""
        if self.reference is None or self.learner_spec.beta == 0:
            return None
        with self.reference.active() as ref, self.autocast(), self.kernels.reuse_weight_casts():
            return batched_logprobs(
                ref,
                batch,
                self.learner_spec.temperature,
                self.learner_spec.per_device_train_batch_size,
                kernels=self.kernels,
            )

    def old_logprobs(self, batch: Batch) -> torch.Tensor:
        """[N, T] log-probs of the batch under the current weights, without gradient (the policy that sampled it,
        before the update)."""
        self.model.eval()
        with self.autocast(), self.kernels.reuse_weight_casts():
            out = batched_logprobs(
                self.model,
                batch,
                self.learner_spec.temperature,
                self.learner_spec.per_device_train_batch_size,
                kernels=self.kernels,
            )
        self.model.train()
        return out

    @torch.no_grad()
    def evaluation_loss(self, batch: Batch, advantages: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
        """TRL's evaluation loss: ``policy_loss`` of sampled eval completions at the current weights, on-policy
        (ratio 1), with the reference's KL term at the current beta, cut into micro-batches and combined as the
        update combines them, without gradient or step. ``advantages`` [N], ``loss_mask`` [N, T]. Returns ``loss``,
        ``entropy`` (masked mean), ``kl`` (beta > 0) and the loss's own metrics (clip ratios ...), averaged over the
        micro-batches as :meth:`update` does. One process (the model's forward runs here alone)."""
        learner_spec = self.learner_spec
        spec = (
            dataclasses.replace(self.loss_spec, beta=self.kl_controller.beta) if self.loss_spec.beta else self.loss_spec
        )
        ref_logprobs = self.reference_logprobs(batch)
        mb = learner_spec.per_device_train_batch_size
        num_micro = math.ceil(len(batch) / mb)
        num_items = loss_mask.sum().clamp(min=1.0)
        total, parts, entropies = 0.0, [], []
        self.model.eval()
        try:
            with self.autocast():
                for start in range(0, len(batch), mb):
                    rows = slice(start, start + mb)
                    logprobs, entropy = completion_logprobs(
                        self.model, batch.rows(rows), learner_spec.temperature, with_entropy=True, kernels=self.kernels
                    )
                    with torch.autocast(logprobs.device.type, enabled=False):
                        loss, m = policy_loss(
                            logprobs.float(),
                            None,
                            advantages[rows],
                            loss_mask[rows],
                            spec,
                            ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows],
                            num_items_in_batch=num_items,
                            token_mask=self._entropy_mask(entropy, loss_mask[rows]),
                        )
                    total += float(loss) / self.loss_kind.micro_batch_divisor(num_micro)
                    if self.terms.entropy.enabled:  # TRL's evaluation loss includes the bonus (no update of it)
                        h = float((entropy * loss_mask[rows]).sum() / loss_mask[rows].sum().clamp(min=1.0))
                        total -= self.terms.entropy.applied() * h / num_micro
                    parts.append(m)
                    entropies.append(entropy.float())
        finally:
            self.model.train()
        mask_sum = loss_mask.sum().clamp(min=1.0)
        metrics = {"loss": total, "entropy": float((torch.cat(entropies) * loss_mask).sum() / mask_sum)}
        for key in parts[0]:
            if key not in (POLICY_LOSS, KL):
                metrics[key] = sum(p[key] for p in parts) / len(parts)
        if KL in parts[0]:  # each part's KL is its tokens' mean: weighted by them, the batch's token mean
            tokens = [float(m.sum()) for m in loss_mask.split(mb)]
            metrics[KL] = sum(p[KL] * n for p, n in zip(parts, tokens)) / float(mask_sum)
        return metrics

    def values(self, batch: Batch) -> torch.Tensor | None:
        """[N, T] the critic's values of the batch before the update, or None without a critic."""
        return None if self.critic is None else self.critic.values(batch)

    def update(
        self,
        batch: Batch,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        *,
        old_logprobs: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | None = None,
        sampling_logprobs: torch.Tensor | None = None,
        old_values: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        keep_token_values: bool = False,
        teacher_topk: TeacherTopK | None = None,
    ) -> dict:
        """Run num_iterations x num_mini_batches optimizer steps on one generation batch. advantages [N] or [N, T]
        (per token, PPO), loss_mask [N, T]. Returns metrics: the last pass's, averaged over its mini-batches.

        Each pass cuts the batch in order into ``num_mini_batches`` mini-batches of N / num_mini_batches rows,
        one optimizer step each (TRL's ``steps_per_generation``, without its shuffle: a mini-batch keeps whole
        groups when N / num_mini_batches is a multiple of G).
        ``old_logprobs`` [N, T]: the sampling policy's log-probs, for a batch sampled by an older policy
        (async rollouts); by default they are recomputed before the first step when the batch feeds several
        optimizer steps (num_iterations or num_mini_batches > 1), else equal logp.detach().
        ``num_items_in_batch``: dapo's token denominator for the whole batch (default its completion tokens);
        each mini-batch's is that / num_mini_batches, as TRL rescales it to one optimizer step.
        ``sampling_logprobs`` [N, T]: a separate sampler's (vLLM's) log-probs; when given, each token's
        surrogate term gets its truncated importance weight (``algos.truncated_importance_weights``).
        ``old_values``, ``returns`` [N, T] (with a critic): after each policy step the critic takes one step on the
        same mini-batch (``Critic.step``; its metrics join the step's, ``time/critic`` its time).
        ``keep_token_values``: keep what the first pass computed per token for :meth:`take_token_values` (the store's
        per-token values); no other number changes.
        ``teacher_topk``: a local teacher's top-k (distill_loss forward_kl_topk or jsd): its term joins the loss
        (:func:`grpokit.train.learning.distill_term.distill_term`).
        """
        learner_spec = self.learner_spec
        if not learner_spec.kl_in_reward:  # this step's beta (kl_in_reward: the KL is in the rewards, beta 0 here)
            self.loss_spec = dataclasses.replace(self.loss_spec, beta=self.kl_controller.beta)
        minis = learner_spec.num_mini_batches
        with self.kernels.cast_linears(self.model):  # one cast of each Linear weight per step, for every pass
            if old_logprobs is None and learner_spec.num_iterations * minis > 1:
                old_logprobs = self.old_logprobs(batch)
            num_items = loss_mask.sum().clamp(min=1.0) if num_items_in_batch is None else num_items_in_batch  # dapo
            whole = TrainingBatch(
                batch,
                advantages,
                loss_mask,
                ref_logprobs=ref_logprobs,
                old_logprobs=old_logprobs,
                sampling_logprobs=sampling_logprobs,
                old_values=old_values,
                returns=returns,
                teacher_topk=None if teacher_topk is None else teacher_topk.to(loss_mask.device),
            )
            size = len(batch) // minis
            spans = [slice(j * size, (j + 1) * size) for j in range(minis)]  # each mini-batch's rows, in order
            minibatches = [whole] if minis == 1 else [whole.rows(rows) for rows in spans]
            history: list[dict] = []
            clock = {"time/policy_logprobs": 0.0, "time/backward": 0.0, "time/optimizer": 0.0}
            if self.critic is not None:
                clock["time/critic"] = 0.0
            kept: dict[str, list] | None = {"logprob": [], "entropy": [], "weight": []} if keep_token_values else None
            for iteration in range(learner_spec.num_iterations):
                for part in minibatches:
                    self.model.train()
                    last_pass = iteration == learner_spec.num_iterations - 1  # where a token is clipped, if ever
                    weights = kept["weight"] if kept is not None and last_pass else None
                    with self.kernels.reuse_weight_casts():  # one step's micro-batches share the head's cast
                        loss, parts, logprobs, entropy = self._accumulate(
                            part, num_items=num_items / minis, clock=clock, weights=weights
                        )
                    if kept is not None and iteration == 0:
                        kept["logprob"].append(logprobs)
                        kept["entropy"].append(entropy)
                    history.append(self._step(loss, parts, logprobs, entropy, part, num_items / minis, clock))
        self._token_values = None if kept is None else {name: torch.cat(parts) for name, parts in kept.items()}
        last = history[-minis:]
        mean = {key: sum(h[key] for h in last) / minis for key in last[0]}
        return mean | clock | {"nonfinite": float(any(h["nonfinite"] for h in history))}

    def _step(self, loss, parts, logprobs, entropy, part: TrainingBatch, num_items, clock: dict) -> dict:
        """The optimizer step after ``part``'s backward, then the critic's on the same rows; their metrics."""
        t0 = time.perf_counter()
        metrics = self._optimizer_step(loss, parts, logprobs, entropy, part.loss_mask)
        clock["time/optimizer"] += time.perf_counter() - t0
        if self.critic is not None:
            t0 = time.perf_counter()
            critic = self.critic.step(part.batch, part.old_values, part.returns, part.loss_mask, num_items=num_items)
            metrics |= critic | {"nonfinite": max(metrics["nonfinite"], critic["nonfinite"])}
            clock["time/critic"] += time.perf_counter() - t0
        return metrics

    def take_token_values(self) -> dict[str, torch.Tensor] | None:
        """The per-token values the last :meth:`update` kept (``keep_token_values``), then forgotten: ``logprob``
        [N, T] the learner's log-probs and ``entropy`` [N, T] as the update's first pass computed them (before any
        optimizer step for the first mini-batch), ``weight`` [N, T] each token's weight in the policy term in the last
        pass (``algos.losses.token_weights``: 0 clipped or masked; with num_iterations > 1 the pass that clips);
        None when none were kept."""
        values, self._token_values = self._token_values, None
        return values

    def _accumulate(self, part: TrainingBatch, *, num_items, clock: dict, weights: list | None = None):
        """Forward and backward over the micro-batches of ``part`` (each in chunks of ``backward_chunk_rows`` rows),
        gradients summed; (loss, per-micro-batch metrics, logprobs [N, T], entropy [N, T]). ``weights``: a list the
        chunks' per-token loss weights [n, T] are appended to (None: not computed)."""
        mb = self.learner_spec.per_device_train_batch_size
        chunk = min(self.learner_spec.backward_chunk_rows or mb, mb)
        num_micro = math.ceil(len(part.batch) / mb)
        parts: list[dict] = []
        logprob_parts, entropy_parts = [], []
        loss_total = 0.0
        no_autocast = torch.autocast(next(self.model.parameters()).device.type, enabled=False)
        # One autocast region around all micro-batches: autocast keeps its casts of trainable weights
        # until its outermost region ends, so each weight is cast once per optimizer step instead of once
        # per micro-batch. The loss and the backward run with autocast off inside it, as they would
        # outside. Not under FSDP, whose gathered weights are new tensors at every forward.
        with self.autocast() if not is_sharded(self.model) else contextlib.nullcontext():
            for start in range(0, len(part.batch), mb):
                micro = part.rows(slice(start, start + mb))
                chunks = []  # (metrics, loss share, metric weight) of each chunk
                for first in range(0, len(micro.batch), chunk):
                    piece = micro if chunk >= len(micro.batch) else micro.rows(slice(first, first + chunk))
                    loss, metrics, logprobs, entropy, extra = self._chunk_loss(
                        piece, num_items, clock, micro.loss_mask, weights
                    )
                    share, weight = self._chunk_weights(piece.loss_mask, micro.loss_mask, num_items)
                    scaled = loss * share / self.loss_kind.micro_batch_divisor(num_micro)
                    if extra is not None:  # the entropy bonus and router loss: per micro-batch / accumulation steps
                        scaled = scaled + extra / num_micro
                    t1 = time.perf_counter()
                    with no_autocast:
                        self.scaler.scale(scaled).backward()
                    clock["time/backward"] += time.perf_counter() - t1
                    loss_total += float(scaled.detach())
                    chunks.append((metrics, share, weight))
                    logprob_parts.append(logprobs.detach().float())
                    entropy_parts.append(entropy.detach().float())
                parts.append(_combine_chunks(chunks))
        return loss_total, parts, torch.cat(logprob_parts), torch.cat(entropy_parts)

    def _chunk_loss(
        self, piece: TrainingBatch, num_items, clock: dict, micro_mask: torch.Tensor, weights: list | None = None
    ):
        """The policy's forward over ``piece``'s rows (of a micro-batch of loss mask ``micro_mask``) and their loss
        as if they were the micro-batch: (loss, metrics, logprobs [n, T], entropy [n, T], the extra terms' share of
        the micro-batch's objective or None)."""
        learner_spec = self.learner_spec
        t0 = time.perf_counter()
        aux = student_topk = None
        at = None if piece.teacher_topk is None else piece.teacher_topk.ids
        with self.autocast():
            if self.terms.active:  # entropy with its gradient, the router's loss
                logprobs, entropy, aux, student_topk = policy_forward(
                    self.model,
                    piece.batch,
                    learner_spec.temperature,
                    self.kernels,
                    router_aux=self.terms.aux_enabled,
                    at=at,
                )
            else:
                logprobs, entropy, student_topk = completion_topk(
                    self.model, piece.batch, learner_spec.temperature, at, with_entropy=True, kernels=self.kernels
                )
        token_mask = self._entropy_mask(entropy, piece.loss_mask)
        with torch.autocast(logprobs.device.type, enabled=False):
            loss, metrics = policy_loss(
                logprobs.float(),
                piece.old_logprobs,
                piece.advantages,
                piece.loss_mask,
                self.loss_spec,
                ref_logprobs=piece.ref_logprobs,
                num_items_in_batch=num_items,
                sampling_logprobs=piece.sampling_logprobs,
                token_mask=token_mask,
                weights_out=weights,
            )
            extra = None
            if self.terms.active:  # the bonus acts on the tokens the loss acts on (top_entropy_quantile's too)
                acting = piece.loss_mask if token_mask is None else piece.loss_mask * token_mask
                whole = piece.loss_mask.shape[0] == micro_mask.shape[0]
                extra, more = self.terms.micro_batch_term(
                    entropy.float(),
                    acting,
                    acting.sum() if whole else micro_mask.sum(),
                    aux,
                    piece.loss_mask.shape[0] / micro_mask.shape[0],
                )
                metrics = metrics | more
            if student_topk is not None:  # the teacher's top-k term: a token mean over the micro-batch's tokens
                whole = piece.loss_mask.shape[0] == micro_mask.shape[0]
                term, more = distill_term(
                    learner_spec.distill_loss,
                    learner_spec.distill_coef,
                    piece.teacher_topk,
                    student_topk,
                    piece.loss_mask,
                    piece.loss_mask.sum() if whole else micro_mask.sum(),
                )
                extra, metrics = term if extra is None else extra + term, metrics | more
        clock["time/policy_logprobs"] += time.perf_counter() - t0
        return loss, metrics, logprobs, entropy, extra

    def _chunk_weights(self, chunk_mask: torch.Tensor, micro_mask: torch.Tensor, num_items) -> tuple[float, float]:
        """(loss share, metric weight) of a chunk of a micro-batch: its loss's weight in the micro-batch's
        (``algos.chunk_share``, 1 for the whole), and its metrics' (the chunk's share of the micro-batch's tokens, of
        its sequences at sequence level, as ``PolicyTerms.batch_mean`` averages them)."""
        if chunk_mask.shape[0] == micro_mask.shape[0]:
            return 1.0, 1.0
        share = chunk_share(self.loss_kind.aggregation, chunk_mask, micro_mask, num_items_in_batch=num_items)
        if self.loss_spec.importance_sampling_level == "sequence":
            return share, chunk_mask.shape[0] / micro_mask.shape[0]
        return share, float(chunk_mask.sum()) / max(float(micro_mask.sum()), 1.0)

    def _entropy_mask(self, entropy: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor | None:
        """[mb, T] the micro-batch's tokens in the top ``top_entropy_quantile`` of its entropies (over every
        process's tokens of this micro-batch, as TRL), or None when the option is off (1.0)."""
        quantile = self.learner_spec.top_entropy_quantile
        if quantile >= 1.0:
            return None
        gather = (lambda values: gather_ragged(self.procs, values)) if self.procs.enabled else None
        return high_entropy_mask(entropy.detach().float(), loss_mask, 1.0 - quantile, gather)

    def _optimizer_step(self, loss, parts, logprobs, entropy, loss_mask) -> dict:
        """Clip, check finiteness, step. Metrics of the iteration."""
        learner_spec = self.learner_spec
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is not None and p.grad.is_sparse:  # an untied embedding (see kernels/sparse_embedding.py)
                p.grad = p.grad.to_dense()
        max_norm = learner_spec.max_grad_norm if learner_spec.max_grad_norm > 0 else float("inf")
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        grad_norm = float(
            grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        )  # FSDP: a DTensor
        # under a GradScaler an overflowed step is its own to skip (it then lowers the scale), not a failed one
        nonfinite = not (math.isfinite(loss) and (math.isfinite(grad_norm) or self.scaler.is_enabled()))
        lr = self.scheduler.get_last_lr()[0]
        if not nonfinite:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        # kl (max_kl stops on it), the clipped fractions, the entropy: the global batch's means (batch_means.py)
        micro = loss_mask.split(learner_spec.per_device_train_batch_size)
        level = self.loss_spec.importance_sampling_level
        sums = part_sums(parts, [float(m.sum()) for m in micro], [float(m.shape[0]) for m in micro], level)
        count = float(loss_mask.sum())
        sums["entropy"] = (float((entropy * loss_mask).sum()), count, 1.0)
        sums["completion_logprob_mean"] = (float((logprobs * loss_mask).sum()), count, 1.0)
        means = global_means(sums, self.procs)
        metrics = self.terms.end_optimizer_step(self.procs) | means
        metrics |= {"loss": loss, "grad_norm": grad_norm, "learning_rate": lr, "nonfinite": float(nonfinite)}
        for key in parts[0]:  # the loss's other metrics are micro-batch means: averaged
            if key != POLICY_LOSS and key not in means:
                metrics[key] = sum(p[key] for p in parts) / len(parts)
        # batch-normalised parts (dapo's) share the batch-wide denominator, so they add up; the others are means
        policy = sum(p[POLICY_LOSS] for p in parts)
        metrics[POLICY_LOSS] = policy / self.loss_kind.micro_batch_divisor(len(parts))
        if KL in means:
            metrics["kl_penalty"] = self.loss_spec.beta * means[KL]
        return metrics


def _combine_chunks(chunks: list[tuple[dict, float, float]]) -> dict:
    """One micro-batch's loss metrics from its chunks' (metrics, loss share, metric weight): the policy loss adds up
    by the loss shares, the other metrics (means over tokens or sequences) by their weights."""
    if len(chunks) == 1:
        return chunks[0][0]
    return {
        key: sum(m[key] * (share if key == POLICY_LOSS else weight) for m, share, weight in chunks)
        for key in chunks[0][0]
    }


@dataclass(frozen=True)
class UpdateInputsSpec:
    """How a step's rollouts become the learner's inputs: ``mask_truncated_completions``; ``ratio_to_sampler``:
    the rollouts come from an older policy (one-step-off rollouts), so the ratio is taken against their sampling
    log-probs; ``importance_weights``: a separate sampler (vLLM) whose log-probs weight each token
    (``vllm_importance_sampling_correction``). Chosen once by the composition root from the rollout source and
    the engine."""

    mask_truncated_completions: bool
    ratio_to_sampler: bool = False
    importance_weights: bool = False


@dataclass(frozen=True)
class UpdateInputs:
    """loss_mask [N, T]; old_logprobs [N, T] or None (recomputed by the learner when it needs them);
    sampling_logprobs [N, T] or None (no importance weights)."""

    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    sampling_logprobs: torch.Tensor | None = None


def update_inputs(spec: UpdateInputsSpec, rollouts, device: torch.device) -> UpdateInputs:
    """The :class:`UpdateInputs` of a step's rollouts for :meth:`Learner.update`. The loss mask is the completion
    mask, without truncated completions under ``mask_truncated_completions``; for multi-turn rollouts only the
    tokens the model sampled (``rollouts.loss_mask``): tool results and template tokens get no policy loss and no
    KL, and do not count in any loss type's token normalisation (TRL's ``completion_mask * tool_mask``). Async
    rollouts come from an older policy: the ratio is taken against their sampling log-probs. vLLM's log-probs
    differ from the learner's for the same weights: they weight tokens (truncated importance sampling,
    ``vllm_importance_sampling_correction``), never replace old_logprobs."""
    loss_mask = rollouts.completion_mask.to(device)  # [N, T]
    if rollouts.loss_mask is not None:  # multi-turn: the model's own tokens only
        loss_mask = loss_mask * rollouts.loss_mask.to(device)
    if spec.mask_truncated_completions:
        loss_mask = loss_mask * (~rollouts.truncated).to(device)[:, None].float()
    old_logprobs = rollouts.logprobs.to(device) if spec.ratio_to_sampler else None
    sampling_logprobs = rollouts.logprobs.to(device) if spec.importance_weights else None
    return UpdateInputs(loss_mask, old_logprobs, sampling_logprobs)
