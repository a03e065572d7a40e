"""`grpokit compare RUN_A RUN_B [...]`: runs side by side. What each run is (and a line for one that is missing,
corrupt, still being written, or shorter than the others), the config keys that differ, each run's final
evaluation with its delta to the first run, and the held-out prompts one run solves and another does not (solved:
as in the report's held-out view, at each run's last evaluation). The page (store/compare_page.py) adds the curves
overlaid by step and by wall time.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpokit.store.groups import group_fractions, success_threshold
from grpokit.store.heldout import eval_prompts, solved
from grpokit.store.report import METRICS_FILENAME
from grpokit.store.store import RolloutStore, StoreError, resolve_store_path
from grpokit.store.summary import eval_label, is_count, section


@dataclass
class RunData:
    """One run as compare reads it; ``problem`` is why it is left out (None: it is compared)."""

    path: Path
    name: str
    problem: str | None = None
    notes: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    wall: dict[int, float] = field(default_factory=dict)  # step -> seconds since the run's start
    prompts: dict[str, dict] = field(default_factory=dict)  # store/heldout.eval_prompts
    derived: list[dict] = field(default_factory=list)  # store/groups.group_fractions
    last_step: int = 0


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """The run in ``path``; a folder that is missing, holds no store, or whose store cannot be read gets a
    ``problem`` line instead of raising."""
    path = Path(path)
    run = RunData(path, name or path.name)
    if not path.is_dir():
        run.problem = f"{path}: no run folder here"
        return run
    store_path = resolve_store_path(path)
    if not store_path.is_file():
        extra = (
            f" (it has {METRICS_FILENAME}: a run that has not written a step yet?)"
            if (path / METRICS_FILENAME).is_file()
            else ""
        )
        run.problem = f"{path}: no {store_path.name}{extra}"
        return run
    try:
        with RolloutStore(store_path, readonly=True) as store:
            run.metrics, run.evals, run.last_step = store.metrics(), store.evals(), store.last_step()
            _, rows = store.query(
                "SELECT step, written_at FROM steps WHERE typeof(step) = 'integer' "
                "AND typeof(written_at) IN ('real', 'integer') ORDER BY step"
            )
            run.prompts = eval_prompts(store)
            run.derived = group_fractions(store, success_threshold(path))
            run.notes += store.problems()
    except (StoreError, sqlite3.DatabaseError) as exc:
        run.problem = f"{path}: its store cannot be read: {exc}"
        return run
    run.config = _read_config(path / "config.yaml", run)
    run.wall = _wall_times(rows, run.metrics)
    run.notes += _state_notes(path, run)
    return run


def _read_config(path: Path, run: RunData) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError:
        run.notes.append("no config.yaml: its settings are not compared")
        return {}
    except yaml.YAMLError as exc:
        run.notes.append(f"config.yaml is not valid YAML ({str(exc).splitlines()[0]}): its settings are not compared")
        return {}
    return data if isinstance(data, dict) else {}


def _wall_times(rows: list[tuple], metrics: list[dict]) -> dict[int, float]:
    """Seconds from the run's start to the end of each step: the first step's own step_time, then the store's
    commit times (a resumed run's pause included)."""
    if not rows:
        return {}
    first = next((m.get("step_time") for m in metrics if m["step"] == rows[0][0]), None)
    start = rows[0][1] - (first if isinstance(first, float) and math.isfinite(first) else 0.0)
    return {0: 0.0} | {step: at - start for step, at in rows}


def _state_notes(path: Path, run: RunData) -> list[str]:
    """A run still being written (a live trainer holds its lock), or one that ended before its max_steps."""
    from grpokit.system.run_lock import lock_holder

    max_steps = section(run.config, "optim").get("max_steps")
    holder = lock_holder(path)
    if holder is not None:
        of = f" of {max_steps}" if max_steps else ""
        return [f"still being written ({holder}): compared as of step {run.last_step}{of}"]
    if isinstance(max_steps, int) and run.last_step < max_steps and not (path / "final").exists():
        return [f"ended at step {run.last_step} of {max_steps} (stopped or crashed; resume_from=latest continues it)"]
    return []


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """{"section.key": value} of a nested config (lists and scalars are values)."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, name + ".")
        else:
            out[name] = value
    return out


_ABSENT = "(not set)"


def config_difference(runs: list[RunData]) -> list[tuple[str, list[object]]]:
    """[(key, each run's value)] for the config keys whose values differ between ``runs`` (a key one run lacks
    reads as "(not set)"); run folders and run names are left out: they always differ."""
    flat = [flatten(run.config) for run in runs]
    keys = sorted(set().union(*flat))
    out = []
    for key in keys:
        if key in ("run.output_dir", "run.run_name"):
            continue
        values = [f.get(key, _ABSENT) for f in flat]
        if any(v != values[0] for v in values[1:]):
            out.append((key, values))
    return out


def final_evaluation(runs: list[RunData]) -> list[tuple[str, list[tuple[int, float] | None]]]:
    """[(eval metric label, each run's (step, value) at its last evaluation or None)], counts left out."""
    last: list[dict[str, tuple[int, float]]] = []
    for run in runs:
        values: dict[str, tuple[int, float]] = {}
        for row in run.evals:
            for name, value in row.items():
                if name not in ("step", "dataset") and not is_count(name) and _finite(value):
                    values[eval_label(name, row["dataset"])] = (row["step"], value)
        last.append(values)
    names = sorted(set().union(*last))
    return [(name, [values.get(name) for values in last]) for name in names]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def solved_difference(a: RunData, b: RunData) -> dict[str, tuple[list[dict], list[dict]] | str]:
    """Per eval dataset both runs have: (prompts a solves and b does not, prompts b solves and a does not) at each
    run's last evaluation, each {"prompt_index", "prompt", "a", "b"} with (correct, samples); or a line saying why
    the dataset cannot be compared (different prompts)."""
    out: dict[str, tuple[list[dict], list[dict]] | str] = {}
    for dataset in sorted(set(a.prompts) & set(b.prompts)):
        last_a, last_b = _last_results(a.prompts[dataset]), _last_results(b.prompts[dataset])
        common = sorted(set(last_a) & set(last_b))
        if any(last_a[i][0] != last_b[i][0] for i in common) or not common:
            out[dataset] = f"{dataset}: the two runs evaluated different prompts; not compared prompt by prompt"
            continue
        only_a, only_b = [], []
        for i in common:
            (prompt, ra), (_, rb) = last_a[i], last_b[i]
            entry = {"prompt_index": i, "prompt": prompt, "a": ra, "b": rb}
            if solved(*ra) and not solved(*rb):
                only_a.append(entry)
            elif solved(*rb) and not solved(*ra):
                only_b.append(entry)
        out[dataset] = (only_a, only_b)
    return out


def _last_results(data: dict) -> dict[int, tuple[str, tuple[int, int]]]:
    """{prompt_index: (prompt, (correct, samples))} at the dataset's last evaluation."""
    step = data["steps"][-1]
    return {
        i: (entry["prompt"], entry["results"][step]) for i, entry in data["prompts"].items() if step in entry["results"]
    }


def length_note(runs: list[RunData]) -> str | None:
    """A line when the runs have different numbers of steps: curves overlap only where both have data."""
    lengths = {run.name: run.last_step for run in runs}
    if len(set(lengths.values())) <= 1:
        return None
    listed = ", ".join(f"{name} {steps}" for name, steps in lengths.items())
    return (
        f"the runs have different lengths ({listed} steps): curves overlap up to step {min(lengths.values())}; "
        "each final evaluation is its run's last"
    )
