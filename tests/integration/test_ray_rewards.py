"""Ray reward workers on a local cluster: same results as in-process, shipped by value, error
semantics, a worker killed mid-scoring, and the CLI end to end."""

from __future__ import annotations

import functools
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from grpokit.cli import main
from grpokit.distributed.ray_rewards import RayRewardPool
from grpokit.rewards import RewardError, RewardRunner
from grpokit.store import RolloutStore

ray = pytest.importorskip("ray", reason="Ray tests need the ray extra: pip install 'grpokit[ray]'")
pytestmark = pytest.mark.ray


# The reward timeout of the tests that expect no timeout. A worker's first call runs after its Ray process has started
# and unpickled the functions (torch, math-verify ...), and a worker that dies is restarted within the same deadline
# (timeout + the pool's grace): over 10 s (the default) on a loaded 2-core machine. A deadlock guard, not a measure.
NO_TIMEOUT = 300.0


def ray_pool(workers: int, worker_cpus: float = 1.0):
    """What the trainer passes as the runner's pool with num_reward_workers > 0."""
    return functools.partial(RayRewardPool, workers=workers, worker_cpus=worker_cpus)


USER_FILE = textwrap.dedent(
    """
    import os
    import time

    def log_pid(log):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")

    def length(prompts, completions, log=None, **columns):
        if log:
            log_pid(log)
        return [float(len(c)) for c in completions]

    def exclaim(prompts, completions, **columns):
        return [float(c.count("!")) for c in completions]

    def raises_on_boom(prompts, completions, **columns):
        if any(c.startswith("boom") for c in completions):
            raise RuntimeError("boom in this chunk")
        return [1.0] * len(completions)

    def one_value(prompts, completions, **columns):
        return [1.0]

    def sleepy(prompts, completions, log, **columns):
        log_pid(log)
        time.sleep(60)

    def dies_once(prompts, completions, flag, log, **columns):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {completions[0]}\\n")
        if os.path.exists(flag):
            try:
                os.unlink(flag)  # only the process that deletes the flag dies: exactly one death
            except FileNotFoundError:
                pass
            else:
                os._exit(1)
        return [float(len(c)) for c in completions]

    def always_dies(prompts, completions, **columns):
        os._exit(1)

    def gil_hog(prompts, completions, **columns):
        import re
        re.match(r"^(a+)+$", "a" * 40 + "b")  # holds the GIL for minutes: the actor's timeout thread cannot return
        return [0.0] * len(completions)

    def always_raises(prompts, completions, **columns):
        raise ValueError(f"cannot score {len(completions)} completions")
    """
)


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    from grpokit.distributed.ray_rollout import connect

    connect(None, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture()
def reward_file(tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(USER_FILE)
    return path


def pids(log: Path) -> list[int]:
    return [int(line.split()[0]) for line in log.read_text().splitlines()]


# 3 groups of 2: over 2 workers the chunks are rows [0, 4) and [4, 6) (whole groups).
COMPLETIONS = ["#### 4!", "boom 5", "the answer is 7!!", r"\boxed{6}", "x" * 18, "!"]
COLUMNS = {"answer": ["4", "5", "7", None, "1", "2"], "completion_lengths": [3, 17, 21, 5, 18, 1]}
PROMPTS = ["q"] * len(COMPLETIONS)


def test_ray_workers_match_in_process_and_need_no_file_on_the_worker(reward_file, tmp_path):
    # A module of our own on the learner's path only: it must travel by value too.
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "my_module_reward.py").write_text(
        "def shout(prompts, completions, **k):\n    return [float(c.isupper()) for c in completions]\n"
    )
    sys.path.insert(0, str(module_dir))
    try:
        log = tmp_path / "pids.log"
        specs = [
            "accuracy",
            {"name": "length", "max_length": 20, "cache_length": 4, "weight": 0.5},
            {"name": f"{reward_file}:length", "log": str(log)},
            f"{reward_file}:raises_on_boom",
            "my_module_reward:shout",
        ]
        expected = RewardRunner(specs).score(PROMPTS, COMPLETIONS, COLUMNS, group_size=2)
        log.unlink()
        runner = RewardRunner(specs, timeout=NO_TIMEOUT, pool=ray_pool(2, 0.5))
        # Neither the file nor the module can be loaded by name or path on a worker now.
        reward_file.rename(tmp_path / "moved.py")
        (module_dir / "my_module_reward.py").rename(module_dir / "moved_module.py")
        result = runner.score(PROMPTS, COMPLETIONS, COLUMNS, group_size=2)
        runner.close()
    finally:
        sys.path.remove(str(module_dir))
    workers = set(pids(log))
    assert len(workers) == 2 and os.getpid() not in workers  # two chunks, each in another process
    # raises_on_boom fails on the whole batch in-process but only on the chunk [0, 4) that holds "boom":
    # rows 4 and 5 get 1.0 (weight 1) from it.
    extra = torch.tensor([0, 0, 0, 0, 1.0, 1.0], dtype=torch.float64)
    assert torch.isnan(expected.per_func[:, 3]).all()
    torch.testing.assert_close(result.per_func[:, [0, 1, 2, 4]], expected.per_func[:, [0, 1, 2, 4]], equal_nan=True)
    assert result.per_func[4:, 3].tolist() == [1.0, 1.0] and torch.isnan(result.per_func[:4, 3]).all()
    torch.testing.assert_close(result.combined, expected.combined + extra)
    assert result.errors[:4] == ["raises_on_boom: RuntimeError: boom in this chunk"] * 4
    assert result.errors[4:] == [None, None]
    assert result.error_counts == {"accuracy": 0, "length": 0, "length_2": 0, "raises_on_boom": 4, "shout": 0}
    assert result.per_func.dtype == torch.float64


def test_ray_worker_contract_errors_stop_with_the_function_named(reward_file):
    runner = RewardRunner(
        [f"{reward_file}:exclaim", f"{reward_file}:one_value"], timeout=NO_TIMEOUT, pool=ray_pool(2, 0.5)
    )
    with pytest.raises(RewardError, match=r"reward 'one_value' returned 1 values for 2 completions: \[1.0\]"):
        runner.score(["p"] * 4, ["!", "!!", "a", "b"], group_size=2)
    runner.close()
    with pytest.raises(RewardError, match="cannot be sent to Ray reward workers"):
        lock = __import__("threading").Lock()
        RewardRunner([lambda p, c, **k: [float(lock.locked())] * len(c)], pool=ray_pool(1))


def test_ray_worker_timeout_gives_none_and_replaces_the_worker(reward_file, tmp_path):
    log = tmp_path / "pids.log"
    runner = RewardRunner(
        [{"name": f"{reward_file}:sleepy", "log": str(log)}, f"{reward_file}:exclaim"],
        timeout=5.0,  # sleepy sleeps 60 s; exclaim, beside it, needs far less than 5 s even on a loaded machine
        pool=ray_pool(1, 0.5),
    )
    result = runner.score(["p", "p"], ["!", "!!"], group_size=2)
    assert result.errors == ["sleepy: timed out after 5 s"] * 2
    assert result.per_func[:, 1].tolist() == [1.0, 2.0]
    result = runner.score(["p"], ["!!!"])
    assert result.per_func[0, 1] == 3.0
    first, second = pids(log)
    assert first != second  # the actor was replaced after the timeout, which ended the sleeping call
    runner.close()


def test_a_ray_worker_holding_the_gil_is_killed_past_its_timeout(reward_file):
    runner = RewardRunner([f"{reward_file}:gil_hog", f"{reward_file}:exclaim"], timeout=1.0, pool=ray_pool(1, 0.5))
    runner.pool.grace = 2.0  # seconds past the timeout before the actor is killed (default: time for a restart)
    runner.pool._start()
    actor = runner.pool.actors[0]
    # score() would stop: no function gave a value. The actor never answers, so exclaim's value, computed
    # beside gil_hog in it, is lost too.
    result = runner.combine(runner.score_values(["p", "p"], ["!", "!!"], group_size=2))
    message = "timed out after 1 s (its Ray worker was killed)"
    assert result.errors == [f"gil_hog: {message}; exclaim: {message}"] * 2
    assert runner.pool.actors[0] is not actor  # replaced
    runner.close()


def test_a_reward_worker_killed_mid_scoring_is_restarted_and_its_chunk_scored_once(reward_file, tmp_path):
    flag, log = tmp_path / "kill-a-worker", tmp_path / "calls.log"
    spec = {"name": f"{reward_file}:dies_once", "flag": str(flag), "log": str(log)}
    completions = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff", "g", "hh"]
    runner = RewardRunner([spec], timeout=NO_TIMEOUT, pool=ray_pool(2, 0.5))
    flag.touch()
    result = runner.score(["p"] * 8, completions, group_size=4)
    runner.close()
    assert not flag.exists()  # one worker deleted it and died
    assert result.per_func[:, 0].tolist() == [float(len(c)) for c in completions]
    assert result.errors == [None] * 8
    calls = [line.split() for line in log.read_text().splitlines()]
    # two chunks (first rows "a" and "eeeee"), one of them started twice: in the process that died and
    # in its restarted actor; its values are counted once.
    assert sorted(c for _, c in calls) in (["a", "a", "eeeee"], ["a", "eeeee", "eeeee"])
    retried = [pid for pid, c in calls if [x for _, x in calls].count(c) == 2]
    assert len(set(retried)) == 2


def test_a_chunk_whose_worker_always_dies_gives_none_and_an_error(reward_file):
    from grpokit.distributed.ray_rewards import MAX_TRIES

    runner = RewardRunner(
        [f"{reward_file}:always_dies", f"{reward_file}:exclaim"], timeout=NO_TIMEOUT, pool=ray_pool(1, 0.5)
    )
    # score() would stop here, no function having given a value (RewardRunner.check_signal)
    result = runner.combine(runner.score_values(["p", "p"], ["!", "!!"], group_size=2))
    assert torch.isnan(result.per_func).all() and torch.isnan(result.combined).all()
    assert all(e.startswith(f"always_dies: reward worker lost ({MAX_TRIES} tries): ") for e in result.errors), (
        result.errors
    )
    assert result.error_counts == {"always_dies": 2, "exclaim": 2}
    runner.close()


def run_cli(
    tmp_path: Path,
    tiny_model_dir: Path,
    word_prompts: list[dict],
    name: str,
    reward_file: Path,
    rewards=(),
    max_steps=3,
    expect: int = 0,
    **distributed,
) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in word_prompts))
    run = tmp_path / name
    config = {
        "model": {"model_name_or_path": str(tiny_model_dir)},
        "data": {"train_dataset": str(data)},
        "algo": {"num_generations": 4, "beta": 0.04},
        "generation": {"max_completion_length": 6},
        "optim": {
            "learning_rate": 1e-2,
            "per_device_train_batch_size": 16,
            "max_steps": max_steps,
            "lr_scheduler_type": "constant",
        },
        "run": {"output_dir": str(run), "progress_bar": False, "report_to": ["jsonl"], "save_steps": 0},
        "reward": {"reward_timeout": NO_TIMEOUT},
        "distributed": {"backend": "ray", "num_rollout_workers": 1, "rollout_worker_cpus": 0.5, **distributed},
        "rewards": [
            {"name": f"{reward_file}:length", "log": str(tmp_path / f"{name}.pids")},
            {"name": "length", "target_length": 30, "unit": "chars"},
            *rewards,
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == expect
    return run


@pytest.mark.slow
def test_cli_rewards_on_ray_workers_equal_in_process_rewards(tmp_path, tiny_model_dir, word_prompts, reward_file):
    raising = [f"{reward_file}:always_raises"]
    local = run_cli(tmp_path, tiny_model_dir, word_prompts, "local", reward_file, raising)
    remote = run_cli(
        tmp_path,
        tiny_model_dir,
        word_prompts,
        "remote",
        reward_file,
        raising,
        num_reward_workers=2,
        reward_worker_cpus=0.5,
    )

    local_workers = set(pids(tmp_path / "local.pids"))
    assert len(local_workers) == 1 and os.getpid() not in local_workers  # in the learner's one worker process for it
    workers = pids(tmp_path / "remote.pids")
    assert (
        len(workers) == 3 * 2 and len(set(workers)) == 2 and os.getpid() not in workers
    )  # 3 steps x 2 chunks, 2 actors

    ma = [json.loads(line) for line in (local / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines()]
    assert len(ma) == len(mb) == 3
    for a, b in zip(ma, mb):
        assert b["rewards/always_raises/errors"] == 16
        for key in (
            "reward",
            "rewards/length/mean",
            "rewards/length_2/mean",
            "rewards/always_raises/errors",
            "loss",
            "kl",
            "grad_norm",
            "advantage/std",
        ):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    with (
        RolloutStore(local / "rollouts.sqlite", readonly=True) as sa,
        RolloutStore(remote / "rollouts.sqlite", readonly=True) as sb,
    ):
        ra, rb = sa.rollouts(), sb.rollouts()
    key = lambda r: (r["step"], r["prompt_index"], r["completion_index"])
    assert len(rb) == len({key(r) for r in rb}) == 3 * 16  # every rollout once
    assert [(key(r), r["completion"], r["rewards"], r["reward"]) for r in ra] == [
        (key(r), r["completion"], r["rewards"], r["reward"]) for r in rb
    ]
    # a raising reward: None and its error with every completion (the chunk's size in the message: 2 workers x 8)
    assert {r["rewards"]["always_raises"] for r in rb} == {None}
    assert {r["error"] for r in rb} == {"always_raises: ValueError: cannot score 8 completions"}
    assert {r["error"] for r in ra} == {"always_raises: ValueError: cannot score 16 completions"}


@pytest.mark.slow
def test_cli_wrong_length_from_a_ray_worker_stops_the_run_naming_the_function(
    tmp_path, tiny_model_dir, word_prompts, reward_file, capsys
):
    run_cli(
        tmp_path,
        tiny_model_dir,
        word_prompts,
        "short",
        reward_file,
        [f"{reward_file}:one_value"],
        max_steps=1,
        expect=2,
        num_reward_workers=2,
        reward_worker_cpus=0.5,
    )
    assert "grpokit: error: reward 'one_value' returned 1 values for 8 completions" in capsys.readouterr().err
