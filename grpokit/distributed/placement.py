"""Which GPUs Ray may hand to rollout and reward actors: never the learner's.

Ray sees every GPU of a node, the ones the learner processes train on included, and gives a GPU actor whichever is
free in its own books; an actor asking for no GPU inherits the node's ``CUDA_VISIBLE_DEVICES`` and can still open
any GPU. So:

- a local cluster (``distributed.address: null``) is started without the learner's GPUs: Ray is told only of the
  others (``CUDA_VISIBLE_DEVICES`` and ``num_gpus`` while ``ray.init`` starts the node);
- an actor that asks for no GPU gets ``CUDA_VISIBLE_DEVICES=""`` (:func:`actor_options`);
- a GPU actor checks, as it starts, that Ray gave it none of the learner's GPUs (:func:`check_actor_gpus`): on a
  cluster grpokit did not start (``address: auto``), the learner's node must not offer its GPUs to Ray
  (``ray start --num-gpus``, or ``CUDA_VISIBLE_DEVICES`` without them), and a run that would share one stops
  with that fix instead of running two processes on one GPU.
"""

from __future__ import annotations

import contextlib
import os

import torch

VISIBLE = "CUDA_VISIBLE_DEVICES"


def _visible() -> list[str] | None:
    value = os.environ.get(VISIBLE)
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def learner_gpu_ids(device: torch.device) -> list[str]:
    """The GPU ids (as ``CUDA_VISIBLE_DEVICES`` and Ray name them) the learner processes of this node use: one per
    local rank under torchrun (``LOCAL_WORLD_SIZE``), else the device's; [] when the learner is not on CUDA."""
    if device.type != "cuda":
        return []
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    indices = range(local) if local > 1 else [device.index if device.index is not None else torch.cuda.current_device()]
    visible = _visible()
    return [visible[i] if visible is not None else str(i) for i in indices]


def free_gpu_ids(learner: list[str]) -> list[str]:
    """This node's GPUs (``CUDA_VISIBLE_DEVICES``, else all ``torch.cuda.device_count()``) less the learner's."""
    visible = _visible()
    if visible is None:
        visible = [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [gpu for gpu in visible if gpu not in learner]


@contextlib.contextmanager
def without_learner_gpus(learner: list[str]):
    """While a local Ray node starts: its GPUs are the node's less the learner's. Yields ``ray.init``'s
    ``num_gpus`` (None: no learner GPU to keep out, Ray detects the GPUs itself)."""
    if not learner:
        yield None
        return
    free = free_gpu_ids(learner)
    before = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = ",".join(free)
    try:
        yield len(free)
    finally:
        if before is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = before


def actor_options(num_cpus: float, num_gpus: float) -> dict:
    """``ray.remote`` options of a rollout or reward actor: its resources, and no visible GPU when it asks for none
    (Ray leaves such an actor the node's ``CUDA_VISIBLE_DEVICES``, the learner's GPU included)."""
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if num_gpus == 0:
        options["runtime_env"] = {"env_vars": {VISIBLE: ""}}
    return options


def check_actor_gpus(assigned: list, learner: list[str]) -> None:
    """Raise when Ray gave this actor one of the learner's GPUs (``assigned``: ``ray.get_gpu_ids()``)."""
    shared = sorted({str(g) for g in assigned} & set(learner))
    if shared:
        raise RuntimeError(
            f"Ray gave a rollout worker GPU {','.join(shared)}, which the learner trains on. On a cluster grpokit "
            "did not start, keep the learner's GPUs out of Ray (`ray start --num-gpus N` or CUDA_VISIBLE_DEVICES "
            "without them on the learner's node), or set distributed.address: null to let grpokit start one."
        )
