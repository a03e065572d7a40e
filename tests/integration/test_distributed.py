"""torch.distributed data parallelism: torchrun with gloo on CPU against a single process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from shared_helpers import TARGET_REWARD, sampling_params, tiny_run_config

from grpokit import GRPOConfig
from grpokit.cli import main
from grpokit.distributed import DistContext
from grpokit.rewards import RewardRunner
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.seeding import concat_rollouts, generate_per_group, group_seed
from grpokit.store import RolloutStore
from grpokit.system.processes import RewardBatch, SingleProcess


def write_config(tmp_path: Path, model_dir: Path, prompts: list[dict], name: str, **optim) -> Path:
    return tiny_run_config(
        tmp_path,
        model_dir,
        max_steps=3,
        # a target length in characters varies within every group, so advantages, losses and updates are not zero
        rewards=[TARGET_REWARD, {"name": "length", "target_length": 20, "unit": "chars"}],
        name=name,
        prompts=prompts,
        algo={"scale_rewards": "batch"},
        generation={"max_completion_length": 6},
        optim={"lr_scheduler_type": "constant", **optim},
        run={"save_steps": 0},
        distributed={"seed_per_group": True},
    )


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def torchrun(config: Path) -> None:
    """``grpokit train config`` in two processes under torchrun. One thread per rank, quiet warnings,
    and faulthandler on: a rank that dies in native code (a signal, no Python exception) still prints
    where each of its threads was."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "grpokit",
            "train",
            str(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, rank_error(proc.stderr)


def rank_error(stderr: str) -> str:
    """The first rank's own error in torchrun's stderr (a crash dump or a traceback, with what native
    code printed just before it, such as a C++ exception), else its tail."""
    found = [i for i in (stderr.find("Fatal Python error"), stderr.find("Traceback")) if i >= 0]
    return stderr[max(min(found) - 1500, 0) : min(found) + 4000] if found else stderr[-3000:]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path, tiny_model_dir, word_prompts):
    # Same global batch: 1 process x 4 per micro-batch x 2 accumulation = 2 processes x 4 x 1 = 8 completions.
    one = write_config(
        tmp_path, tiny_model_dir, word_prompts, "one", per_device_train_batch_size=4, gradient_accumulation_steps=2
    )
    two = write_config(
        tmp_path, tiny_model_dir, word_prompts, "two", per_device_train_batch_size=4, gradient_accumulation_steps=1
    )
    torchrun(two)
    assert main(["train", str(one)]) == 0

    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in m2] == [1, 2, 3]  # rank 0 alone writes metrics: one line per step
    for a, b in zip(m1, m2):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # identical rollouts
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-5)
        assert a["entropy"] == pytest.approx(b["entropy"], abs=1e-5)  # token means over the global batch
    assert all(m["advantage/std"] > 0 for m in m1)  # every step trains on non-zero advantages
    with (
        RolloutStore(tmp_path / "one" / "rollouts.sqlite", readonly=True) as s1,
        RolloutStore(tmp_path / "two" / "rollouts.sqlite", readonly=True) as s2,
    ):
        r1, r2 = s1.rollouts(), s2.rollouts()
    assert len(r2) == 3 * 8  # every completion of both ranks, once
    key = lambda r: (r["step"], r["prompt_index"], r["completion_index"])
    assert sorted(map(key, r1)) == sorted(map(key, r2))
    assert {key(r): r["completion"] for r in r1} == {key(r): r["completion"] for r in r2}
    assert (tmp_path / "two" / "final").is_dir()


def test_group_seed_is_distinct_per_step_and_group():
    # ((seed * P + step) * P + group) mod 2**46, times 2**16, with P = 1_000_003:
    # seed 0, step 1, group 2 -> (1_000_003 + 2) * 65_536 = 65_536_327_680
    assert group_seed(0, 1, 2) == 65_536_327_680
    seeds = {group_seed(42, step, g) for step in range(1, 20) for g in range(50)}
    assert len(seeds) == 19 * 50
    # vLLM seeds a group's G samples seed, seed + 1, ...: no two groups' samples share a seed (G = 64 here)
    children = [s + i for s in seeds for i in range(64)]
    assert len(set(children)) == len(children) and max(children) < 2**63


def test_per_group_sampling_does_not_depend_on_the_split(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = HFRolloutEngine(model, [tok.eos_token_id], tok.pad_token_id, torch.device("cpu"))
    params = sampling_params(max_completion_length=5)
    prompts = [tok(f"w{i} w{i + 1}")["input_ids"] for i in range(4)]
    seeds = [group_seed(7, 3, j) for j in range(4)]
    whole = generate_per_group(engine, prompts, seeds, 3, params)
    halves = [generate_per_group(engine, prompts[a:b], seeds[a:b], 3, params) for a, b in ((0, 1), (1, 4))]
    joined = concat_rollouts(halves, tok.pad_token_id)
    assert torch.equal(whole.completion_ids, joined.completion_ids)
    assert torch.equal(whole.completion_mask, joined.completion_mask)
    assert whole.finish_reasons == joined.finish_reasons
    other = generate_per_group(engine, prompts, [group_seed(7, 4, j) for j in range(4)], 3, params)
    assert not torch.equal(whole.completion_ids[:, :3], other.completion_ids[:, :3])  # another step samples anew


def test_shard_and_single_process_context():
    ctx = DistContext(rank=1, world_size=2)
    assert ctx.shard([10, 11, 12, 13]) == ([12, 13], 2)
    single = SingleProcess()
    t = torch.tensor([1.0, 2.0])
    assert single.gather(t) is t and single.mean_metrics({"a": 1.0}) == {"a": 1.0}


def test_async_rollouts_need_ray():
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match="async_rollouts needs backend: ray"):
        GRPOConfig(async_rollouts=True)


def test_split_rollouts_gives_each_rank_its_groups():
    from grpokit.rollout.seeding import split_rollouts
    from grpokit.rollout.types import Rollouts

    # 4 groups of G = 2: rows 0-1 are group 0, ..., rows 6-7 group 3; 2 ranks take groups {0, 1} and {2, 3}.
    ids = torch.arange(8 * 3).reshape(8, 3)  # [N, T]
    rollouts = Rollouts(
        prompt_ids=[[10], [11], [12], [13]],
        completion_ids=ids,
        completion_mask=torch.ones(8, 3),
        logprobs=-ids.float(),
        finish_reasons=["stop", "length"] * 4,
        num_generations=2,
        policy_version=5,
    )
    first, second = split_rollouts(rollouts, 2)
    assert first.prompt_ids == [[10], [11]] and second.prompt_ids == [[12], [13]]
    assert torch.equal(second.completion_ids, ids[4:]) and torch.equal(second.logprobs, -ids[4:].float())
    assert second.finish_reasons == ["stop", "length"] * 2 and second.policy_version == 5
    assert second.completion_ids.untyped_storage().size() == 4 * 3 * 8  # a copy of its rows, not a view of all 8
    joined = concat_rollouts([first, second], pad_token_id=0)
    assert torch.equal(joined.completion_ids, ids) and joined.finish_reasons == rollouts.finish_reasons
    assert SingleProcess().scatter_objects([first]) is first  # one process: its own share


# Under torchrun with Ray reward workers, rank 0 scores every rank's rows (DistContext.score_rewards(on_main=True)).
# 4 groups of G = 2; rank 0 holds rows 0-3, rank 1 rows 4-7 ("boom" is in rank 1's rows).
SHARED_COMPLETIONS = ["!", "!!", "a", "b!", "boom", "!!!", "c", "!!!!"]
SCORED_BY: list[int] = []  # lengths of the batches this process's exclaim scored


def exclaim(prompts, completions, **columns):
    SCORED_BY.append(len(completions))
    return [float(c.count("!")) for c in completions]


def raises_on_boom(prompts, completions, **columns):
    if any(c == "boom" for c in completions):
        raise RuntimeError("boom in the batch")
    return [1.0] * len(completions)


def one_value(prompts, completions, **columns):
    return [1.0]


def _rank_scores(rank: int, init_file: str, out_dir: str) -> None:
    import datetime
    import pickle

    import torch.distributed as tdist

    from grpokit.rewards import RewardRunner

    # a hang (a rank waiting for a broadcast that never comes) fails the test instead of blocking it
    tdist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    ctx = DistContext(rank=rank, world_size=2)
    rows = slice(4 * rank, 4 * rank + 4)
    args = (["p"] * 4, SHARED_COMPLETIONS[rows], {"n": list(range(8))[rows]}, 2)
    outcomes = {}
    for case in ("ok", "wrong_length", "crash"):
        # on threads here (isolate=False), so SCORED_BY sees the calls
        runner = RewardRunner(
            [exclaim, raises_on_boom] if case != "wrong_length" else [exclaim, one_value], isolate=False
        )
        if case == "crash" and rank == 0:  # e.g. the Ray cluster went away under rank 0's pool

            def lost(*a, **k):
                raise ConnectionError("lost the Ray cluster")

            runner.score_values = lost
        try:
            outcomes[case] = ("ok", *ctx.score_rewards(runner, RewardBatch(*args), on_main=True), list(SCORED_BY))
        except Exception as exc:
            outcomes[case] = ("error", type(exc).__name__, str(exc))
    (Path(out_dir) / f"{rank}.pkl").write_bytes(pickle.dumps(outcomes))
    tdist.destroy_process_group()


def test_rank_0_scores_the_global_batch_and_its_errors_reach_every_rank(tmp_path):
    import pickle

    torch.multiprocessing.spawn(_rank_scores, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [pickle.loads((tmp_path / f"{r}.pkl").read_bytes()) for r in range(2)]
    expected = RewardRunner([exclaim, raises_on_boom]).score(["p"] * 8, SHARED_COMPLETIONS, group_size=2)
    for rank, outcomes in enumerate(ranks):
        status, mine, everyone, scored = outcomes["ok"]
        assert status == "ok"
        # exclaim ran once, on rank 0, on all 8 rows; never on rank 1
        assert scored == ([8] if rank == 0 else [])
        # "!" counts of the 8 completions; raises_on_boom failed on the whole batch (it holds "boom")
        assert everyone.per_func[:, 0].tolist() == [1.0, 2.0, 0.0, 1.0, 0.0, 3.0, 0.0, 4.0]
        torch.testing.assert_close(everyone.combined, expected.combined)
        assert everyone.errors == ["raises_on_boom: RuntimeError: boom in the batch"] * 8
        assert everyone.error_counts == {"exclaim": 0, "raises_on_boom": 8}
        assert mine.per_func[:, 0].tolist() == everyone.per_func[4 * rank : 4 * rank + 4, 0].tolist()
        assert mine.errors == everyone.errors[:4] and mine.error_counts == {"exclaim": 0, "raises_on_boom": 4}
        # a contract violation stops every rank with the same RewardError naming the function
        assert outcomes["wrong_length"] == (
            "error",
            "RewardError",
            "reward 'one_value' returned 1 values for 8 completions: [1.0]",
        )
    assert ranks[0]["crash"] == ("error", "ConnectionError", "lost the Ray cluster")
    assert ranks[1]["crash"] == (
        "error",
        "RewardError",
        "rank 0 could not score the rewards: ConnectionError: lost the Ray cluster",
    )


def test_trainable_state_and_lockstep_on_a_plain_module():
    from grpokit.distributed.torch_dist import DistContext, trainable_state
    from grpokit.system.processes import is_sharded

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    model[0].requires_grad_(False)  # frozen: never published to the rollout workers
    state = trainable_state(model)
    assert sorted(state) == ["1.bias", "1.weight"]
    assert torch.equal(state["1.weight"], model[1].weight) and not state["1.weight"].requires_grad
    assert not is_sharded(model)
    with DistContext(rank=0, world_size=2).lockstep(model):  # not sharded: no collective, nothing to agree on
        assert model(torch.ones(1, 2)).shape == (1, 1)
