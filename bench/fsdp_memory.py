"""Each rank's parameter memory under FSDP2 against DDP, for the same model, on CPU gloo ranks.

A random-init Qwen2 (``--hidden``, ``--layers``) saved to a temporary folder, then ``--ranks`` processes: for DDP
every rank loads it and wraps it (DistributedDataParallel); for FSDP rank 0 loads it on the CPU, the others build it
on the meta device, and ``DistContext.wrap(..., "fsdp")`` shards it and fills the shards from rank 0. Measured per
rank, in bytes of parameter storage held by that rank (``untyped_storage().nbytes()`` of each distinct parameter,
local shards for FSDP): right after loading, and after wrapping (what stays through training). Rank 0 under FSDP
holds the whole model on its CPU while it loads (the source of every shard); no other rank ever does.
Then each rank samples (grpokit's engine, ``--prompts`` prompts x 2 completions x ``--tokens`` tokens, in
``DistContext.lockstep``; rank 0 stops its rows at their first token, the others run every step): the sampling peak
is the parameters held plus, under FSDP, the peak of full parameters gathered at once
(:class:`grpokit.distributed.fsdp_probe.GatheredBytes`); DDP samples from the whole model it holds.
Prints one line per rank with the ratios FSDP / DDP after wrapping (1 / ranks when sharding works) and while
sampling (shards + root + one layer, against the whole model; and what gathering the whole model for sampling, as
grpokit did before, held). The root (embeddings, head) is a large part of a small model, so the sampling ratio
shows the sharding with more layers and ranks:

    python bench/fsdp_memory.py                       # 2 ranks, 27 M parameters, ~40 s
    python bench/fsdp_memory.py --ranks 4 --layers 16
"""

from __future__ import annotations

import argparse
import contextlib
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


def rank_main(
    rank: int, world: int, strategy: str, model_dir: str, init_file: str, prompts: int, tokens: int, results
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        from grpokit.distributed.fsdp import initial_placement
        from grpokit.distributed.fsdp_probe import GatheredBytes
        from grpokit.distributed.torch_dist import DistContext
        from grpokit.models.loading import load_model
        from grpokit.rollout.engine import HFRolloutEngine
        from grpokit.rollout.types import SamplingParams

        cpu = torch.device("cpu")
        where = initial_placement(strategy=strategy, world_size=world, rank=rank, plain_load=True) or cpu
        model = load_model(model_dir, torch.float32, where)
        loaded = param_bytes(model)
        procs = DistContext(rank=rank, world_size=world)
        model = procs.wrap(model, cpu, strategy)
        kept = param_bytes(model)
        policy = model.module if strategy == "ddp" else model  # DDP samples from the bare model
        vocab = policy.config.vocab_size
        eos = list(range(vocab)) if rank == 0 else [-1]  # rank 0 is done after one token, the others run on
        engine = HFRolloutEngine(policy, eos, 0, cpu, seed=rank)
        batch = [[4 + (7 * i + j) % (vocab - 4) for j in range(8)] for i in range(prompts)]
        gathered = GatheredBytes(model) if strategy == "fsdp" else contextlib.nullcontext()
        with gathered, procs.lockstep(policy):
            engine.generate(batch, 2, SamplingParams.plain(tokens))
        if strategy == "fsdp":  # (gathered peak, root unit, largest layer unit, whole model) in full bytes
            sizes = gathered.sizes
            units = (gathered.peak, sizes[""], max(v for k, v in sizes.items() if k), sum(sizes.values()))
        else:
            units = (0, 0, 0, 0)
        results.put(pickle.dumps((strategy, rank, loaded, kept, kept + units[0], *units)))
    finally:
        dist.destroy_process_group()


def measure(strategy: str, world: int, model_dir: str, tmp: str, prompts: int, tokens: int) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = os.path.join(tmp, f"pg-{strategy}")
    procs = [
        ctx.Process(target=rank_main, args=(r, world, strategy, model_dir, init_file, prompts, tokens, results))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        _, rank, *sizes = pickle.loads(results.get(timeout=600))
        out[rank] = sizes
    for p in procs:
        p.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2, help="prompts each rank samples (2 completions each)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per completion")
    a = parser.parse_args()
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_word_tokenizer([f"w{i}" for i in range(20_000)])
        model, _ = build_tiny_causal_lm(
            tmp, tokenizer, arch="qwen2", hidden_size=a.hidden, num_layers=a.layers, num_heads=8
        )
        total = sum(p.numel() for p in model.parameters())
        del model
        ddp, fsdp = (measure(s, a.ranks, tmp, tmp, a.prompts, a.tokens) for s in ("ddp", "fsdp"))
    mb = 2**20
    print(f"fsdp_memory: Qwen2 {total / 1e6:.1f} M parameters (float32), {a.ranks} gloo ranks")
    for rank in range(a.ranks):
        print(
            f"rank {rank}: loaded  ddp {ddp[rank][0] / mb:7.1f} MB  fsdp {fsdp[rank][0] / mb:7.1f} MB | "
            f"after wrap  ddp {ddp[rank][1] / mb:7.1f} MB  fsdp {fsdp[rank][1] / mb:7.1f} MB  "
            f"ratio {fsdp[rank][1] / ddp[rank][1]:.2f}"
        )
    for rank in range(a.ranks):
        _, kept, peak, gathered, root, layer, whole = fsdp[rank]
        print(
            f"rank {rank}: sampling peak  ddp {ddp[rank][2] / mb:7.1f} MB  fsdp {peak / mb:7.1f} MB "
            f"(shards {kept / mb:.1f} + gathered {gathered / mb:.1f} = root {root / mb:.1f} + one layer "
            f"{layer / mb:.1f})  ratio {peak / ddp[rank][2]:.2f}; gathering the whole model instead: "
            f"{(kept + whole) / mb:.1f} MB, ratio {(kept + whole) / ddp[rank][2]:.2f}"
        )


if __name__ == "__main__":
    main()
