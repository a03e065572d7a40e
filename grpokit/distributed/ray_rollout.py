"""Rollouts sampled by Ray actors, each holding a copy of the policy.

The learner publishes its trainable weights to the Ray object store after every update, with a
version number (optimizer steps so far); a worker loads them when the version it holds differs,
and tags its rollouts with the version that sampled them. The groups of a step are split over the
workers in contiguous chunks, and every group is sampled with its own seed
(:mod:`grpokit.rollout.seeding`), so the split does not change the rollouts.

Fault tolerance: when a worker dies, it is replaced by a new actor (which loads the chunk's
weights version) and its chunk is submitted again. Results are kept per chunk, so a chunk counts
once whatever happened to the worker that first held it.

Partial rollouts (vLLM workers, ``generation.vllm_partial_rollout_tokens``): a chunk's first S tokens are sampled
with the batch, and its continuation on the next version is launched when that version is published
(:mod:`grpokit.rollout.partial`, :mod:`grpokit.distributed.ray_partial_tails`).
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from dataclasses import dataclass

import torch

from grpokit.models.vision_inputs import for_workers, has_images, ids_only, with_driver_prompts
from grpokit.rollout.seeding import concat_rollouts, generate_per_group
from grpokit.rollout.types import Rollouts, SamplingParams


def import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("distributed.backend: ray needs Ray: pip install 'grpokit[ray]'.") from None
    return ray


def connect(address: str | None, num_cpus: int | None, learner_gpus: list[str] = ()) -> None:
    """Join the cluster at ``address`` (``auto`` = the one ``ray start --head`` made on this node), or
    start a local one with ``num_cpus`` CPUs when ``address`` is null, without the learner's GPUs
    (``learner_gpus``: :func:`grpokit.distributed.placement.learner_gpu_ids`)."""
    from grpokit.distributed.placement import without_learner_gpus

    ray = import_ray()
    if ray.is_initialized():
        return
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as exc:
            from grpokit.errors import ConfigError

            raise ConfigError(
                f"distributed.address={address!r}: no Ray cluster to join ({exc}). Start one with `ray start --head` "
                "(on every other node: `ray start --address HEAD:6379`), or set distributed.address: null to let "
                "grpokit start a local cluster."
            ) from None
    else:
        with without_learner_gpus(list(learner_gpus)) as num_gpus:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)


class RolloutWorker:
    """A Ray actor: one policy copy and a rollout engine on its own device."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        use_gpu: bool,
        autocast_dtype: torch.dtype | None = None,
        learner_gpus: tuple[str, ...] = (),
        vllm: dict | None = None,
    ):
        """``vllm``: sample with vLLM (:func:`grpokit.distributed.ray_vllm.worker_vllm_engine`'s keywords: its
        ``spec``, ``seed`` and ``threads``), else with grpokit's engine."""
        from grpokit.rollout.engine import HFRolloutEngine

        if use_gpu:
            import ray

            from grpokit.distributed.placement import check_actor_gpus

            check_actor_gpus(ray.get_gpu_ids(), list(learner_gpus))
        device = torch.device("cuda" if use_gpu else "cpu")
        if vllm is not None:  # the copy stays on the CPU: it only receives the published weights for vLLM's reload
            from grpokit.distributed.ray_vllm import worker_vllm_engine

            self.model = model
            self.engine = worker_vllm_engine(model, eos_token_ids, pad_token_id, device, autocast_dtype, **vllm)
            device = torch.device("cpu")
        else:
            self.model = model.to(device)
            # the learner's autocast dtype: the same numbers as sampling in the learner process
            self.engine = HFRolloutEngine(
                self.model, eos_token_ids, pad_token_id, device, autocast_dtype=autocast_dtype
            )
        self.device, self.pad_token_id = device, pad_token_id
        self.checks_sync = vllm is not None  # vLLM's log-probs checked against the copy's, once per version and kind
        self.checked: set[tuple[int, bool]] = set()  # (version, continued) checked so far
        self.version: int | None = None  # nothing published loaded yet

    def generate(
        self,
        weights: list,
        version: int,
        prompt_ids: list[list[int]],
        seeds: list[int],
        num_generations: int,
        params: SamplingParams,
        continued: bool = False,
    ) -> tuple[Rollouts, float | None]:
        """``weights`` is ``[ObjectRef]`` (nested, so it is fetched only when the version changed); ``continued``:
        the prompts are partial rollouts' prompts + tokens so far (:mod:`grpokit.rollout.partial`). Returns
        the rollouts and, for a vLLM worker's first chunk of each kind by a version, the gap of its log-probs against
        the copy's at that version (:func:`grpokit.distributed.ray_vllm.sync_gap`; else None)."""
        if version != self.version:
            import ray

            load_published(self.model, ray.get(weights[0]), self.device)
            self.version = version
        self.engine.policy_version = version  # vLLM: a version it does not hold loads the copy's weights first
        rollouts = generate_per_group(self.engine, prompt_ids, seeds, num_generations, params)
        if has_images(prompt_ids):  # the driver holds the prompts' pixel inputs: they do not travel back
            rollouts = dataclasses.replace(rollouts, prompt_ids=ids_only(rollouts.prompt_ids))
        if not self.checks_sync or (version, continued) in self.checked or params.greedy:
            return rollouts, None
        from grpokit.distributed.ray_vllm import sync_gap

        self.checked.add((version, continued))
        return rollouts, sync_gap(self.model, rollouts, params.temperature)

    def continue_partial(
        self, head: tuple, weights: list, version: int, seeds: list[int], tokens: int, params: SamplingParams
    ) -> tuple[Rollouts, tuple[float | None, float | None]]:
        """Partial rollouts (:mod:`grpokit.rollout.partial`): ``head`` is this chunk's :meth:`generate`
        result (its samples of at most ``tokens`` tokens; Ray resolves it from its ObjectRef), ``seeds`` its groups'
        seeds; the samples still going are continued by ``version`` (``params``: the rest of the length). Returns the
        whole chunk and the gaps of (its head, its continuations)."""
        from grpokit.rollout.partial import continue_chunk

        rollouts, head_gap = head

        def sample(prompts: list[list[int]], tail_seeds: list[int]):
            return self.generate(weights, version, prompts, tail_seeds, 1, params, continued=True)

        merged, gap = continue_chunk(rollouts, seeds, tokens, params, version, self.pad_token_id, sample)
        return merged, (head_gap, gap)

    def pid(self) -> int:
        import os

        return os.getpid()


@dataclass
class PendingRollouts:
    """A step's generation in flight: one chunk of groups per worker, and what is needed to redo one."""

    chunks: list[tuple[list[list[int]], list[int]]]  # (prompt ids, seeds) per chunk
    refs: dict  # ObjectRef -> (chunk index, worker index)
    weights: list  # [ObjectRef] of the version that samples this step
    version: int
    num_generations: int
    params: SamplingParams
    switch: int | None = None  # partial rollouts: the version that samples the tokens from ``tokens`` on
    tokens: int = 0  # partial rollouts: S, the tokens sampled by ``version``
    tails: dict | None = None  # partial rollouts: the continuations' ObjectRef -> (chunk, worker), once launched
    prompts: list | None = None  # prompts with images: the driver's own (PIL images too), put back into the rollouts

    def call(self, chunk: int) -> tuple:
        """The worker's ``generate`` arguments of ``chunk`` (partial rollouts: at most S tokens)."""
        from grpokit.rollout.partial import head_params

        prompts, seeds = self.chunks[chunk]
        params = self.params if self.switch is None else head_params(self.params, self.tokens)
        return (self.weights, self.version, prompts, seeds, self.num_generations, params)


class RayRolloutEngine:
    """Training rollouts from ``num_workers`` Ray actors; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        num_workers: int,
        worker_cpus: float = 1.0,
        worker_gpus: float = 0.0,
        autocast_dtype: torch.dtype | None = None,
        learner_gpus: list[str] = (),
        vllm: dict | None = None,
        partial: tuple[int, float] | None = None,
    ):
        """``learner_gpus``: the GPUs the learner trains on, which no worker may get
        (:mod:`grpokit.distributed.placement`); ``vllm``: each worker samples with vLLM (see :class:`RolloutWorker`);
        ``partial``: (S tokens, seconds to wait for a version): partial rollouts (:mod:`~grpokit.rollout.partial`)."""
        from grpokit.distributed.placement import actor_options
        from grpokit.distributed.ray_partial_tails import PartialTails

        ray = import_ray()
        self.pad_token_id = pad_token_id
        wanted, offered = num_workers * worker_gpus, ray.cluster_resources().get("GPU", 0)
        if wanted > offered:
            from grpokit.errors import ConfigError

            raise ConfigError(
                f"{num_workers} rollout workers x rollout_worker_gpus={worker_gpus} need {wanted:g} GPUs, but Ray has "
                f"{offered:g} besides the learner's; lower num_rollout_workers or rollout_worker_gpus."
            )
        # The architecture ships once (the driver's copy stays where it is); weights follow by version.
        self._model_ref = ray.put(_cpu_copy(model))
        self._actor = ray.remote(**actor_options(worker_cpus, worker_gpus))(RolloutWorker)
        self._worker_args = (eos_token_ids, pad_token_id, worker_gpus > 0, autocast_dtype, tuple(learner_gpus), vllm)
        self.workers = [self._spawn() for _ in range(num_workers)]
        self.restarts = 0
        self.sync_gap_max: float | None = None  # vLLM workers: the largest gap of any check so far (ray_vllm)
        self.sync_gap_continued_max: float | None = None  # of partial rollouts' continuations only
        self.tails = None if partial is None else PartialTails(*partial)
        self.version: int | None = None
        self._weights: list = []

    def _spawn(self):
        return self._actor.remote(self._model_ref, *self._worker_args)

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Put ``state`` (the trainable weights, full tensors on the CPU; see
        :func:`grpokit.distributed.torch_dist.trainable_state`) in the object store as ``version`` (partial rollouts:
        then launch the continuations that wait for it)."""
        ray = import_ray()
        self._weights = [ray.put(state)]
        self.version = version
        if self.tails is not None:
            self.tails.published(version, self._weights, self._launch_tails)

    def submit(
        self,
        prompt_ids: list[list[int]],
        seeds: list[int],
        num_generations: int,
        params: SamplingParams,
        step: int | None = None,
    ) -> PendingRollouts:
        """Start sampling with the last published weights; returns at once. ``step``: the step the batch trains
        (partial rollouts: which version continues it, :func:`~grpokit.rollout.partial.switch_version`)."""
        from grpokit.rollout.partial import switch_version

        if self.version is None:
            raise RuntimeError("publish() the policy weights before the first submit().")
        switch = None if self.tails is None or step is None else switch_version(step, self.version)
        n = len(self.workers)
        bounds = [len(prompt_ids) * w // n for w in range(n + 1)]
        # a prompt with images goes with its pixel inputs, once per group, without its PIL images (the store's, here)
        sent = [for_workers(p) for p in prompt_ids]
        chunks = [(sent[a:b], seeds[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
        tokens = 0 if switch is None else self.tails.tokens
        pending = PendingRollouts(chunks, {}, self._weights, self.version, num_generations, params, switch, tokens)
        pending.prompts = list(prompt_ids) if has_images(prompt_ids) else None
        pending.refs = {self.workers[c].generate.remote(*pending.call(c)): (c, c) for c in range(len(chunks))}
        if switch is not None:
            self.tails.admit(pending)
        return pending

    def _tail(self, pending: PendingRollouts, chunk: int, head):
        """Launch ``chunk``'s continuation on its worker, after its ``head`` (an ObjectRef of its generate)."""
        from grpokit.rollout.partial import tail_params

        weights = self.tails.weights[pending.switch]
        params = tail_params(pending.params, pending.tokens)
        seeds = pending.chunks[chunk][1]
        return self.workers[chunk].continue_partial.remote(head, weights, pending.switch, seeds, pending.tokens, params)

    def _launch_tails(self, pending: PendingRollouts) -> dict:
        return {self._tail(pending, c, head): (c, w) for head, (c, w) in pending.refs.items()}

    def _redo(self, pending: PendingRollouts, chunk: int):
        """``chunk`` again on its (new) worker: its head, then (partial rollouts) its continuation."""
        head = self.workers[chunk].generate.remote(*pending.call(chunk))
        return head if pending.switch is None else self._tail(pending, chunk, head)

    def collect(self, pending: PendingRollouts) -> Rollouts:
        """Wait for every chunk; a dead worker is replaced and its chunk re-queued (partial rollouts: the chunks'
        continuations, once the version they continue on is published)."""
        ray = import_ray()
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        refs = pending.refs
        if pending.switch is not None:
            self.tails.wait(pending)
            refs = pending.tails
        results: dict[int, Rollouts] = {}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            chunk, worker = refs.pop(ready[0])
            try:
                results[chunk], gap = ray.get(ready[0])
            except (RayActorError, ActorDiedError, ActorUnavailableError) as error:
                if died_here(error, self.workers[worker]):  # not a worker that an earlier collect replaced
                    message = f"grpokit: rollout worker {worker} died and is replaced, its chunk re-run: {why(error)}"
                    warnings.warn(message, stacklevel=2)
                    ray.kill(self.workers[worker], no_restart=True)
                    self.workers[worker] = self._spawn()
                    self.restarts += 1
                refs[self._redo(pending, chunk)] = (chunk, worker)
                continue
            self._count_gaps(gap if isinstance(gap, tuple) else (gap, None))
        if pending.switch is not None:
            self.tails.done(pending)
        rollouts = concat_rollouts([results[c] for c in range(len(pending.chunks))], self.pad_token_id)
        if pending.prompts is None:
            return rollouts
        return dataclasses.replace(rollouts, prompt_ids=with_driver_prompts(rollouts.prompt_ids, pending.prompts))

    def _count_gaps(self, gaps: tuple[float | None, float | None]) -> None:
        """A chunk's checked sync gaps: (its samples' or heads', its continuations')."""
        for k, gap in enumerate(gaps):
            if gap is not None:
                self.sync_gap_max = max(gap, self.sync_gap_max or 0.0)
                if k == 1:
                    self.sync_gap_continued_max = max(gap, self.sync_gap_continued_max or 0.0)

    def interrupt(self) -> None:
        """Stop any wait for a version (the run is ending: it may never be published)."""
        if self.tails is not None:
            self.tails.interrupt()

    def generate(
        self, prompt_ids: list[list[int]], seeds: list[int], num_generations: int, params: SamplingParams
    ) -> Rollouts:
        return self.collect(self.submit(prompt_ids, seeds, num_generations, params))

    def shutdown(self) -> None:
        ray = import_ray()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []


def died_here(error: BaseException, actor) -> bool:
    """Whether ``error`` reports the death of ``actor`` (a slot's current worker) rather than of the worker it replaced.
    Sampling ahead, one worker holds chunks of two steps; when it dies both fail, and only the first collect replaces
    it: the second re-runs its chunk on the replacement instead of killing it too. An error naming no actor counts."""
    dead = getattr(error, "actor_id", None)
    return dead is None or dead == actor._actor_id.hex()


def why(error: BaseException) -> str:
    """The last line of a dead actor's error (its cause, under Ray's own traceback)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def load_published(model: torch.nn.Module, state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Load published weights (the trainable ones: every weight, or LoRA's adapters) into a worker's copy, strictly:
    their names must be exactly the copy's trainable parameters, so a renamed or missing key stops the worker
    instead of leaving it to sample from stale weights."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != trainable:
        missing, unexpected = sorted(trainable - set(state)), sorted(set(state) - trainable)
        raise RuntimeError(
            f"published weights do not match the rollout worker's model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]} (of {len(missing)} and {len(unexpected)}); the learner and the workers must hold "
            "the same model."
        )
    # strict=False only because the frozen weights are not sent; every sent key was matched above
    model.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=False)


def _cpu_copy(model: torch.nn.Module) -> torch.nn.Module:
    if all(p.device.type == "cpu" for p in model.parameters()):
        return model
    import copy

    return copy.deepcopy(model).cpu()
