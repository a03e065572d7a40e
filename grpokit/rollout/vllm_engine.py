"""Rollouts sampled by vLLM on CUDA, colocated in the learner process (``generation.engine: vllm``).

The engine is a ``vllm.LLM`` in the same process and on the same GPU as the learner (as TRL's
``vllm_mode="colocate"``), written against vLLM's V1 API (checked against vLLM 0.33):

* Built once from the policy's folder or hub id, with ``distributed_executor_backend=
  "external_launcher"`` (vLLM then runs its engine in this process, so its model is reachable for
  weight loading), the policy's dtype, ``gpu_memory_utilization`` and ``max_model_len`` from the
  config, and ``logprobs_mode="processed_logprobs"`` (the log-prob of the distribution a token was
  actually drawn from: after temperature, min-p, top-k and top-p). A policy given as a loaded
  module has no folder: its config is saved to a temporary one and vLLM starts from dummy weights,
  which the first weight load replaces.
* Weights: before sampling, when ``policy_version`` (optimizer steps so far, counted by the trainer)
  differs from the version vLLM holds, the learner's weights are loaded into vLLM's model
  (``model.load_weights``, tensor to tensor on the GPU) and vLLM's prefix cache is reset. With LoRA
  the adapters are merged into the base weights (peft ``merge_adapter``), the merged weights are
  loaded, and the adapters are unmerged: vLLM runs a plain model at full speed, and no adapter files
  are written each step (vLLM's LoRARequest path would need both).
* Sleep mode (``vllm_enable_sleep_mode``, default on): after each ``generate`` vLLM sleeps at level 2,
  freeing its KV cache and its weights (nothing is copied to CPU) while the learner trains. The next
  ``generate`` wakes the weights' memory, loads the learner's current weights into it (level 2 forgot
  them, so this happens on every wake) and then wakes the KV cache. Without sleep mode vLLM keeps its
  memory and the weights are loaded only when the version changed.
* Sampling: one request per prompt with ``n = G`` and a seed per group (drawn from the engine's
  generator, or the trainer's per-group seeds), so a run's rollouts are reproducible; vLLM gives
  the G samples of a request the seeds seed, seed + 1, ... EOS ids stop a completion, which keeps its
  EOS token, and ``logprobs=0`` returns the sampled token's log-prob.

The conversion of vLLM's outputs to :class:`Rollouts` is the pure function :func:`rollouts_from_vllm`.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from grpokit.rollout.types import Rollouts, SamplingParams


def check_vllm_environment(distributed: bool = False) -> None:
    """Raise ConfigError unless a CUDA GPU is visible and vllm is installed (no model is touched)."""
    from grpokit.errors import ConfigError

    if distributed:
        raise ConfigError(
            "generation.engine: vllm runs in one learner process for now; start it with `grpokit train`, not torchrun "
            "(or set generation.engine: hf for data-parallel training)."
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            "generation.engine: vllm samples on a CUDA GPU, but this machine has none (torch.cuda.is_available() is "
            "False); set generation.engine: hf to sample with grpokit's own engine here."
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "generation.engine: vllm needs the vllm package, which is not installed: `pip install vllm` (it brings its "
            "own CUDA build of torch; install it in a fresh environment), or set generation.engine: hf."
        )


def vllm_sampling_kwargs(params: SamplingParams, num_generations: int, seed: int, eos_token_ids: Sequence[int]) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt's group of ``num_generations`` samples."""
    return {
        "n": num_generations,
        "temperature": 0.0 if params.greedy else params.temperature,  # vLLM: 0 = greedy
        "top_p": params.top_p,
        "top_k": params.top_k,  # 0 = off, as ours
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,  # transformers' meaning: prompt and output tokens
        "min_tokens": params.min_new_tokens,  # stop tokens held back until then (transformers' min_new_tokens)
        "max_tokens": params.max_completion_length,
        "seed": seed,
        "stop_token_ids": sorted(set(eos_token_ids)),
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,  # the trainer decodes; the engine runs without a tokenizer
    }


def rollouts_from_vllm(
    outputs: Sequence[Any], num_generations: int, pad_token_id: int, policy_version: int = 0
) -> Rollouts:
    """Rollouts from vLLM's ``RequestOutput`` list (one per prompt, in prompt order, each with G ``outputs``).

    Reads ``prompt_token_ids`` of each request and, of each ``CompletionOutput``, ``index``,
    ``token_ids``, ``logprobs`` (one ``{token_id: Logprob}`` per generated token, ``logprobs=0``) and
    ``finish_reason`` (``stop``: EOS, kept as the last token; ``length``: max_tokens or max_model_len).
    Completions are right-padded with ``pad_token_id`` to T = the longest; log-probs are 0 on padding.
    """
    completions = []
    for request in outputs:
        samples = sorted(request.outputs, key=lambda c: c.index)
        if len(samples) != num_generations:
            raise ValueError(
                f"a vLLM request returned {len(samples)} completions, expected num_generations={num_generations}"
            )
        completions += samples
    width = max([len(c.token_ids) for c in completions] + [1])
    N = len(completions)
    completion_ids = torch.full((N, width), pad_token_id, dtype=torch.long)  # [N, T]
    completion_mask = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    logprobs = torch.zeros((N, width), dtype=torch.float32)  # [N, T]
    finish_reasons = []
    for i, c in enumerate(completions):
        n = len(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != n:
            raise ValueError(
                "vLLM returned no log-prob for some sampled tokens; sample with SamplingParams(logprobs=0)"
            )
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a completion with reason {c.finish_reason!r} (expected stop or length)")
        completion_ids[i, :n] = torch.tensor(list(c.token_ids), dtype=torch.long)
        completion_mask[i, :n] = 1.0
        logprobs[i, :n] = torch.tensor(
            [step[token].logprob for step, token in zip(c.logprobs, c.token_ids)], dtype=torch.float32
        )
        finish_reasons.append(c.finish_reason)
    return Rollouts(
        prompt_ids=[list(request.prompt_token_ids) for request in outputs],
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=logprobs,
        finish_reasons=finish_reasons,
        num_generations=num_generations,
        policy_version=policy_version,
    )


def vllm_weight_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the policy under the names of the plain HF model, which vLLM's
    ``load_weights`` expects. For a peft model call it with the adapters merged: the LoRA factors are
    skipped and ``base_model.model.`` / ``.base_layer`` are removed from the merged weights' names."""
    peft = hasattr(model, "get_base_model")
    for name, param in model.named_parameters():
        if peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = (
                name.removeprefix("base_model.model.")
                .replace(".base_layer", "")
                .replace("modules_to_save.default.", "")
            )
        yield name, param.detach()


class VLLMRolloutEngine:
    """Samples with a colocated ``vllm.LLM`` holding a copy of the policy's weights (see module docstring)."""

    takes_group_seeds = True  # generate() seeds each group itself (see grpokit.rollout.seeding)
    takes_raw_prompts = False

    def __init__(
        self,
        policy: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        *,
        source: str | None,
        gpu_memory_utilization: float,
        max_model_len: int | None,
        enable_sleep_mode: bool,
        seed: int = 0,
        trust_remote_code: bool = False,
        dtype: torch.dtype | None = None,
    ):
        """``dtype``: vLLM's compute dtype, the run's autocast dtype (grpokit.precision: float32 master weights,
        bf16 compute); None: the policy's weights' dtype."""
        from vllm import LLM

        self.policy = policy
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator().manual_seed(seed)  # draws the groups' seeds; saved in checkpoints
        self.policy_version = 0
        self.sleep_mode = enable_sleep_mode
        self._loaded_version: int | None = None  # version of the weights vLLM holds; None = not the policy's
        self._config_dir = None
        load_format = "auto"
        if source is None:  # a loaded module: vLLM needs a folder for the architecture, the weights come later
            self._config_dir = tempfile.TemporaryDirectory(prefix="grpokit-vllm-")
            base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
            base.config.save_pretrained(self._config_dir.name)
            source, load_format = self._config_dir.name, "dummy"
        _single_process_env()
        self.llm = LLM(
            model=source,
            dtype=str(dtype or next(policy.parameters()).dtype).removeprefix("torch."),
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            trust_remote_code=trust_remote_code,
            load_format=load_format,
            skip_tokenizer_init=True,  # prompts arrive as token ids and completions leave as token ids
            distributed_executor_backend="external_launcher",  # the engine runs in this process
            logprobs_mode="processed_logprobs",
            max_num_batched_tokens=4096,  # as TRL: the V1 memory profiler misjudges a colocated GPU at the 32k default
        )
        self._sleep()

    def generate(
        self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams, seeds: list[int] | None = None
    ) -> Rollouts:
        """G samples for each prompt; ``seeds`` (one per prompt) default to draws from ``self.generator``."""
        from vllm import SamplingParams as VLLMSamplingParams

        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),), generator=self.generator).tolist()
        requests = [
            VLLMSamplingParams(**vllm_sampling_kwargs(params, num_generations, seed, self.eos_token_ids))
            for seed in seeds
        ]
        self._wake()
        try:
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], requests, use_tqdm=False)
        finally:
            self._sleep()
        return rollouts_from_vllm(outputs, num_generations, self.pad_token_id, self.policy_version)

    def sync_weights(self) -> None:
        """The policy was updated: its weights are copied into vLLM before the next sampling (one version on)."""
        self.policy_version += 1

    def _wake(self) -> None:
        if self.sleep_mode:
            torch.cuda.empty_cache()  # hand the learner's cached blocks back before vLLM maps its memory
            self.llm.wake_up(tags=["weights"])
        if self._loaded_version != self.policy_version:
            self._load_weights()
        if self.sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])

    def _sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=2)
            self._loaded_version = None  # level 2 discards the weights

    @torch.no_grad()
    def _load_weights(self) -> None:
        """Copy the learner's weights into vLLM's model (LoRA: merged into the base weights)."""
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        lora = hasattr(self.policy, "merge_adapter")
        if lora:
            self.policy.merge_adapter()
        try:
            model.load_weights(vllm_weight_items(self.policy))
        finally:
            if lora:
                self.policy.unmerge_adapter()
        self.llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights
        self._loaded_version = self.policy_version


def _single_process_env() -> None:
    """The torch.distributed variables vLLM's external launcher reads, for a one-process world."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
