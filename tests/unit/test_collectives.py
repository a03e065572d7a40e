"""The trainer's collectives on a CUDA process group, checked on a CPU (grpokit/distributed/torch_dist.py).

A torchrun rank on CUDA used to join an NCCL-only group, while the trainer gathers CPU tensors (advantages, lengths,
token counts, float64 metrics): NCCL serves no CPU tensor, so the first step failed with "No backend type associated
with device type cpu". Here a CUDA-only gloo group (``cuda:gloo``) stands in for NCCL-only and reproduces that error;
the group grpokit now makes (``cpu:gloo,cuda:nccl``, built with gloo in NCCL's place) runs every collective. The
choice of backend and device_id is checked with mocked CUDA facts."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpokit.distributed import torch_dist
from grpokit.distributed.torch_dist import DistContext, process_group_backend

WORLD = 2


def trainer_collectives(rank: int, backend: str, init_file: str, results) -> None:
    """What a training step asks of its processes (train/trainer.py, train/accelerator.py), on ``backend``."""
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from grpokit.train.learning.accelerator import gather_ragged

        procs = DistContext(rank=rank, world_size=WORLD)
        advantages = procs.gather(torch.full((3,), float(rank)))  # float32 CPU tensors
        tokens = procs.sum(torch.tensor(float(rank + 1)))
        metrics = procs.mean_metrics({"loss": float(rank), "kl": 1.0})  # float64
        ragged = gather_ragged(procs, torch.arange(rank + 1, dtype=torch.float32))
        objects = procs.gather_objects({"rank": rank})
        procs.barrier()
        results.put((rank, advantages.tolist(), float(tokens), metrics, ragged.tolist(), objects))
    except Exception as exc:  # reported to the test, which asserts on the message
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def run_two_ranks(backend: str, tmp_path) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = str(tmp_path / "pg")
    procs = [ctx.Process(target=trainer_collectives, args=(r, backend, init_file, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    # generous: two fresh interpreters importing torch on a busy machine; nothing here waits on a clock otherwise
    out = {}
    for _ in procs:
        rank, *values = results.get(timeout=300)
        out[rank] = values
    for p in procs:
        p.join(timeout=300)
    return out


def test_a_cuda_only_group_fails_on_the_trainers_cpu_tensors(tmp_path):
    out = run_two_ranks("cuda:gloo", tmp_path)  # an NCCL-only group's shape: no backend for CPU tensors
    for rank in range(WORLD):
        assert "No backend type associated with device type cpu" in out[rank][0], out[rank]


def test_the_two_backend_group_runs_every_collective_of_a_step(tmp_path):
    out = run_two_ranks(process_group_backend(cuda=True, gpu_backend="gloo"), tmp_path)
    for rank in range(WORLD):
        advantages, tokens, metrics, ragged, objects = out[rank]
        assert advantages == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
        assert tokens == 3.0  # 1 + 2
        assert metrics == {"kl": 1.0, "loss": 0.5}
        assert ragged == [0.0, 0.0, 1.0]  # rank 0's [0], rank 1's [0, 1]
        assert objects == [{"rank": 0}, {"rank": 1}]


def test_a_cuda_rank_joins_with_nccl_for_cuda_and_gloo_for_cpu(monkeypatch):
    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.setdefault("set_device", index))
    monkeypatch.setattr(torch_dist.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch_dist.dist, "init_process_group", lambda **kw: calls.update(kw))
    procs = torch_dist.init_distributed()
    assert (procs.rank, procs.world_size, procs.local_rank) == (1, 2, 1)
    assert calls == {"set_device": 1, "backend": "cpu:gloo,cuda:nccl", "device_id": torch.device("cuda", 1)}


def test_a_cpu_rank_joins_with_gloo(monkeypatch):
    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch_dist.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch_dist.dist, "init_process_group", lambda **kw: calls.update(kw))
    torch_dist.init_distributed()
    assert calls == {"backend": "gloo", "device_id": None}


def test_lockstep_flag_lives_where_the_group_serves_it():
    # Lockstep's all_reduce flag (grpokit/distributed/fsdp.py): the CPU wherever the group has gloo, so grpokit's
    # "cpu:gloo,cuda:nccl" group runs it on gloo; the model's GPU for an NCCL-only group, which serves no CPU tensor
    from grpokit.distributed.fsdp import flag_device

    gpu = torch.device("cuda", 1)
    assert flag_device(process_group_backend(True), gpu) == torch.device("cpu")
    assert flag_device(process_group_backend(False), torch.device("cpu")) == torch.device("cpu")
    assert flag_device("nccl", gpu) == gpu
