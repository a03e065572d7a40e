"""`grpokit compare`: the config difference, final evaluation deltas, held-out prompts solved by one run only,
and a clear line for a run of another length, one still being written, a missing and a corrupt one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.store import RolloutStore
from grpokit.store.compare import (
    RunData,
    config_difference,
    final_evaluation,
    flatten,
    length_note,
    load_run,
    solved_difference,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from synthetic_run import write_synthetic_run

HOLD_LOCK = """
import sys
from grpokit.system.run_lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
"""


def test_flatten_and_config_difference():
    assert flatten({"algo": {"beta": 0.0, "loss_type": "dapo"}, "rewards": ["a", "b"]}) == {
        "algo.beta": 0.0,
        "algo.loss_type": "dapo",
        "rewards": ["a", "b"],
    }
    a = RunData(Path("a"), "a", config={"algo": {"beta": 0.0, "loss_type": "dapo"}, "run": {"output_dir": "runs/a"}})
    b = RunData(Path("b"), "b", config={"algo": {"beta": 0.04, "loss_type": "dapo", "epsilon_high": 0.28}})
    b.config["run"] = {"output_dir": "runs/b"}  # always differs: never listed
    assert config_difference([a, b]) == [("algo.beta", [0.0, 0.04]), ("algo.epsilon_high", ["(not set)", 0.28])]
    assert config_difference([a, a]) == []


def test_final_evaluation_is_each_runs_last():
    a = RunData(Path("a"), "a", evals=[{"step": 0, "dataset": "eval", "eval/pass@1": 0.25, "eval/num_prompts": 8.0},
                                       {"step": 10, "dataset": "eval", "eval/pass@1": 0.5}])  # fmt: skip
    b = RunData(Path("b"), "b", evals=[{"step": 6, "dataset": "eval", "eval/pass@1": 0.75}])
    assert final_evaluation([a, b]) == [("eval/pass@1", [(10, 0.5), (6, 0.75)])]  # counts left out


def prompts(results: dict[int, tuple[int, int]], step: int = 10, texts: str = "q") -> dict:
    return {
        "eval": {
            "steps": [0, step],
            "prompts": {i: {"prompt": f"{texts}{i}", "results": {0: (0, 4), step: r}} for i, r in results.items()},
        }
    }


def test_solved_by_one_run_only():
    # solved: at least half the samples right. a solves 0 and 1, b solves 1 and 2; 3 neither.
    a = RunData(Path("a"), "a", prompts=prompts({0: (2, 4), 1: (4, 4), 2: (1, 4), 3: (0, 4)}))
    b = RunData(Path("b"), "b", prompts=prompts({0: (1, 4), 1: (3, 4), 2: (2, 4), 3: (1, 4)}, step=6))
    only_a, only_b = solved_difference(a, b)["eval"]
    assert [(e["prompt_index"], e["a"], e["b"]) for e in only_a] == [(0, (2, 4), (1, 4))]
    assert [(e["prompt_index"], e["a"], e["b"]) for e in only_b] == [(2, (1, 4), (2, 4))]
    other = RunData(Path("c"), "c", prompts=prompts({0: (2, 4)}, texts="other "))
    assert "evaluated different prompts" in solved_difference(a, other)["eval"]


def test_length_note():
    assert length_note([RunData(Path("a"), "a", last_step=5), RunData(Path("b"), "b", last_step=5)]) is None
    note = length_note([RunData(Path("a"), "a", last_step=100), RunData(Path("b"), "b", last_step=60)])
    assert "a 100, b 60 steps" in note and "overlap up to step 60" in note


@pytest.fixture
def two_runs(tmp_path):
    a = write_synthetic_run(tmp_path / "a", steps=20, groups=2, group_size=4, eval_every=10, eval_prompts=30)
    b = write_synthetic_run(
        tmp_path / "b", steps=12, groups=2, group_size=4, eval_every=6, eval_prompts=30, seed=1,
        config={"algo": {"beta": 0.0}, "optim": {"max_steps": 20}},
    )  # fmt: skip
    return a, b


def test_compare_command(two_runs, tmp_path, capsys):
    a, b = two_runs
    out = tmp_path / "cmp.html"
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "config difference:\n  algo.beta: 0.04 | 0.0\n" in text
    assert "b: ended at step 12 of 20 (stopped or crashed; resume_from=latest continues it)" in text
    assert "the runs have different lengths (a 20, b 12 steps)" in text
    with RolloutStore(a, readonly=True) as sa, RolloutStore(b, readonly=True) as sb:
        pa = sa.evals()[-1]["eval/pass@1"]
        pb = sb.evals()[-1]["eval/pass@1"]
    assert f"  eval/pass@1: {pa:.4g} @ step 20 | {pb:.4g} @ step 12 ({pb - pa:+.4g})" in text
    only_a, only_b = solved_difference(load_run(a), load_run(b))["eval"]
    assert f"held-out eval: {len(only_a)} solved by a only, {len(only_b)} by b only" in text
    html = out.read_text()
    assert "<h2>Curves by step</h2>" in html and "<h2>Curves by wall time</h2>" in html
    assert "seconds since the start" in html and "<td>algo.beta</td><td>0.04</td><td>0.0</td>" in html
    assert html.count("solved by a only") == 1 and "<script" not in html


def test_missing_corrupt_and_live_runs_get_a_line(two_runs, tmp_path, capsys):
    a, b = two_runs
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "rollouts.sqlite").write_bytes(b"not a database at all" * 100)
    # another process holds b's lock, as a trainer writing it does; it says so on stdout before the compare starts
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(b)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        code = main(["compare", str(a), str(b), str(tmp_path / "gone"), str(corrupt), "-o", str(tmp_path / "c.html")])
    finally:
        holder.communicate("", timeout=60)  # end of stdin: it releases the lock and exits
    text = capsys.readouterr().out
    assert code == 0
    assert re.search(r"b: still being written \(PID \d+ on host .*\): compared as of step 12 of 20", text)
    assert f"left out: {tmp_path / 'gone'}: no run folder here" in text
    assert f"left out: {corrupt}: its store cannot be read:" in text


def test_fewer_than_two_readable_runs_is_one_error(two_runs, tmp_path, capsys):
    a, _ = two_runs
    assert main(["compare", str(a), str(tmp_path / "gone")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"grpokit: error: compare needs two readable runs, and 1 could be read: {tmp_path / 'gone'}: "
                   "no run folder here"]  # fmt: skip
