"""Rollouts sampled by a running ``vllm serve`` (``generation: {engine: vllm, vllm_mode: server}``, TRL's names).

* At the start: ``/health`` until it answers (at most vllm_server_timeout), then ``/v1/models`` (the served name)
  and the dev-mode ``/server_info`` (the server must run with ``VLLM_SERVER_DEV_MODE=1``, whose routes push the
  weights, and ``--logprobs-mode processed_logprobs``, the log-prob of the distribution each token was drawn
  from, or the run is refused with the flag to add; ``grpokit vllm-serve`` sets both).
* Sampling: one ``/v1/completions`` request per prompt (token ids in, ``n`` = G, the group's seed, the sampled
  token's log-prob, token ids out), sent concurrently; the answers become :class:`Rollouts` through the colocated
  engine's own conversion (:func:`~grpokit.rollout.vllm.engine.rollouts_from_vllm`). Greedy with G > 1: G requests
  of n = 1, as the colocated engine.
* Weights: before sampling, when the policy's version changed since the last push, the learner's weights go to the
  server (:mod:`grpokit.rollout.vllm.server_weights`: shared memory + ``/collective_rpc`` from a CPU learner,
  vLLM's NCCL weight transfer from a CUDA one). The server holds one set of weights, so one lock owns them: a push
  and the sampling that needs it run under it (:meth:`VLLMServerEngine.generate_at`), whichever thread asks (the
  learner's, or the producer's when sampling ahead, :mod:`grpokit.train.experience.server_ahead`), and a version
  the server holds is never pushed again.
* Every request carries the server's key (vllm_server_api_key, VLLM_API_KEY, or a loopback server's key file:
  :mod:`grpokit.rollout.vllm.keys`); HTTP 401 ends the run in one line naming vllm_server_api_key.
* Every request is bounded by vllm_server_timeout; a server that is unreachable, dies or hangs ends the run with
  one line naming the URL and the timeout (:class:`~grpokit.rollout.vllm.http.VLLMServerError`).
* The check of the sync: as the colocated engine's (:mod:`grpokit.rollout.vllm.weights`), naming the server.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import torch

from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.rollout.vllm.engine import group_requests, regroup_outputs, rollouts_from_vllm, vllm_sampling_kwargs
from grpokit.rollout.vllm.http import ServerClient, VLLMServerError
from grpokit.rollout.vllm.keys import client_key
from grpokit.rollout.vllm.settings import DTYPE_NAMES, VLLMSpec
from grpokit.rollout.vllm.weights import SyncGapCheck

MAX_CONCURRENT_REQUESTS = 64


def check_server_environment(distributed: bool, learner_device: str) -> None:
    """Raise ConfigError unless this learner can use a vLLM server: one learner process (it pushes the weights), and
    on CUDA the vllm package (vLLM's NCCL weight transfer runs on both sides)."""
    from grpokit.errors import ConfigError
    from grpokit.rollout.vllm.settings import installed_vllm

    if distributed:
        raise ConfigError(
            "vllm_mode: server is driven by one learner process for now; start it with `grpokit train`, not torchrun "
            "(or set generation.engine: hf for data-parallel training)."
        )
    if learner_device == "cuda" and installed_vllm() is None:
        raise ConfigError(
            "vllm_mode: server with a learner on CUDA sends the weights by vLLM's NCCL weight transfer, which needs "
            "the vllm package in the learner's environment too: `pip install vllm` (docs/vllm.md)."
        )


def completion_payload(model: str, prompt: list[int], seed: int, n: int, params: SamplingParams, eos: list[int]):
    """The JSON body of one ``/v1/completions`` request: the colocated engine's sampling settings, token ids in
    and out (``return_token_ids``; tokens named ``token_id:N`` in the log-probs)."""
    settings = vllm_sampling_kwargs(params, n, seed, eos)
    settings.pop("detokenize")  # not a field of the completions API; the text is ignored
    return {"model": model, "prompt": list(prompt), **settings, "return_token_ids": True,
            "return_tokens_as_token_ids": True}  # fmt: skip


def request_output(prompt: list[int], answer: dict) -> SimpleNamespace:
    """One ``/v1/completions`` answer in the shape of vLLM's ``RequestOutput`` (what ``rollouts_from_vllm`` reads):
    ``prompt_token_ids`` and, per choice, ``index``, ``token_ids``, ``logprobs`` (``{token: Logprob}`` per token)
    and ``finish_reason``."""
    samples = []
    for choice in answer["choices"]:
        token_ids = list(choice.get("token_ids") or [])
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        steps = None
        if logprobs is not None and len(logprobs) == len(token_ids):
            steps = [{t: SimpleNamespace(logprob=float(lp))} for t, lp in zip(token_ids, logprobs)]
        samples.append(
            SimpleNamespace(
                index=choice["index"], token_ids=token_ids, logprobs=steps, finish_reason=choice.get("finish_reason")
            )
        )
    return SimpleNamespace(prompt_token_ids=list(prompt), outputs=samples)


def server_settings(info: dict) -> tuple[str, str]:
    """(logprobs_mode, dtype name) of the server, from ``/server_info?config_format=json``."""
    model = (info.get("vllm_config") or {}).get("model_config") or {}
    dtype = str(model.get("dtype", "")).removeprefix("torch.")
    return str(model.get("logprobs_mode", "")), dtype


def uses_extension(info: dict) -> bool:
    from grpokit.rollout.vllm.server_worker import EXTENSION

    parallel = (info.get("vllm_config") or {}).get("parallel_config") or {}
    return parallel.get("worker_extension_cls") == EXTENSION


class VLLMServerEngine:
    """Samples from a running ``vllm serve`` and pushes the learner's weights to it (module docstring)."""

    takes_group_seeds = True
    takes_raw_prompts = False

    def __init__(self, policy: torch.nn.Module, eos_token_ids: list[int], pad_token_id: int, spec: VLLMSpec, *,
                 seed: int = 0):  # fmt: skip
        self.policy = policy
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator().manual_seed(seed)  # draws the groups' seeds; saved in checkpoints
        self.policy_version = 0
        self._loaded_version: int | None = None  # the server starts from its own folder: pushed before sampling
        self._weights_lock = threading.Lock()  # one owner of the server's weights: a push and its sampling
        self.pushed: list[int] = []  # the versions pushed, in order
        key, source = client_key(spec.server_api_key, spec.server_url)
        self.client = ServerClient(spec.server_url, spec.server_timeout, api_key=key, key_source=source)
        self.client.wait_ready()
        self.model_name = self.client.request("GET", "/v1/models")["data"][0]["id"]
        info = self._server_info()
        mode, server_dtype = server_settings(info)
        if mode != "processed_logprobs":
            raise VLLMServerError(
                f"vLLM server {self.client.url} returns {mode or 'raw'} log-probs; start it with --logprobs-mode "
                "processed_logprobs (grpokit vllm-serve does), so that its log-probs are those of the distribution "
                "each token was drawn from."
            )
        learner = DTYPE_NAMES.get(str(next(policy.parameters()).dtype).removeprefix("torch."), "16-bit")
        self.gap = SyncGapCheck(f"vLLM server {self.client.url}", server_dtype, learner, spec.max_logprob_gap)
        self.pusher = self._pusher(info)

    def _server_info(self) -> dict:
        try:
            return self.client.request("GET", "/server_info", params={"config_format": "json"})
        except VLLMServerError as exc:
            if "HTTP 404" not in str(exc):
                raise
            raise VLLMServerError(
                f"vLLM server {self.client.url} has no dev-mode routes (/server_info, /collective_rpc), which push "
                "the weights; start it with VLLM_SERVER_DEV_MODE=1 (grpokit vllm-serve does)."
            ) from None

    def _pusher(self, info: dict):
        from grpokit.rollout.vllm.server_weights import NCCLPush, SharedMemoryPush

        if next(self.policy.parameters()).device.type == "cuda":
            return NCCLPush(self.client, self.policy)
        return SharedMemoryPush(self.client, extension=uses_extension(info))

    def generate(
        self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams, seeds: list[int] | None = None
    ) -> Rollouts:
        """G samples for each prompt by the policy's current weights; ``seeds`` (one per prompt) default to draws from
        ``self.generator``."""
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompt_ids),), generator=self.generator).tolist()
        return self.generate_at(self.policy_version, self.policy, prompt_ids, num_generations, params, seeds)

    def generate_at(self, version: int, weights: torch.nn.Module, prompt_ids: list[list[int]], num_generations: int,
                    params: SamplingParams, seeds: list[int]) -> Rollouts:  # fmt: skip
        """G samples for each prompt by version ``version`` of the policy, whose weights ``weights`` holds (the
        learner's policy, or a copy at that version): pushed first unless the server holds that version. The lock
        keeps another thread's push from landing while these requests run."""
        with self._weights_lock:
            if self._loaded_version != version:
                self.pusher.push(version, weights)
                self._loaded_version = version
                self.pushed.append(version)
            requests = group_requests(prompt_ids, seeds, num_generations, params.greedy)
            payloads = [
                completion_payload(self.model_name, p, seed, n, params, self.eos_token_ids) for p, seed, n in requests
            ]
            workers = max(1, min(MAX_CONCURRENT_REQUESTS, len(payloads)))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                answers = list(pool.map(self._complete, payloads))
        outputs = [request_output(p, answer) for (p, _, _), answer in zip(requests, answers)]
        outputs = regroup_outputs(outputs, num_generations, params.greedy)
        return rollouts_from_vllm(outputs, num_generations, self.pad_token_id, version)

    def _complete(self, body: dict) -> dict:
        return self.client.request("POST", "/v1/completions", json=body)

    def sample_ahead(self, metric: str) -> None:
        """Batches are sampled ahead (max_staleness >= 1): the learner's log-probs are then a newer policy's than the
        sampler's, so the sync is checked on ``metric``, the gap its sampler measures against a copy of the policy at
        each new version, instead of the step's ``sampling_is/logprob_abs_diff``."""
        self.gap.metric = metric

    def sync_weights(self) -> None:
        """The policy was updated: its weights go to the server before the next sampling (one version on)."""
        self.policy_version += 1

    def sync_gap_warning(self, step: int, metrics: dict) -> str | None:
        return self.gap.warning(step, metrics)

    def sync_gap_stop(self, step: int, metrics: dict) -> None:
        self.gap.stop(step, metrics)

    def close(self) -> None:
        pusher = self.__dict__.pop("pusher", None)
        if pusher is not None:
            pusher.close()
        self.client.close()
