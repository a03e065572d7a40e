"""vLLM on every torchrun rank (TRL's ``vllm_mode="colocate"``): ``generation.engine: vllm`` under torchrun.

Each rank builds its own ``vllm.LLM`` beside its learner, after torch.distributed is initialised, with
``distributed_executor_backend="external_launcher"``: vLLM then reads torchrun's ``RANK`` / ``LOCAL_RANK`` /
``MASTER_ADDR`` / ``MASTER_PORT``, keeps the trainer's default process group (vLLM 0.32's
``init_distributed_environment`` skips ``init_process_group`` when one exists) and makes its own groups over it:
with tensor parallel size 1 a group of one rank each (vLLM's "external data parallel": every rank generates on its
own, no collective in ``generate``). Making those groups is collective, and so is vLLM's start-up memory check
(an all_reduce over the world), so every rank builds its engine at the same point, and closes it in the same order.
``seed``: ``rank // vllm_tensor_parallel_size`` as TRL (each request carries its group's own seed anyway, so the
engine's seed does not decide the rollouts).

* **Weights**: after every update every rank loads the learner's weights into its engine at once
  (:meth:`ColocatedVLLMEngine.sync_weights`, collective), through the same reload path as one process
  (:func:`grpokit.rollout.vllm.weights.push_weights`). DDP: each rank's whole policy, tensor to tensor. FSDP2: the
  parameters stream one at a time (each all-gathered with ``full_tensor`` when vLLM's loader asks for it and dropped
  after), so no rank ever holds the whole model; vLLM's layerwise reload buffers the pieces of one of its fused
  layers (q, k, v of ``qkv_proj``) until the layer is complete, which bounds the peak (measured:
  :attr:`ColocatedVLLMEngine.stream_peak_bytes`). A resumed run's weights load when the checkpoint sets the version
  (every rank, in ``RunState.load``). Evaluation samples on rank 0 alone, which the eager loads allow: rank 0's
  engine already holds the current weights, so it needs no other rank.
* **Closing**: vLLM's own shutdown (``EngineCore.shutdown``, also its finalizer) ends with
  ``cleanup_dist_env_and_memory``, which destroys the default process group, the trainer's. Here that finalizer is
  detached, and :func:`close_under_torchrun` shuts the engine down and destroys only vLLM's own groups.
* **Not here**: tensor parallelism (``vllm_tensor_parallel_size`` > 1, refused by the config). Sleep mode is off
  unless asked for, and refused with FSDP by the config (a wake's weight load would gather shards while rank 0
  evaluates alone).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from grpokit.rollout.vllm.engine import VLLMRolloutEngine
from grpokit.rollout.vllm.weights import push_weights, vllm_weight_items


class StreamMeter:
    """Counts the bytes of streamed full tensors alive at once: wraps a (name, tensor) iterator and records the peak
    of the tensors it yielded that nobody has dropped yet (views of the policy's own storage, DDP's, count 0)."""

    def __init__(self, items, own: set[int]):
        self.items, self.own = items, own  # own: data_ptrs of the policy's parameters (not gathered copies)
        self.live = 0
        self.peak = 0
        self.total = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __iter__(self):
        for name, tensor in self.items:
            if tensor.data_ptr() not in self.own:
                nbytes = tensor.numel() * tensor.element_size()
                self.live += nbytes
                self.total += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._freed, nbytes)
            yield name, tensor
            del tensor


class ColocatedVLLMEngine(VLLMRolloutEngine):
    """One ``vllm.LLM`` per torchrun rank (module docstring). ``rank`` / ``tensor_parallel_size``: the engine's
    seed; ``sharded``: FSDP2 (the weights stream from the shards)."""

    def __init__(self, *args, rank: int, tensor_parallel_size: int = 1, **kwargs):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("the colocated vLLM engine is built after torch.distributed is initialised (torchrun)")
        self.rank, self.tensor_parallel_size = rank, tensor_parallel_size
        self.stream_peak_bytes = 0  # the last sync's peak of gathered full tensors alive at once (FSDP), bytes
        self.stream_total_bytes = 0  # what that sync gathered in all
        self.syncs = 0  # weight loads after the start
        spec = args[3]
        if spec.enable_sleep_mode is None:  # off unless asked for (DDP only: the config refuses it with FSDP)
            args = (*args[:3], dataclasses.replace(spec, enable_sleep_mode=False), *args[4:])
        super().__init__(*args, **kwargs)
        client = self.llm.llm_engine.engine_core
        client._finalizer.detach()  # vLLM's would destroy the trainer's default group (close_under_torchrun instead)
        if self.source is None:  # dummy weights (a policy given as a module, whole on every rank): load them now
            self._load_weights()
        else:  # vLLM loaded the policy's own folder: the weights of version 0
            self._loaded_version = self.policy_version

    def _prepare_launch(self) -> None:
        """torchrun set what the external launcher reads; vLLM reuses the trainer's process group."""

    def _engine_seed(self, seed: int) -> int:
        return self.rank // self.tensor_parallel_size  # TRL's: one seed per tensor-parallel group

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        """A new version (an update, or a checkpoint's on resume) loads the weights now, on every rank (collective);
        with sleep mode the next wake loads them."""
        self._version = value
        if "llm" in self.__dict__ and not self.sleep_mode and value != self._loaded_version:
            self._load_weights()

    def generate(self, prompt_ids, num_generations, params, seeds=None):
        if not self.sleep_mode and self._loaded_version != self.policy_version:
            raise RuntimeError(  # every load is collective and happens when the version changes; a bug otherwise
                f"vLLM on rank {self.rank} holds weights version {self._loaded_version}, the policy is at "
                f"{self.policy_version}: a weight sync was skipped on this rank"
            )
        return super().generate(prompt_ids, num_generations, params, seeds)

    def _load_weights(self) -> None:
        own = {p.data_ptr() for p in self.policy.parameters()}
        meter = StreamMeter(vllm_weight_items(self.policy), own)
        push_weights(self.llm, self.policy, iter(meter))
        self.stream_peak_bytes, self.stream_total_bytes = meter.peak, meter.total
        self._loaded_version = self.policy_version
        self.syncs += 1

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            close_under_torchrun(llm)


def close_under_torchrun(llm) -> None:
    """Shut a colocated engine down as ``EngineCore.shutdown`` does (executor, scheduler, gc.unfreeze), and destroy
    vLLM's own process groups, but not the default one (the trainer's), which vLLM's ``cleanup_dist_env_and_memory``
    would. Collective: every rank closes its engine at the same point."""
    import gc

    from vllm.distributed import parallel_state

    core = llm.llm_engine.engine_core.engine_core
    core.structured_output_manager.clear_backend()
    if core.model_executor:
        core.model_executor.shutdown()
    if core.scheduler:
        core.scheduler.shutdown()
    gc.unfreeze()
    if torch.distributed.is_initialized():
        parallel_state.destroy_model_parallel()
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
            parallel_state._WORLD = None
