"""The learner's weights into a running ``vllm serve`` (``vllm_mode: server``), after each update.

Both paths send :func:`~grpokit.rollout.vllm.weights.vllm_weight_items`: the plain HF model's names, a LoRA
policy's adapted weights merged out of place (``W + delta``; the base is never written), a tied head once (as
the embeddings).

- :class:`SharedMemoryPush` (a learner on the CPU; the server on the same machine): the weights are written as
  safetensors to a fresh folder under /dev/shm for each version, the dev-mode route ``/collective_rpc`` runs
  ``grpokit_reload_weights`` (a server started by ``grpokit vllm-serve``: reload, then the tied head re-packed;
  :mod:`grpokit.rollout.vllm.server_worker`) or vLLM's own ``reload_weights`` (any other server) with
  ``weights_path`` = the folder, the folder is removed, and ``/reset_prefix_cache`` drops the KV computed by the
  old weights. ``/collective_rpc`` takes only string arguments, hence a folder rather than tensors. A folder is
  named with the learner's pid; one left by a learner killed mid-push (kill -9: a model's size of RAM) is removed
  when the next push engine starts (:func:`sweep_dead_pushes`).
- :class:`NCCLPush` (a learner on CUDA; a server started with ``--weight-transfer-config '{"backend":"nccl"}'``):
  vLLM's own trainer-side engine, ``NCCLTrainerWeightTransferEngine``, over grpokit's HTTP client
  (:class:`HTTPWeightSyncRoutes`: ``/init_weight_transfer_engine`` once, then ``/start_weight_update``,
  ``/update_weights`` beside the NCCL broadcast, ``/finish_weight_update`` on each push), then
  ``/reset_prefix_cache``. Every request is bounded by vllm_server_timeout; the broadcast itself is NCCL's.
  The learner is rank 0: it hosts the rendezvous (vLLM's ``StatelessProcessGroup`` binds a TCP store on the
  ``master_address`` it tells the server's workers), at :func:`rendezvous_address`, the learner's address that
  faces the server: 127.0.0.1 for a loopback server, else the one the route to the server's host leaves from;
  never vLLM's ``get_ip()`` (the machine's outward address for a server on loopback, 0.0.0.0 where it finds none).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from typing import Any
from urllib.parse import urlsplit

import torch

from grpokit.rollout.vllm.weights import vllm_weight_items

SHM = "/dev/shm"
PREFIX = "grpokit-weights-p"  # + pid, "-v", version, "-", mkdtemp's suffix


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_dead_pushes(root: str | None) -> list[str]:
    """Remove the push folders under ``root`` (None: the temp folder) of learners no longer running; their paths."""
    root = root or tempfile.gettempdir()
    removed = []
    for name in os.listdir(root):
        found = re.fullmatch(re.escape(PREFIX) + r"(\d+)-v\d+-.+", name)
        if found and not _alive(int(found.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed


class SharedMemoryPush:
    """Weights through safetensors in shared memory and ``/collective_rpc`` (module docstring)."""

    def __init__(self, client, extension: bool):
        """``extension``: the server runs grpokit's worker extension (started by ``grpokit vllm-serve``)."""
        self.client, self.extension = client, extension
        self.root = SHM if os.path.isdir(SHM) else None  # /dev/shm: RAM, not a disk (elsewhere: the temp folder)
        sweep_dead_pushes(self.root)

    @torch.no_grad()
    def push(self, version: int, model: torch.nn.Module) -> None:
        """Version ``version`` of the policy, held by ``model`` (the learner's, or a copy at that version)."""
        from safetensors.torch import save_file

        folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-v{version}-", dir=self.root)
        try:
            weights = {name: tensor.detach().contiguous().cpu() for name, tensor in vllm_weight_items(model)}
            save_file(weights, os.path.join(folder, "model.safetensors"))
            del weights
            method = "grpokit_reload_weights" if self.extension else "reload_weights"
            self.client.request("POST", "/collective_rpc", json={"method": method, "kwargs": {"weights_path": folder}})
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.client.request("POST", "/reset_prefix_cache")

    def close(self) -> None:
        pass


class HTTPWeightSyncRoutes:
    """vLLM's ``VLLMWeightSyncClient`` protocol (the four weight-update routes and the shutdown, as vLLM's own
    ``HTTPVLLMWeightSyncClient``) over grpokit's client: each request bounded by its timeout, one line on failure."""

    def __init__(self, client):
        self.client = client

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.client.request("POST", "/init_weight_transfer_engine", json={"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self.client.request("POST", "/shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self.client.request("POST", "/start_weight_update")

    def update_weights(self, update_info) -> None:
        self.client.request("POST", "/update_weights", json={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self.client.request("POST", "/finish_weight_update", json=body)


def policy_source(holder):
    """A vLLM ``WeightSource`` over :func:`vllm_weight_items` of ``holder.model`` (the model of the push in progress:
    the learner's policy or a copy of it, the same names and shapes): ``metadata()`` and iteration in the same
    order."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class PolicySource(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in vllm_weight_items(holder.model)]

        def __iter__(self):
            for name, tensor in vllm_weight_items(holder.model):
                yield name, tensor.detach().contiguous()

    return PolicySource()


def route_source(host: str, port: int) -> str:
    """The local IPv4 address this machine's route to ``host`` leaves from (a UDP socket's connect: nothing sent)."""
    target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(target)
        return s.getsockname()[0]


def rendezvous_address(server_url: str, route=route_source) -> str:
    """The address the NCCL rendezvous binds and the server's workers are told to reach (module docstring):
    127.0.0.1 for a loopback ``server_url``, else ``route(host, port)``; one line when there is none (vLLM's
    rendezvous is IPv4 only) or it would be every interface."""
    from grpokit.rollout.vllm.http import VLLMServerError
    from grpokit.rollout.vllm.keys import reaches_this_machine

    parts = urlsplit(server_url)
    if reaches_this_machine(parts.hostname):
        return "127.0.0.1"
    try:
        address = route(parts.hostname, parts.port or 80)
    except OSError as exc:
        address, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = f"the route gives {address}"
    if address in (None, "", "0.0.0.0"):
        raise VLLMServerError(
            f"vLLM server {server_url}: no IPv4 address of this machine faces {parts.hostname} ({why}), so the NCCL "
            "weight transfer has no address to bind for its workers to reach; give the server's IPv4 address in "
            "vllm_server_base_url."
        )
    return address


class NCCLPush:
    """Weights by vLLM's NCCL weight transfer (module docstring). Built once: the NCCL group with the server's
    workers (rank 0 here, the server's ``/get_world_size`` workers after it)."""

    def __init__(self, client, policy: torch.nn.Module):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine
        from vllm.utils.network_utils import get_open_port

        self.client, self.model = client, policy
        workers = int(client.request("GET", "/get_world_size")["world_size"])
        address = rendezvous_address(client.url)
        info = NCCLTrainerInitInfo(master_address=address, master_port=get_open_port(), world_size=workers + 1, rank=0)
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=HTTPWeightSyncRoutes(client), source=policy_source(self)
        )

    @torch.no_grad()
    def push(self, version: int, model: torch.nn.Module) -> None:
        """Version ``version`` of the policy, held by ``model`` (the learner's, or a copy at that version)."""
        self.model = model
        self.engine.send_weights()
        self.client.request("POST", "/reset_prefix_cache")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the server may be gone already: nothing left to shut down
            self.engine.client.shutdown_weight_transfer_engine()
