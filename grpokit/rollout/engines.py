"""The rollout engines by name: what samples a run's completions.

Every engine implements :class:`grpokit.rollout.engine.RolloutEngine` (``generate``, ``policy_version``,
``sync_weights``, ``takes_group_seeds``, ``takes_raw_prompts``). The composition root picks one by
``generation.engine`` (hf | vllm | transformers), or ``rollout_func`` when GRPOTrainer was given one, and, when the
run has tools or environments, wraps it in the multi-turn engine; nothing else names an engine.

- ``hf``: :class:`~grpokit.rollout.engine.HFRolloutEngine`, grpokit's own sampler on the policy's own weights.
- ``vllm``: :class:`~grpokit.rollout.vllm.engine.VLLMRolloutEngine`, a colocated vLLM with its own copy of the
  weights (``separate_weights``: its log-probs differ from the learner's, so they weight tokens); with
  ``vllm_mode: server`` :class:`~grpokit.rollout.vllm.server.VLLMServerEngine`, a running ``vllm serve``; under
  torchrun one per rank: :class:`~grpokit.rollout.vllm.colocate.ColocatedVLLMEngine`.
- ``transformers``: :class:`~grpokit.rollout.transformers_engine.TransformersRolloutEngine`, transformers' own
  ``model.generate`` on the policy's weights, for TRL generation_kwargs grpokit's sampler cannot honour (beams ...)
  and for a GRPOTrainer whose model's generate was replaced (``compose/patched_generate.py``); prompts with images.
- ``multi-turn``: :class:`~grpokit.rollout.multiturn.MultiTurnEngine`, tool rollouts on an hf engine's model
  (chat prompts; built by :class:`grpokit.train.experience.tool_rollouts.ToolRollouts` from the run's tools).
- ``transformers-multi-turn``: :class:`~grpokit.rollout.transformers_multiturn.TransformersMultiTurnEngine`, tool
  rollouts with ``model.generate`` (TRL's round loop: one generate call per round over the rows still going).
- ``rollout_func``: :class:`~grpokit.rollout.rollout_func.RolloutFuncEngine`, TRL's ``GRPOTrainer(rollout_func=...)``:
  the user's function generates; the engine takes the raw prompts (``takes_raw_prompts``) and converts its output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.rollout.vllm.settings import VLLMSettings, vllm_spec  # beside the functions that read them
from grpokit.system.registry import Registry


@dataclass(frozen=True)
class EngineParts:
    """What any engine samples with: the policy ``model``, its ``eos_token_ids`` and ``pad_token_id``, the
    ``device``, ``autocast_dtype`` and ``kernels`` of the run, the sampler's ``seed``; for an engine with its own copy
    of the weights, where the policy came from (``source``, ``trust_remote_code``) and the longest sequence
    (``max_length``); for the rollout_func engine, the trainer's closure (``generate``)."""

    model: Any
    eos_token_ids: list[int]
    pad_token_id: int
    device: Any
    seed: int
    trust_remote_code: bool  # whether the policy's folder's code may run (engines that load it again)
    source: str | None = None  # the policy's folder or hub id when it was given by name (None: a loaded module)
    max_length: int | None = None  # max_prompt_length + max_completion_length (None: no prompt limit)
    generate: Any = None  # the trainer's rollout_func closure (the rollout_func engine's)
    autocast_dtype: Any = None
    kernels: Any = None


@dataclass(frozen=True)
class MultiTurnSpec:
    """The multi-turn engine's parts: the ``base`` hf engine whose model it samples, ``chat``
    (``grpokit.tools.ConversationTokens``), the ``executor`` of tool calls, ``max_tool_calling_iterations``
    (None: no limit) and the tool-call ``parser`` (None: from the chat template)."""

    base: Any
    chat: Any
    executor: Any
    max_tool_calling_iterations: int | None
    parser: Any = None


@dataclass(frozen=True)
class EngineEntry:
    """An engine kind: ``build(parts, settings)`` makes one. ``settings``: its settings dataclass (torch-free; fields
    with defaults and a doc line each, an optional ``check()``), which the composition root fills from the config's
    keys of the same names and ``engine_params`` (None: it has none and gets None); ``separate_weights``: it samples
    from its own copy of the weights, so its log-probs are not the learner's. Adding an engine is a module with its
    ``build`` (and settings class) under the registry's decorator, ``@ENGINES.register(name, settings=...)``."""

    build: Callable[[EngineParts, Any], Any]
    settings: type | None = None
    separate_weights: bool = False
    internal: bool = False  # built by grpokit itself (tool rollouts, a rollout_func), not named by generation.engine
    own_sampler: bool = False  # grpokit's own sampler on the policy's weights (its compute dtype is chosen for it)
    takes_images: bool = False  # samples prompts with images (a VLM's processor inputs: docs/vision.md)
    tool_engine: str | None = None  # the internal engine that runs tool rollouts over it (None: tools refused)
    in_ray_workers: bool = False  # with distributed.backend: ray the rollout workers hold it; the learner keeps an hf
    checks_sync: bool = False  # has sync_gap_warning / sync_gap_stop: its log-probs against the learner's, each step
    check_environment: Callable[[Any, EngineSite], None] | None = None  # before a model loads: one line if it can't
    is_server: Callable[[Any], bool] | None = None  # samples from a running server, per its settings
    # its settings -> partial rollouts' (S tokens, seconds a continuation may wait for its version), or None when off
    partial_rollouts: Callable[[Any], tuple[int, float] | None] | None = None
    package: str | None = None  # generation.engine: auto may pick it where this module is installed (engine_choice)

    def serves(self, settings: Any) -> bool:
        """Whether this engine, with ``settings``, samples from a server (which pushes weights to it)."""
        return self.is_server is not None and self.is_server(settings)

    def partial(self, settings: Any) -> tuple[int, float] | None:
        """Partial rollouts' (S tokens, timeout) with ``settings``, or None: off, or an engine without them."""
        return None if self.partial_rollouts is None else self.partial_rollouts(settings)


@dataclass(frozen=True)
class EngineSite:
    """Where an engine would run, for its ``check_environment``: several learner processes (``distributed``), the
    learner's device type, and with Ray the workers' device type (``workers``: None without Ray)."""

    distributed: bool
    learner_device: str
    workers: str | None = None


ENGINES = Registry("engine", entry=lambda name, build, **fields: EngineEntry(build, **fields))


@ENGINES.register("hf", own_sampler=True, takes_images=True, tool_engine="multi-turn")
def _hf(parts: EngineParts, settings: None = None):
    from grpokit.rollout.engine import HFRolloutEngine

    return HFRolloutEngine(
        parts.model,
        parts.eos_token_ids,
        parts.pad_token_id,
        parts.device,
        seed=parts.seed,
        autocast_dtype=parts.autocast_dtype,
        kernels=parts.kernels,
    )


def _vllm(parts: EngineParts, settings: VLLMSettings):
    from grpokit.errors import ConfigError
    from grpokit.models.loading import is_hf_model
    from grpokit.rollout.vllm.engine import VLLMRolloutEngine
    from grpokit.system.processes import under_torchrun

    if not is_hf_model(parts.model):
        raise ConfigError(
            "generation.engine: vllm samples Hugging Face causal LMs; a custom forward(input_ids) module needs "
            "generation.engine: hf."
        )
    spec = vllm_spec(settings, parts.source, parts.trust_remote_code, parts.max_length)
    if spec.mode == "server":
        from grpokit.rollout.vllm.server import VLLMServerEngine

        return VLLMServerEngine(parts.model, parts.eos_token_ids, parts.pad_token_id, spec, seed=parts.seed)
    common = dict(seed=parts.seed, learner_dtype=parts.autocast_dtype, device_type=_device_type(parts.device))
    if under_torchrun():  # every rank its own engine (TRL's colocate mode), built and closed collectively
        import torch.distributed as dist

        from grpokit.rollout.vllm.colocate import ColocatedVLLMEngine

        return ColocatedVLLMEngine(
            parts.model,
            parts.eos_token_ids,
            parts.pad_token_id,
            spec,
            rank=dist.get_rank(),
            tensor_parallel_size=spec.tensor_parallel_size,
            **common,
        )
    return VLLMRolloutEngine(parts.model, parts.eos_token_ids, parts.pad_token_id, spec, **common)


def _vllm_server(settings: VLLMSettings) -> bool:
    return settings.vllm_mode == "server"


def _vllm_partial(settings: VLLMSettings) -> tuple[int, float] | None:
    if settings.vllm_partial_rollout_tokens is None:
        return None
    return settings.vllm_partial_rollout_tokens, settings.vllm_partial_rollout_timeout


def _vllm_environment(settings: VLLMSettings, site: EngineSite) -> None:
    """vLLM can sample here: a server beside one learner process, or an installed vLLM on the workers' or the
    learner's device."""
    if settings.vllm_mode == "server":
        from grpokit.rollout.vllm.server import check_server_environment

        check_server_environment(site.distributed, site.learner_device)
    else:
        from grpokit.rollout.vllm.engine import check_vllm_environment

        check_vllm_environment(site.distributed, site.workers or site.learner_device)


ENGINES.register(
    "vllm",
    settings=VLLMSettings,
    separate_weights=True,
    in_ray_workers=True,
    checks_sync=True,
    check_environment=_vllm_environment,
    is_server=_vllm_server,
    partial_rollouts=_vllm_partial,
    package="vllm",
)(_vllm)


@ENGINES.register("transformers", takes_images=True, tool_engine="transformers-multi-turn")
def _transformers(parts: EngineParts, settings: None = None):
    from grpokit.errors import ConfigError
    from grpokit.models.loading import is_hf_model
    from grpokit.rollout.transformers_engine import TransformersRolloutEngine

    if not is_hf_model(parts.model) or not hasattr(parts.model, "generate"):
        raise ConfigError(
            "generation.engine: transformers samples with transformers' generate, which a custom forward(input_ids) "
            "module does not have; remove the generation_kwargs only generate honours and use generation.engine: hf."
        )
    return TransformersRolloutEngine(
        parts.model,
        parts.eos_token_ids,
        parts.pad_token_id,
        parts.device,
        seed=parts.seed,
        autocast_dtype=parts.autocast_dtype,
    )


def _device_type(device) -> str | None:
    return None if device is None else getattr(device, "type", str(device).split(":")[0])


@ENGINES.register("multi-turn", internal=True)
def _multi_turn(parts: EngineParts, spec: MultiTurnSpec):  # internal: tool_rollouts.py passes its MultiTurnSpec
    from grpokit.rollout.multiturn import MultiTurnEngine

    return MultiTurnEngine(
        spec.base,
        spec.chat,
        spec.executor,
        max_tool_calling_iterations=spec.max_tool_calling_iterations,
        parser=spec.parser,
    )


@ENGINES.register("transformers-multi-turn", internal=True)
def _transformers_multi_turn(parts: EngineParts, spec: MultiTurnSpec):  # internal: tool_rollouts.py passes its spec
    from grpokit.rollout.transformers_multiturn import TransformersMultiTurnEngine

    return TransformersMultiTurnEngine(
        spec.base,
        spec.chat,
        spec.executor,
        max_tool_calling_iterations=spec.max_tool_calling_iterations,
        parser=spec.parser,
    )


# the function's log-probs weight nothing (TRL applies importance sampling only with vLLM): not separate_weights
@ENGINES.register("rollout_func", internal=True)
def _rollout_func(parts: EngineParts, settings: None):
    from grpokit.rollout.rollout_func import RolloutFuncEngine

    return RolloutFuncEngine(parts.generate, parts.eos_token_ids, parts.pad_token_id, seed=parts.seed)


def get_engine(name: str) -> EngineEntry:
    """The engine kind called ``name``; a ValueError listing the names otherwise."""
    return ENGINES.entry(name)
