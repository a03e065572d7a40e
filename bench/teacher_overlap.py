"""What a slow served teacher costs a distillation step: examples/distill's run (the demo's student, 16 prompts x 8
completions a step) against its teacher behind a test server that waits ``--delay`` seconds per request.

    python bench/teacher_overlap.py --delay 0.2 --steps 12 [--max-staleness 1]

Needs examples/distill's cached student and teacher (`python examples/distill/teacher.py`). Prints the medians over
the steps after the first of ``distill/seconds`` (the time the learner waited for the teacher), ``distill/request_
seconds`` (the request's own time, when the run reports it), ``time/logprobs`` and ``step_time``. ``--beta`` > 0 adds
the reference pass the request overlaps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpokit.cli import main as grpokit_main  # noqa: E402
from grpokit.demo.warmstart import single_thread  # noqa: E402
from grpokit.system.cached_folders import default_cache_root  # noqa: E402
from grpokit.testing.teacher_server import serve_teacher  # noqa: E402

KEYS = ("distill/seconds", "distill/request_seconds", "time/logprobs", "step_time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the server waits per request")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (> 0: a reference pass)")
    parser.add_argument("--max-staleness", type=int, default=0, help=">= 1: sampled ahead, the teacher one step ahead")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    teacher = default_cache_root() / "distill-teacher-v1"
    model = AutoModelForCausalLM.from_pretrained(teacher, dtype="float32").eval()
    server, url = serve_teacher(model, model.config.vocab_size, delay=args.delay, batched=True)
    try:
        with tempfile.TemporaryDirectory() as out, single_thread():
            settings = [f"teacher_server_url={url}", "teacher_model_name_or_path=null", f"beta={args.beta}"]
            settings += [f"max_staleness={args.max_staleness}"]
            settings += [f"max_steps={args.steps}", "eval_steps=0", f"output_dir={out}/run", "progress_bar=false"]
            settings += [f"model_name_or_path={default_cache_root() / 'demo-policy-v1'}", "report_to=[jsonl]"]
            code = grpokit_main(["train", str(ROOT / "examples" / "distill" / "config.yaml"), *settings])
            lines = [json.loads(line) for line in (Path(out) / "run" / "metrics.jsonl").read_text().splitlines()]
    finally:
        server.shutdown()
    steps = [m for m in lines if "step_time" in m][1:]
    medians = {k: statistics.median(m[k] for m in steps) for k in KEYS if all(k in m for m in steps)}
    head = {"delay": args.delay, "beta": args.beta, "max_staleness": args.max_staleness, "steps": len(steps)}
    print(json.dumps({**head, **medians}, indent=2))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
