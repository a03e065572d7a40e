"""Each rank's parameter memory under FSDP2 against DDP, for the same model, on CPU gloo ranks.

A random-init Qwen2 (``--hidden``, ``--layers``) saved to a temporary folder, then ``--ranks`` processes: for DDP
every rank loads it and wraps it (DistributedDataParallel); for FSDP rank 0 loads it on the CPU, the others build it
on the meta device, and ``DistContext.wrap(..., "fsdp")`` shards it and fills the shards from rank 0. Measured per
rank, in bytes of parameter storage held by that rank (``untyped_storage().nbytes()`` of each distinct parameter,
local shards for FSDP): right after loading, and after wrapping (what stays through training). Rank 0 under FSDP
holds the whole model on its CPU while it loads (the source of every shard); no other rank ever does.
Prints one line per rank and the ratio FSDP / DDP after wrapping (1 / ranks when sharding works):

    python bench/fsdp_memory.py                       # 2 ranks, 27 M parameters, ~40 s
    python bench/fsdp_memory.py --ranks 4 --layers 8
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def param_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.is_meta:
            continue
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def rank_main(rank: int, world: int, strategy: str, model_dir: str, init_file: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        from grpokit.distributed.fsdp import initial_placement
        from grpokit.distributed.torch_dist import DistContext
        from grpokit.modeling import load_model

        cpu = torch.device("cpu")
        where = initial_placement(strategy=strategy, world_size=world, rank=rank, plain_load=True) or cpu
        model = load_model(model_dir, torch.float32, where)
        loaded = param_bytes(model)
        model = DistContext(rank=rank, world_size=world).wrap(model, cpu, strategy)
        results.put(pickle.dumps((strategy, rank, loaded, param_bytes(model))))
    finally:
        dist.destroy_process_group()


def measure(strategy: str, world: int, model_dir: str, tmp: str) -> dict[int, tuple[int, int]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = os.path.join(tmp, f"pg-{strategy}")
    procs = [
        ctx.Process(target=rank_main, args=(r, world, strategy, model_dir, init_file, results)) for r in range(world)
    ]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        _, rank, loaded, kept = pickle.loads(results.get(timeout=600))
        out[rank] = (loaded, kept)
    for p in procs:
        p.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    a = parser.parse_args()
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_word_tokenizer([f"w{i}" for i in range(20_000)])
        model, _ = build_tiny_causal_lm(
            tmp, tokenizer, arch="qwen2", hidden_size=a.hidden, num_layers=a.layers, num_heads=8
        )
        total = sum(p.numel() for p in model.parameters())
        del model
        ddp, fsdp = measure("ddp", a.ranks, tmp, tmp), measure("fsdp", a.ranks, tmp, tmp)
    mb = 2**20
    print(f"fsdp_memory: Qwen2 {total / 1e6:.1f} M parameters (float32), {a.ranks} gloo ranks")
    for rank in range(a.ranks):
        print(
            f"rank {rank}: loaded  ddp {ddp[rank][0] / mb:7.1f} MB  fsdp {fsdp[rank][0] / mb:7.1f} MB | "
            f"after wrap  ddp {ddp[rank][1] / mb:7.1f} MB  fsdp {fsdp[rank][1] / mb:7.1f} MB  "
            f"ratio {fsdp[rank][1] / ddp[rank][1]:.2f}"
        )


if __name__ == "__main__":
    main()
