"""The README's three runs of examples/distill: rewards only, distillation only, both; held-out pass@1 by step.

    python examples/distill/run.py                      # builds the teacher if missing, then the three runs
    python examples/distill/run.py learning_rate=3e-4   # key=value settings for all three runs

Each run is `grpokit train examples/distill/config.yaml` with the overrides of :data:`RUNS` (the same student, seed,
learning rate and steps; only the learning signal differs). Prints, for each held-out evaluation, pass@1 and the
training seconds so far (the sum of the steps' ``step_time``, evaluations excluded), and the first step and second at
which each run came within ``--margin`` of the teacher's own held-out pass@1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from grpokit.demo.warmstart import single_thread

HERE = Path(__file__).parent
REWARDS = "rewards=[grpokit.data.arithmetic:arithmetic_correct,grpokit.data.arithmetic:arithmetic_format]"
RUNS = {  # name -> overrides of config.yaml (the demo's rewards and weights, as examples/arithmetic)
    "rewards only": [REWARDS, "reward_weights=[1.0,0.1]", "teacher_model_name_or_path=null"],
    "distillation only": [],
    "both": [REWARDS, "reward_weights=[1.0,0.1]"],
}


def _teacher_module():
    spec = importlib.util.spec_from_file_location("example_distill_teacher", HERE / "teacher.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(run: Path) -> list[dict]:
    """[{step, pass@1, seconds}] of each held-out evaluation; seconds: the training steps' time up to that step."""
    seconds, out = 0.0, []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        seconds += m.get("step_time", 0.0)
        if "eval/pass@1" in m:
            out.append({"step": m["step"], "pass@1": m["eval/pass@1"], "seconds": seconds})
    return out


def reached(points: list[dict], level: float) -> dict | None:
    """The first evaluation at or above ``level`` (None: none)."""
    return next((p for p in points if p["pass@1"] >= level), None)


def run_all(out: Path, overrides: list[str], teacher: Path, student: Path | None = None) -> dict:
    """The three runs into ``out/<name>``; returns {name: curve}. ``teacher``/``student``: folders (None: the
    config's own paths)."""
    from grpokit.cli import main

    paths = [f"teacher_model_name_or_path={teacher}"] + ([f"model_name_or_path={student}"] if student else [])
    curves = {}
    for name, settings in RUNS.items():
        folder = out / name.replace(" ", "-")
        argv = ["train", str(HERE / "config.yaml"), *paths, *settings, f"output_dir={folder}", *overrides]
        with single_thread():
            code = main(argv)
        if code != 0:
            raise SystemExit(code)
        curves[name] = curve(folder)
    return curves


def table(curves: dict, teacher_pass1: float, margin: float) -> str:
    names = list(curves)
    lines = ["| step | " + " | ".join(f"{n}: pass@1 (s)" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, point in enumerate(curves[names[0]]):
        cells = [f"{curves[n][i]['pass@1']:.3f} ({curves[n][i]['seconds']:.1f})" for n in names]
        lines.append(f"| {point['step']} | " + " | ".join(cells) + " |")
    level = teacher_pass1 - margin
    lines.append(f"\nteacher held-out pass@1 {teacher_pass1:.3f}; first evaluation at >= {level:.3f}:")
    for n in names:
        hit = reached(curves[n], level)
        lines.append(f"- {n}: " + (f"step {hit['step']}, {hit['seconds']:.1f} s" if hit else "not reached"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/distill-example", help="folder for the three runs")
    parser.add_argument("--margin", type=float, default=0.05, help="'the teacher's level': its pass@1 minus this")
    parser.add_argument("overrides", nargs="*", help="key=value settings for all three runs")
    args = parser.parse_args(argv)
    teacher = _teacher_module().ensure_teacher()
    stamp = json.loads((teacher / "grpokit_teacher.json").read_text())
    curves = run_all(Path(args.out), args.overrides, teacher)
    print(table(curves, stamp["held_out"][-1]["pass@1"], args.margin))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
