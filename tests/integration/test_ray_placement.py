"""Ray never gives the learner's GPU to a rollout or reward actor (grpokit/distributed/placement.py), checked with
logical GPUs on a CPU machine (``num_gpus=2``: Ray books GPUs by id without touching one), and rollout workers load
published weights strictly (distributed/ray_rollout.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from grpokit.config import ConfigError
from grpokit.distributed.placement import actor_options, learner_gpu_ids
from grpokit.distributed.ray_rollout import RayRolloutEngine, RolloutWorker, connect, load_published

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = pytest.mark.ray


def gpus_and_visible():
    return [str(g) for g in ray.get_gpu_ids()], os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.fixture()
def two_gpu_node(monkeypatch):
    """This CPU machine as a node with two GPUs, the learner on the first (cuda:0)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this module by name
    yield learner_gpu_ids(torch.device("cuda", 0))
    ray.shutdown()


def test_a_local_cluster_is_started_without_the_learners_gpu(two_gpu_node):
    assert two_gpu_node == ["0"]
    connect(None, num_cpus=2, learner_gpus=two_gpu_node)  # before: Ray took both GPUs, the learner's included
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the learner's own view is left as it was
    assert ray.cluster_resources().get("GPU") == 1
    probe = ray.remote(gpus_and_visible)
    assert ray.get(probe.options(**actor_options(0.5, 1)).remote()) == (["1"], "1")
    # an actor asking for no GPU sees none (Ray would leave it the node's CUDA_VISIBLE_DEVICES)
    assert ray.get(probe.options(**actor_options(0.5, 0)).remote()) == ([], "")
    with pytest.raises(ConfigError, match="need 2 GPUs, but Ray has 1 besides the learner's"):
        RayRolloutEngine(torch.nn.Linear(2, 2), [0], 0, num_workers=2, worker_cpus=0.5, worker_gpus=1)


def test_on_a_cluster_offering_the_learners_gpu_a_worker_refuses_to_start(two_gpu_node):
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)  # a cluster grpokit did not start
    worker = ray.remote(**actor_options(0.5, 2))(RolloutWorker).remote(
        torch.nn.Linear(2, 2), [0], 0, True, None, tuple(two_gpu_node)
    )
    with pytest.raises(ray.exceptions.RayActorError, match="GPU 0, which the learner trains on"):
        ray.get(worker.pid.remote())


def test_published_weights_load_strictly():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[1].requires_grad_(False)  # frozen: never published (LoRA's base, say)
    state = {k: torch.ones_like(v) for k, v in model.state_dict().items() if k.startswith("0.")}
    load_published(model, state, torch.device("cpu"))
    assert torch.equal(model[0].weight, torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"missing \['0.bias'\], unexpected \['0.b'\]"):
        load_published(model, {"0.weight": state["0.weight"], "0.b": state["0.bias"]}, torch.device("cpu"))
