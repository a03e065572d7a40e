"""The reward contract (TRL's keywords), where functions run (killable worker processes), and the
checks that make a run without reward signal loud."""

import asyncio
import math
import re
import sys
import time

import pytest

from grpokit.rewards import RewardError, RewardRunner
from grpokit.rewards.contract import RewardState

CALLS = []  # what `recording` received, in this process (isolate=False) or sent back through log_extra


def recording(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, answer, **kwargs):
    """Records what it is given and rewards completion == answer."""
    CALLS.append(
        dict(
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
            answer=answer,
            kwargs=sorted(kwargs),
        )
    )
    log_metric("judge/calls", 1.0)
    log_extra("ids_seen", [len(ids) for ids in completion_ids])
    return [float(c == a) for c, a in zip(completions, answer)]


def positional_style(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def without_kwargs(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer)]


async def async_reward(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)
    return [1.0] * len(completions)


def gil_hog(prompts, completions, **kwargs):
    re.match(r"^(a+)+$", "a" * 40 + "b")  # catastrophic backtracking: holds the GIL for minutes
    return [0.0] * len(completions)


def boom(prompts, completions, **kwargs):
    raise ValueError("boom")


def test_keywords_types_and_alignment():
    CALLS.clear()
    state = RewardState(global_step=3, max_steps=10, epoch=0.5)
    runner = RewardRunner([recording, positional_style, without_kwargs], isolate=False)
    result = runner.score(
        ["p1", "p1", "p2", "p2"],
        ["a", "b", "c", "x"],
        {"answer": ["a", "a", "c", "c"], "source": [1, 1, 2, 2]},
        group_size=2,
        completion_ids=[[5, 6], [7], [8, 9, 10], [11]],
        trainer_state=state,
    )
    [call] = CALLS
    assert call["prompts"] == ["p1", "p1", "p2", "p2"] and call["completions"] == ["a", "b", "c", "x"]
    assert call["completion_ids"] == [[5, 6], [7], [8, 9, 10], [11]]
    assert all(type(t) is int for ids in call["completion_ids"] for t in ids)
    assert call["trainer_state"] is state and call["answer"] == ["a", "a", "c", "c"]
    assert call["kwargs"] == ["source"]  # the other dataset columns
    # recording: 1, 0, 1, 0; positional_style: len = 1 each; without_kwargs (gets only what it names): 1, 0, 1, 0
    assert result.per_func.tolist() == [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]
    assert result.logged == {"judge/calls": [1.0]} and result.metrics()["judge/calls"] == 1.0
    assert result.extra == {"ids_seen": [2, 1, 3, 1]}


def test_worker_processes_send_back_logs_and_chunk_them():
    CALLS.clear()
    runner = RewardRunner([recording], workers=2)  # two processes, each scores one group
    result = runner.score(
        ["p"] * 4,
        ["a", "b", "c", "c"],
        {"answer": ["a", "a", "c", "c"]},
        group_size=2,
        completion_ids=[[1], [1, 2], [1, 2, 3], []],
    )
    runner.close()
    assert result.per_func[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert result.logged == {"judge/calls": [1.0, 1.0]}  # one call per chunk; the metric is their mean
    assert result.extra == {"ids_seen": [1, 2, 3, 0]}
    assert CALLS == []  # the calls ran in the worker processes, not here


def test_conversational_prompts_and_completions():
    seen = {}

    def chat(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[0]["content"] == "4") for c in completions]

    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    result = RewardRunner([chat, "format"], isolate=False).score(prompts, ["4", "5"])
    assert seen["prompts"] == prompts
    assert seen["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    assert result.per_func[:, 0].tolist() == [1.0, 0.0]
    assert result.per_func[:, 1].tolist() == [0.0, 0.0]  # the built-in format reward reads the message text


def test_trl_reward_functions():
    pytest.importorskip("trl")
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    prompts = [[{"role": "user", "content": "q"}]] * 2
    overlong = get_soft_overlong_punishment(max_completion_len=4, soft_punish_cache=2)
    result = RewardRunner([think_format_reward, overlong]).score(
        prompts, ["<think>\nhm\n</think>\n4", "4"], completion_ids=[[1, 2, 3, 4], [1, 2]]
    )
    # think_format_reward: 1 for a <think>...</think> block first, else 0.
    # soft overlong (max 4, cache 2): 4 tokens is past 4 - 2 = 2 by 2 -> -(2 / 2) = -1; 2 tokens -> 0.
    assert result.per_func.tolist() == [[1.0, -1.0], [0.0, 0.0]]


def test_async_and_async_in_a_worker():
    for isolate in (False, True):
        result = RewardRunner([async_reward], isolate=isolate).score(["p"], ["c"])
        assert result.combined.tolist() == [1.0]


def test_a_gil_holding_reward_is_cut_at_its_timeout(capsys):
    # positional_style, in its own process, must answer within the timeout on a loaded machine too: 3 s
    runner = RewardRunner([gil_hog, positional_style], timeout=3.0)
    result = runner.score(["p", "p"], ["ab", "c"])
    assert result.errors == ["gil_hog: timed out after 3 s (its worker process was killed)"] * 2
    assert result.per_func[:, 1].tolist() == [2.0, 1.0]  # the other function, in its own process, is unaffected
    assert "reward 'gil_hog' failed: timed out after 3 s" in capsys.readouterr().err
    runner.close()


def test_unpicklable_functions_run_in_workers_on_linux():
    offset = 2.0
    runner = RewardRunner([lambda completions, **kw: [offset] * len(completions)])
    if sys.platform == "linux":  # forked: the child inherits the closure
        assert runner.pool.processes[0] is not None
    assert runner.score(["p"], ["c"]).combined.tolist() == [2.0]
    runner.close()


def test_first_failure_is_printed_once_with_its_traceback(capsys):
    calls = {"n": 0}

    def flaky(prompts, completions, **kwargs):
        calls["n"] += 1
        if calls["n"] % 10 == 3:
            raise KeyError("missing thing")
        return [1.0] * len(completions)

    runner = RewardRunner([flaky, positional_style], isolate=False)
    errors = [runner.score(["p"], ["c"]).errors[0] for _ in range(20)]
    assert errors.count("flaky: KeyError: 'missing thing'") == 2 and errors.count(None) == 18
    err = capsys.readouterr().err
    assert err.count("reward 'flaky' failed: KeyError: 'missing thing'") == 1
    assert "Traceback (most recent call last)" in err and 'raise KeyError("missing thing")' in err
    assert "grpokit/rewards/contract.py" not in err  # the traceback starts at the reward function, not in grpokit


def test_no_reward_signal_stops_at_the_first_batch_or_after_three_in_a_row():
    with pytest.raises(
        RewardError, match=r"every reward function failed on every completion of the first batch.*ValueError: boom"
    ):
        RewardRunner([boom], isolate=False).score(["p"], ["c"])

    failing = {"on": False}

    def sometimes(prompts, completions, **kwargs):
        if failing["on"]:
            raise RuntimeError("down")
        return [1.0] * len(completions)

    runner = RewardRunner([sometimes], isolate=False)
    runner.score(["p"], ["c"])
    failing["on"] = True
    runner.score(["p"], ["c"])
    runner.score(["p"], ["c"])
    with pytest.raises(RewardError, match="3 batches in a row"):
        runner.score(["p"], ["c"])
    # one function failing while another works is not "no signal"
    RewardRunner([boom, positional_style], isolate=False).score(["p"], ["c"])


def test_no_reward_signal_from_timeouts_says_to_speed_up_the_reward_not_to_read_a_traceback():
    def sleepy(prompts, completions, **kwargs):
        time.sleep(5)
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=r"sleepy: timed out after 0\.2 s.*raise reward_timeout") as info:
        RewardRunner([sleepy], isolate=False, timeout=0.2).score(["p"], ["c"])
    assert "traceback" not in str(info.value)


def test_log_extra_of_the_wrong_length_is_the_function_s_error():
    def bad_extra(completions, log_extra, **kwargs):
        log_extra("x", [1])
        return [1.0] * len(completions)

    runner = RewardRunner([bad_extra, positional_style], isolate=False)
    result = runner.score(["p", "p"], ["a", "b"])
    assert result.errors[0].startswith(
        "bad_extra: ValueError: log_extra('x', values) needs a list of one value per completion (2)"
    )


def test_contract_error_in_a_worker_stops_the_run():
    with pytest.raises(RewardError, match="returned 1 values for 2"):
        RewardRunner([lambda completions, **kw: [1.0]]).score(["p", "p"], ["a", "b"])
    with pytest.raises(RewardError, match="needs the dataset column 'answer'"):
        RewardRunner(["accuracy"]).score(["p"], ["1"])


def test_sequence_classifier_module_is_scored_as_trl_does(tmp_path):
    pytest.importorskip("transformers")
    from grpokit.testing import build_tiny_reward_model, build_word_tokenizer

    tokenizer = build_word_tokenizer(["a", "b", "c"])
    model = build_tiny_reward_model(None, tokenizer, hidden_size=16)[0].eval()  # a LlamaForSequenceClassification
    result = RewardRunner([model], processing_classes=[tokenizer]).score(["a b", "a"], ["c", "b c"])
    # TRL: tokenize prompt + completion without special tokens, right padding, logits[:, 0]
    import torch

    expected = []
    for text in ("a bc", "ab c"):
        ids = tokenizer(text=[text], return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            expected.append(model(**ids).logits[0, 0].item())
    assert result.per_func[:, 0].tolist() == pytest.approx(expected, abs=1e-5)
    assert not math.isnan(result.combined[0])


def test_torch_works_in_a_worker_forked_after_the_trainer_used_its_thread_pool():
    import torch

    x = torch.randn(256, 256)
    (x @ x).sum()  # the parent's intra-op pool is running

    def torchy(completions, **kwargs):
        y = torch.ones(128, 128)
        return [(y @ y).mean().item()] * len(completions)  # 128

    runner = RewardRunner([torchy], timeout=30)
    assert runner.score(["p"], ["c"]).combined.tolist() == [128.0]
    runner.close()


def test_an_interrupt_while_a_worker_holds_the_gil_propagates_and_kills_it():
    import signal

    runner = RewardRunner([gil_hog], timeout=300)
    worker = runner.pool.processes[0][0]._process

    def interrupt(signum, frame):  # as the trainer's handler does on a second Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.score(["p"], ["c"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not worker.is_alive() and worker.exitcode == -signal.SIGKILL
    runner.close()
