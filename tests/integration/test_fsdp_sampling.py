"""FSDP sampling on 2 gloo ranks (grpokit/distributed/fsdp.py, ``Lockstep``): grpokit's engine samples from the
sharded model as it is, each decoder layer gathered for its forward and freed after, the ranks calling forward in
lockstep (a rank whose rows are done pads). Before, every rank gathered the whole model for sampling
(``unsharded()``): the peak of gathered parameter bytes below was then the whole model's."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from shared_helpers import sampling_params

from grpokit.distributed.fsdp_probe import GatheredBytes

pytestmark = pytest.mark.slow
WORLD = 2
T = 8  # max completion length
G = 2  # completions per prompt


def sample(engine, prompts, seeds, params):
    from grpokit.rollout.seeding import generate_per_group

    out = generate_per_group(engine, prompts, seeds, G, params)
    return out.completion_ids, out.logprobs, out.completion_mask


def rank_main(rank: int, model_dir: str, init_file: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from grpokit.distributed.torch_dist import DistContext
        from grpokit.models.loading import load_model
        from grpokit.rollout.engine import HFRolloutEngine

        cpu = torch.device("cpu")
        params = sampling_params(max_completion_length=T)
        # rank 0: one group, rank 1: two groups of another prompt length (two generate calls)
        prompts = [[5, 6, 7]] if rank == 0 else [[8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
        seeds = [100 + rank * 10 + j for j in range(len(prompts))]

        # the unsharded model, sampled alone: first with no EOS, then rank 0 stops each row at its 2nd token
        plain = load_model(model_dir, torch.float32, cpu)
        never = HFRolloutEngine(plain, [-1], 0, cpu)
        tokens, _, _ = sample(never, prompts, seeds, params)
        eos = sorted(set(tokens[:, 1].tolist())) if rank == 0 else [-1]  # rank 0's rows all end by step 2
        expected = sample(HFRolloutEngine(plain, eos, 0, cpu), prompts, seeds, params)
        eval_expected = sample(HFRolloutEngine(plain, [-1], 0, cpu), [[20, 21]], [7], params)

        # the same prompts, seeds and EOS on the sharded model, the ranks in lockstep
        procs = DistContext(rank=rank, world_size=WORLD)
        model = procs.wrap(load_model(model_dir, torch.float32, cpu), cpu, "fsdp")
        engine = HFRolloutEngine(model, eos, 0, cpu)
        # the fast paths that copy the weights are turned on, yet a sharded model gets neither (the fused decoder is
        # also refused by its own checks: this half holds without the is_sharded guard in kernels/selection.py)
        fast = dataclasses.replace(engine.kernels, fused_decoder=True, packed_linears=True)
        copies = (
            fast.decoder(plain, torch.float32, 4) is not None,  # the unsharded Llama would be fused
            fast.decoder(model, torch.float32, 4),
            type(fast.sampling_linears(model, 4, cpu)).__name__,
        )
        with GatheredBytes(model) as gathered:
            with procs.lockstep(model) as lockstep:
                got = sample(engine, prompts, seeds, params)
            counts = (lockstep.forwards, lockstep.padding)
            # evaluation: rank 0 alone samples, rank 1 only pads
            with procs.lockstep(model) as lockstep:
                eval_got = sample(engine, [[20, 21]], [7], params) if rank == 0 else None
            eval_counts = (lockstep.forwards, lockstep.padding)
            after = gathered.live()
        values = (
            rank,
            expected,
            got,
            eval_expected,
            eval_got,
            counts,
            eval_counts,
            gathered.sizes,
            gathered.at_start,
            gathered.peak,
            after,
            copies,
        )
        results.put(pickle.dumps(values))  # bytes: torch's queue would share tensors that die with this process
    except Exception as exc:
        results.put(pickle.dumps((rank, f"{type(exc).__name__}: {exc}")))
        raise
    finally:
        dist.destroy_process_group()


def test_sharded_sampling_in_lockstep_matches_the_unsharded_model_and_never_gathers_it_whole(tmp_path):
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    # 4 layers and a small vocabulary: the layers are most of the model, so "root + one layer" is well below it
    tokenizer = build_word_tokenizer([f"w{i}" for i in range(40)])
    build_tiny_causal_lm(tmp_path / "model", tokenizer, arch="llama", hidden_size=32, num_layers=4, num_heads=2)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, str(tmp_path / "model"), str(tmp_path / "pg"), results))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        # generous: two fresh interpreters import torch and transformers; a hang in sampling also ends here
        rank, *values = pickle.loads(results.get(timeout=300))
        out[rank] = values
    for p in procs:
        p.join(timeout=300)
    assert all(len(v) > 1 for v in out.values()), out
    for rank in range(WORLD):
        expected, got, *_, sizes, at_start, peak, after, copies = out[rank]
        assert copies == (True, None, "nullcontext")  # no fused decoder, no packed weights on the sharded model
        # (a) the same completions as the unsharded model (same seeds), though the ranks decode different lengths
        assert torch.equal(got[0], expected[0]), rank
        assert torch.equal(got[2], expected[2]), rank
        torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=0)
        # (b) never the whole model: at most the root's and one layer's full parameters at once
        full, root = sum(sizes.values()), sizes[""]
        layer = max(size for name, size in sizes.items() if name)
        assert at_start == 0 and after == 0  # nothing gathered before, and everything freed after
        assert peak == root + layer  # the root stays gathered while each layer is gathered, run and freed
        assert peak < 0.5 * full
    lengths0 = out[0][1][2].sum(-1)  # rank 0's rows stop by their 2nd token, rank 1's run all T steps
    assert lengths0.max() <= 2 and (out[1][1][2].sum(-1) == T).all()
    (own0, pad0), (own1, pad1) = out[0][4], out[1][4]
    assert own0 + pad0 == own1 + pad1  # the same number of forward calls on both ranks
    assert own1 == 2 * T and pad1 == 0  # rank 1: two groups, each a prefill and T - 1 decoding steps
    assert own0 <= 2 and pad0 == own1 - own0  # rank 0: a prefill and at most one step, then padding
    # evaluation: rank 0 samples alone, rank 1 pads once per forward call of rank 0
    eval_expected, eval_got = out[0][2], out[0][3]
    assert out[1][3] is None
    assert torch.equal(eval_got[0], eval_expected[0])
    assert out[0][5] == (T, 0) and out[1][5] == (0, T)
