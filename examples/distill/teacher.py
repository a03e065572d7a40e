"""The teacher of examples/distill: the demo's warm start after GRPO on the demo's task, built once and cached.

    python examples/distill/teacher.py            # ~/.cache/grpokit/distill-teacher-v1 (or under $GRPOKIT_CACHE)

It runs `grpokit train examples/arithmetic/config.yaml` (the demo's GRPO settings, 100 steps) on the demo's cached
warm start (built first if missing, as `grpokit demo` builds it) and keeps the final model in
``<cache>/distill-teacher-v<VERSION>`` with a stamp of its recipe and its held-out pass@1 before and after; the
folder is written under a temporary name and renamed into place, so an interrupted build leaves none. Everything is
local and seeded: a fresh clone builds the same teacher offline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from grpokit.demo.warmstart import WarmStartConfig, ensure_demo_policy, single_thread
from grpokit.system.cached_folders import default_cache_root

HERE = Path(__file__).parent
GRPO_CONFIG = HERE.parent / "arithmetic" / "config.yaml"
VERSION = 1
STAMP_FILE = "grpokit_teacher.json"
STEPS = 100


def recipe(steps: int, warm_start: WarmStartConfig, overrides: list[str]) -> dict:
    return {"version": VERSION, "grpo_steps": steps, "warm_start": asdict(warm_start), "overrides": list(overrides)}


def held_out(run: Path) -> list[dict]:
    """The run's evaluations (step and held-out pass@1), from its metrics.jsonl."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{"step": m["step"], "pass@1": m["eval/pass@1"]} for m in lines if "eval/pass@1" in m]


def ensure_teacher(
    cache_dir: str | Path | None = None,
    steps: int = STEPS,
    warm_start: WarmStartConfig | None = None,
    overrides: list[str] = (),
    log=print,
) -> Path:
    """The teacher's folder, built first when it is missing or was built by another recipe. ``cache_dir``: the
    cache root (default :func:`default_cache_root`: $GRPOKIT_CACHE, else ~/.cache/grpokit); ``warm_start``: the
    demo's warm start recipe (default the demo's); ``overrides``: key=value settings for the GRPO run."""
    from grpokit.cli import main

    warm_start = warm_start or WarmStartConfig()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    target = root / f"distill-teacher-v{VERSION}"
    stamp = recipe(steps, warm_start, list(overrides))
    try:
        if json.loads((target / STAMP_FILE).read_text())["recipe"] == stamp:
            return target
    except (OSError, ValueError, KeyError):
        pass
    student = ensure_demo_policy(root, config=warm_start, log=log)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}-"))
    try:
        settings = [f"model_name_or_path={student}", f"output_dir={work / 'run'}", f"max_steps={steps}"]
        settings += [f"eval_steps={steps}", "report_to=[jsonl]", "progress_bar=false", *overrides]
        log(f"teacher: {steps} GRPO steps of {GRPO_CONFIG.relative_to(HERE.parent.parent)} on {student}")
        with single_thread():
            code = main(["train", str(GRPO_CONFIG), *settings])
        if code != 0:
            raise SystemExit(code)
        evals = held_out(work / "run")
        final = work / "run" / "final"
        (final / STAMP_FILE).write_text(json.dumps({"recipe": stamp, "held_out": evals}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(final, target)
        log(f"teacher: held-out pass@1 {evals[0]['pass@1']:.2f} -> {evals[-1]['pass@1']:.2f}; saved {target}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help="cache root (default $GRPOKIT_CACHE or ~/.cache/grpokit)")
    parser.add_argument("--steps", type=int, default=STEPS, help="GRPO steps of the teacher")
    args = parser.parse_args(argv)
    print(ensure_teacher(args.cache_dir, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
