"""RewardRunner: weighted combination, metrics, failures, timeouts, async and worker processes."""

import asyncio
import math
import os
import textwrap
import threading

import numpy as np
import pytest
import torch

from grpokit.rewards import MissingColumnError, RewardError, RewardRunner


def fixed(values):
    """A reward function named ``reward`` that returns ``values`` whatever it is given."""

    def reward(prompts, completions, **columns):
        return list(values)

    return reward


def boom(prompts, completions, **columns):
    return [1 / 0 for _ in completions]


def test_weighted_sum_ignores_none():
    first = fixed([1.0, None, 0.5, None])
    second = fixed([0.0, 2.0, None, None])
    runner = RewardRunner([first, second], weights=[2.0, 0.5])
    result = runner.score(["p"] * 4, ["c"] * 4)
    # Rows: 2*1 + 0.5*0 = 2;  0.5*2 = 1;  2*0.5 = 1;  nothing present -> NaN.
    assert result.combined[:3].tolist() == [2.0, 1.0, 1.0]
    assert math.isnan(result.combined[3])
    assert result.per_func.dtype == torch.float64 and result.per_func.shape == (4, 2)
    assert torch.isnan(result.per_func[1, 0]) and result.per_func[1, 1] == 2.0
    assert result.errors == [None] * 4 and result.error_counts == {"reward": 0, "reward_2": 0}


def test_metrics_hand_computed():
    runner = RewardRunner([fixed([1.0, None, 0.5, None]), fixed([0.0, 2.0, None, None])], weights=[2.0, 0.5])
    metrics = runner.score(["p"] * 4, ["c"] * 4).metrics()
    # first: values 1, 0.5 -> mean 0.75, sample std sqrt((0.25^2 + 0.25^2) / 1) = 0.353553.
    assert metrics["rewards/reward/mean"] == pytest.approx(0.75)
    assert metrics["rewards/reward/std"] == pytest.approx(math.sqrt(0.125))
    # second: values 0, 2 -> mean 1, std sqrt((1 + 1) / 1) = 1.414214.
    assert metrics["rewards/reward_2/mean"] == pytest.approx(1.0)
    assert metrics["rewards/reward_2/std"] == pytest.approx(math.sqrt(2))
    assert metrics["rewards/reward/errors"] == 0.0
    # combined: 2, 1, 1 (NaN row left out) -> mean 4/3, std sqrt((4/9 + 1/9 + 1/9) / 2) = 0.57735.
    assert metrics["reward"] == pytest.approx(4 / 3)
    assert metrics["reward_std"] == pytest.approx(math.sqrt(1 / 3))


def test_builtins_by_name_with_dict_weights():
    runner = RewardRunner(["accuracy", {"name": "format", "weight": 0.5, "pattern": r".*\d"}])
    completions = [r"\boxed{4}", "it is 5", "none"]
    result = runner.score(["q"] * 3, completions, {"answer": ["4", "4", None]})
    # accuracy: 1, 0, None; format (the whole text ends in a digit): 0, 1, 0.
    # combined: 1 + 0.5*0 = 1;  0 + 0.5*1 = 0.5;  0.5*0 = 0.
    assert result.per_func[:2, 0].tolist() == [1.0, 0.0] and torch.isnan(result.per_func[2, 0])
    assert result.per_func[:, 1].tolist() == [0.0, 1.0, 0.0]
    assert result.combined.tolist() == [1.0, 0.5, 0.0]
    assert runner.names == ["accuracy", "format"]


def test_unique_names():
    runner = RewardRunner(["format", "format", {"name": "format", "pattern": "x"}, boom])
    assert runner.names == ["format", "format_2", "format_3", "boom"]


def test_raising_reward_gives_none_and_error():
    runner = RewardRunner([boom, fixed([1.0, 0.0])], weights=[1.0, 3.0])
    result = runner.score(["p", "p"], ["a", "b"])
    assert torch.isnan(result.per_func[:, 0]).all()
    assert result.combined.tolist() == [3.0, 0.0]  # only the second, weighted by 3
    assert result.errors == ["boom: ZeroDivisionError: division by zero"] * 2
    assert result.error_counts == {"boom": 2, "reward": 0}
    assert result.metrics()["rewards/boom/errors"] == 2.0
    assert math.isnan(result.metrics()["rewards/boom/mean"])


def test_errors_of_two_functions_are_joined():
    runner = RewardRunner([boom, fixed([math.nan])])
    result = runner.combine(runner.score_values(["p"], ["a"]))  # score() would stop: no function gave a value
    assert result.errors == ["boom: ZeroDivisionError: division by zero; reward: returned nan"]
    assert math.isnan(result.combined[0])


def test_values_cut_into_rows_combine_to_the_rows_of_the_whole_result():
    # What a torchrun rank keeps of rank 0's global batch: its rows' values, errors and error counts.
    nan_on_third = fixed([1.0, 2.0, math.nan, 4.0])  # row 2: "returned nan", no value
    runner = RewardRunner([nan_on_third, fixed([0.5, None, 1.0, 1.0])], weights=[2.0, 1.0])
    values = runner.score_values(["p"] * 4, ["c"] * 4, group_size=2)
    assert values.messages == [[None, None], [None, None], ["returned nan", None], [None, None]]
    whole = runner.combine(values)
    assert (
        whole.combined.tolist()
        == RewardRunner([nan_on_third, fixed([0.5, None, 1.0, 1.0])], weights=[2.0, 1.0])
        .score(["p"] * 4, ["c"] * 4)
        .combined.tolist()
    )
    second = runner.combine(values.rows(slice(2, 4)))
    # row 2: reward absent, 1 * 1.0 = 1.0; row 3: 2 * 4 + 1 * 1 = 9.0
    assert second.combined.tolist() == [1.0, 9.0]
    assert second.errors == ["reward: returned nan", None] and second.error_counts == {"reward": 1, "reward_2": 0}
    first = runner.combine(values.rows(slice(0, 2)))
    # row 0: 2 * 1 + 0.5 = 2.5; row 1: 2 * 2 (second absent) = 4.0
    assert (
        first.combined.tolist() == [2.5, 4.0]
        and first.errors == [None, None]
        and first.error_counts == {"reward": 0, "reward_2": 0}
    )


def test_hanging_reward_times_out():
    release = threading.Event()
    finished = threading.Event()

    def hang(prompts, completions, **columns):
        release.wait()
        finished.set()
        return [1.0] * len(completions)

    # Should the runner wait for the hung call, this timer frees it and `finished` gets set.
    watchdog = threading.Timer(30.0, release.set)
    watchdog.start()
    try:
        # on threads in this process (isolate=False), where a timed-out call is abandoned, not killed
        # fixed() must answer within the timeout on a loaded machine too: 3 s (hang waits for release)
        result = RewardRunner([hang, fixed([0.5, 0.5])], timeout=3.0, isolate=False).score(["p", "p"], ["a", "b"])
        assert not finished.is_set()  # the runner returned while the call was still stuck
    finally:
        release.set()
        watchdog.cancel()
    assert torch.isnan(result.per_func[:, 0]).all()
    assert result.errors == ["hang: timed out after 3 s"] * 2
    assert result.error_counts["hang"] == 2
    assert result.combined.tolist() == [0.5, 0.5]


def test_nan_and_inf_become_none_with_error():
    result = RewardRunner([fixed([1.0, math.nan, math.inf, -math.inf])]).score(["p"] * 4, ["c"] * 4)
    assert result.per_func[0, 0] == 1.0 and torch.isnan(result.per_func[1:, 0]).all()
    assert result.errors == [
        None,
        "reward: returned nan",
        "reward: returned inf",
        "reward: returned -inf",
    ]
    assert result.error_counts == {"reward": 3}


@pytest.mark.parametrize(
    "output",
    [
        [True, False],
        [1, 0],
        (np.float32(1), np.int64(0)),
        np.array([1.0, 0.0]),
        torch.tensor([1, 0]),
    ],
    ids=["bools", "ints", "numpy-scalars", "numpy-array", "tensor"],
)
def test_numbers_bools_arrays_and_tensors_are_accepted(output):
    def reward(prompts, completions, **columns):
        return output

    result = RewardRunner([reward]).score(["p", "p"], ["a", "b"])
    assert result.per_func[:, 0].tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ([1.0, 2.0, 3.0], "returned 3 values for 2 completions"),
        (["1.0", "0.0"], "returned a str"),
        ([[1.0], [0.0]], "returned a list"),
        ("10", "got str"),
        ({"a": 1.0, "b": 0.0}, "got dict"),
        (1.0, "got float"),
        (None, "got NoneType"),
    ],
)
def test_contract_violations_raise_at_once(output, message):
    def broken(prompts, completions, **columns):
        return output

    with pytest.raises(RewardError, match=message) as info:
        RewardRunner([broken]).score(["p", "p"], ["a", "b"])
    assert "'broken'" in str(info.value)


def test_missing_column_stops_the_run():
    with pytest.raises(MissingColumnError, match="'answer'"):
        RewardRunner(["accuracy"]).score(["p"], ["1"], {"solution": ["1"]})


def test_async_reward_and_async_timeout():
    async def slow_judge(prompts, completions, **columns):
        await asyncio.sleep(0.01)
        return [float(len(c)) for c in completions]

    async def never(prompts, completions, **columns):
        await asyncio.sleep(60)

    # slow_judge, in a worker process, must answer within the timeout on a loaded machine too: 3 s (never: 60 s)
    result = RewardRunner([slow_judge, never], timeout=3.0).score(["p", "p"], ["ab", "abc"])
    assert result.per_func[:, 0].tolist() == [2.0, 3.0]
    assert result.errors == ["never: timed out after 3 s (its worker process was killed)"] * 2

    async def caller():  # score() also works from inside a running event loop
        return RewardRunner([slow_judge]).score(["p"], ["abcd"])

    assert asyncio.run(caller()).combined.tolist() == [4.0]


def test_columns_are_passed_aligned():
    def uses_columns(prompts, completions, answer, completion_lengths, **columns):
        return [float(a == c) + n for a, c, n in zip(answer, completions, completion_lengths)]

    result = RewardRunner([uses_columns]).score(
        ["p", "p"], ["x", "y"], {"answer": ["x", "z"], "completion_lengths": [10, 20]}
    )
    assert result.combined.tolist() == [11.0, 20.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="2 reward weights for 1"):
        RewardRunner([boom], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        RewardRunner([boom], weights=[math.nan])
    with pytest.raises(ValueError, match="at least one"):
        RewardRunner([])
    with pytest.raises(ValueError, match="timeout"):
        RewardRunner([boom], timeout=0)
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2"):
        RewardRunner([boom]).score(["p", "p"], ["a", "b"], {"answer": ["x"]})
    with pytest.raises(ValueError, match="1 prompts for 2"):
        RewardRunner([boom]).score(["p"], ["a", "b"])


USER_FILE = textwrap.dedent(
    """
    import time

    def exclaim(prompts, completions, **columns):
        return [float(c.count("!")) for c in completions]

    def odd_fails(prompts, completions, **columns):
        if any(c.startswith("boom") for c in completions):
            raise RuntimeError("boom in this chunk")
        return [1.0] * len(completions)

    def sleepy(prompts, completions, **columns):
        time.sleep(60)
    """
)


def test_chunks_hold_whole_groups():
    from grpokit.rewards.pool import chunks

    # 12 completions in groups of 4 = 3 groups over 2 workers: bounds round(k * 3 / 2) groups = 0, 2, 3
    # (Python rounds 1.5 to 2), i.e. rows [0, 8) and [8, 12).
    assert chunks(12, 2, group_size=4) == [slice(0, 8), slice(8, 12)]
    # more workers than groups: one group per chunk
    assert chunks(8, 5, group_size=4) == [slice(0, 4), slice(4, 8)]
    # group_size 1 is the old split: 5 rows over 2 -> round(2.5) = 2 -> [0, 2), [2, 5)
    assert chunks(5, 2) == [slice(0, 2), slice(2, 5)]
    with pytest.raises(ValueError, match="group_size=4 must be >= 1 and divide the 6 completions"):
        RewardRunner([boom]).score(["p"] * 6, ["c"] * 6, group_size=4)


def test_workers_match_one_process(tmp_path):
    path = tmp_path / "pool_rewards.py"
    path.write_text(USER_FILE)
    specs = [
        "accuracy",
        {"name": "length", "max_length": 20, "cache_length": 4, "weight": 0.5},
        f"{path}:exclaim",
        f"{path}:odd_fails",
    ]
    completions = ["#### 4!", "boom 5", "the answer is 7!!", r"\boxed{6}", "x" * 18]
    columns = {"answer": ["4", "5", "7", None, "1"], "completion_lengths": [3, 17, 21, 5, 18]}
    prompts = ["q"] * len(completions)
    expected = RewardRunner(specs, isolate=False).score(prompts, completions, columns)
    with RewardRunner(specs, workers=2) as runner:
        pids = [proc.pid for proc in runner.pool.processes[2]]
        first = runner.score(prompts, completions, columns)
        second = runner.score(prompts, completions, columns)
        assert [proc.pid for proc in runner.pool.processes[2]] == pids and len(set(pids)) == 2  # started once, reused
    assert all(proc.pid is None for procs in runner.pool.processes for proc in procs or ())  # closed on exit
    # odd_fails fails on any batch holding "boom": the whole batch in-process, but with 2 chunks
    # ([0:2] and [2:5]) only the first, so the workers add 1.0 (weight 1) to rows 2, 3 and 4.
    odd_fails = torch.tensor([math.nan, math.nan, 1.0, 1.0, 1.0], dtype=torch.float64)
    assert expected.error_counts["odd_fails"] == 5
    assert torch.isnan(expected.per_func[:, 3]).all()
    for result in (first, second):
        torch.testing.assert_close(result.per_func[:, :3], expected.per_func[:, :3], equal_nan=True)
        torch.testing.assert_close(result.per_func[:, 3], odd_fails, equal_nan=True)
        torch.testing.assert_close(result.combined, expected.combined + odd_fails.nan_to_num())
    assert first.error_counts["odd_fails"] == 2
    assert first.errors[:2] == ["odd_fails: RuntimeError: boom in this chunk"] * 2
    assert first.errors[2:] == [None] * 3


def test_timeout_kills_the_worker_and_a_new_one_scores_the_next_batch(tmp_path):
    path = tmp_path / "pool_rewards.py"
    path.write_text(USER_FILE)
    # exclaim, beside sleepy, must answer within the timeout on a loaded machine too: 3 s
    runner = RewardRunner([f"{path}:sleepy", f"{path}:exclaim"], timeout=3.0, workers=1)
    old = runner.pool.processes[0][0]._process
    result = runner.score(["p", "p"], ["!", "!!"])
    assert result.errors == ["sleepy: timed out after 3 s (its worker process was killed)"] * 2
    assert result.per_func[:, 1].tolist() == [1.0, 2.0]
    assert not old.is_alive() and runner.pool.processes[0][0].pid is None  # killed, which ends the abandoned call
    assert runner.score(["p"], ["!!!"]).per_func[0, 1] == 3.0  # a new worker on the next batch
    runner.close()


def exits_at_once(prompts, completions, **columns):
    import os

    os._exit(3)


def killed_by_the_kernel(prompts, completions, **columns):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize(
    "fn, how",
    [
        (exits_at_once, "exited with status 3 while scoring (os._exit() in the reward function or the code it calls"),
        (killed_by_the_kernel, "was killed by SIGKILL (the kernel's out-of-memory killer sends it, as does kill -9)"),
    ],
)
def test_a_worker_that_dies_is_reported_with_its_exit_status_or_signal(fn, how):
    """Not "exit code None": the worker is reaped before its end is described (its pipe closes first)."""
    with RewardRunner([fn, fixed([1.0, 1.0])], workers=1) as runner:
        result = runner.score(["p", "p"], ["a", "b"])
    assert result.errors[0].startswith(f"{fn.__name__}: the reward worker process {how}"), result.errors[0]
    assert result.per_func[:, 1].tolist() == [1.0, 1.0]  # the other function scored as usual


def test_isolate_none_runs_named_rewards_in_workers_and_given_functions_here(tmp_path):
    """isolate=None (GRPOTrainer's default, reward_isolation: null): a function object runs in this process, as TRL
    runs it, so what it appends to a list it closes over is seen here; a function named by a string (a file's, a
    built-in) runs in a worker process."""
    path = tmp_path / "pid_rewards.py"
    path.write_text(
        "import os\n\ndef pid(prompts, completions, **columns):\n    return [float(os.getpid())] * len(completions)\n"
    )
    seen = []

    def counting(prompts, completions, **columns):
        seen.append(len(completions))
        return [float(os.getpid())] * len(completions)

    with RewardRunner([counting, f"{path}:pid", {"name": "format", "pattern": "x"}], isolate=None) as runner:
        assert runner.pool.processes[0] is None  # the function object: on a thread here
        assert runner.pool.processes[1] is not None and runner.pool.processes[2] is not None  # named: workers
        result = runner.score(["p", "p"], ["a", "b"])
        result = runner.score(["p", "p", "p"], ["a", "b", "c"])
    assert seen == [2, 3]  # both calls, seen by the caller
    assert result.per_func[:, 0].tolist() == [float(os.getpid())] * 3
    assert float(os.getpid()) not in result.per_func[:, 1].tolist()
    with RewardRunner([counting], isolate=True) as runner:  # isolation stays one setting away
        runner.score(["p"], ["a"])
    assert seen == [2, 3]  # the worker process's list, not this one


def test_a_completion_no_reward_applies_to_is_logged_once_as_trl_words_it(caplog):
    """TRL logs "All reward functions returned None for the following kwargs" when a completion has no reward;
    grpokit logs it once per run (it gets advantage 0), not for failures (announced with their traceback)."""
    runner = RewardRunner([fixed([1.0, None]), fixed([None, None])], isolate=False)
    with caplog.at_level("WARNING", logger="grpokit.rewards.runner"):
        runner.score(["p0", "p1"], ["c0", "c1"])
        runner.score(["p0", "p1"], ["c0", "c1"])
    records = [r for r in caplog.records if "All reward functions returned None" in r.getMessage()]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "'completions': 'c1'" in message and "'prompts': 'p1'" in message and "(1 of 2 completions" in message
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpokit.rewards.runner"):
        RewardRunner([fixed([1.0, 2.0])], isolate=False).score(["p", "p"], ["a", "b"])  # every completion has one
        RewardRunner([boom, fixed([None])], isolate=False).score(["p"], ["a"])  # a failure is not "returned None"
    assert "All reward functions returned None" not in caplog.text
