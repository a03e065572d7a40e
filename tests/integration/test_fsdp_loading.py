"""FSDP2 past one device, on 2 gloo ranks (grpokit/distributed/fsdp.py): rank 1 builds the model on the meta device
and never holds its weights, rank 0 loads them and every shard is filled from rank 0's state dict; the units gather
in the compute dtype and keep float32 shards (MixedPrecisionPolicy); weights leave the learner one parameter at a
time. Before: every rank loaded the whole model, there was no mixed-precision policy, and the Ray workers' copy was
one full state dict gathered at once."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
WORLD = 2


def rank_main(rank: int, model_dir: str, init_file: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from grpokit.distributed.fsdp import full_state_dict, initial_placement
        from grpokit.distributed.torch_dist import DistContext, trainable_state
        from grpokit.models.loading import load_model

        where = initial_placement(strategy="fsdp", world_size=WORLD, rank=rank, plain_load=True)
        model = load_model(model_dir, torch.float32, where)
        on_meta = all(p.is_meta for p in model.parameters())
        total = sum(p.numel() for p in model.parameters())
        model = DistContext(rank=rank, world_size=WORLD).wrap(
            model, torch.device("cpu"), "fsdp", compute_dtype=torch.bfloat16
        )
        local = sum(p.to_local().numel() for p in model.parameters())
        shard_dtypes = {p.dtype for p in model.parameters()}
        seen = []
        layer = model.model.layers[0].mlp.down_proj
        hook = layer.register_forward_pre_hook(lambda m, args: seen.append(m.weight.dtype))
        logits = model(input_ids=torch.tensor([[4, 5, 6]])).logits
        hook.remove()
        state = full_state_dict(model)
        streamed = trainable_state(model)
        values = (rank, where.type, on_meta, total, local, shard_dtypes, seen, logits.detach(), state, streamed)
        results.put(pickle.dumps(values))  # bytes: torch's queue would share tensors that die with this process
    except Exception as exc:
        results.put(pickle.dumps((rank, f"{type(exc).__name__}: {exc}")))
        raise
    finally:
        dist.destroy_process_group()


def test_rank_1_never_holds_the_model_and_its_shard_comes_from_rank_0(tmp_path, tiny_model_dir):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, str(tiny_model_dir), str(tmp_path / "pg"), results))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, *values = pickle.loads(
            results.get(timeout=300)
        )  # generous: two fresh interpreters import torch and transformers
        out[rank] = values
    for p in procs:
        p.join(timeout=300)
    assert all(len(v) > 1 for v in out.values()), out
    saved = load_file(tiny_model_dir / "model.safetensors")
    (where0, meta0, total, local0, dtypes0, seen0, logits0, state0, streamed0) = out[0]
    (where1, meta1, _, local1, dtypes1, seen1, logits1, state1, streamed1) = out[1]
    assert (where0, meta0) == ("cpu", False)  # rank 0 loads the weights, on the CPU
    assert (where1, meta1) == ("meta", True)  # rank 1 builds the architecture only
    # each rank keeps about half of the parameters (dim-0 shards; odd sizes round up on rank 0)
    assert local0 + local1 == total and max(local0, local1) < 0.55 * total
    assert dtypes0 == dtypes1 == {torch.float32}  # the master shards stay float32
    assert seen0 == seen1 == [torch.bfloat16]  # a unit computes on parameters gathered in the compute dtype
    assert torch.allclose(logits0, logits1)
    for name, tensor in saved.items():
        assert torch.equal(state0[name], tensor), name  # rank 1's shards were filled from rank 0's weights
    assert state1 == {} and streamed1 == {}
    assert set(streamed0) == {n for n in state0 if n in streamed0} and len(streamed0) > 0
    for name, tensor in streamed0.items():
        assert torch.equal(tensor, state0[name]), name
