"""Code RL on a CPU: a tiny model learns to write one-line Python functions, scored by running them.

    python examples/code/run.py                  # build the data and the warm start, then GRPO; prints before/after
    python examples/code/run.py --steps 40 --out runs/code

The task (built here, no download): a description such as ``add 23:`` and a program ``f=lambda x:x+23`` that the
``code`` reward runs, in its sandbox, against the row's ``test_list`` (``assert f(2)==25``, ``assert f(7)==30``).
Four operations (add, sub, mul, from: ``f=lambda x:23-x``) with constants 0-39: 160 descriptions, 128 to train on,
32 held out. The warm start (as ``grpokit demo``'s, grpokit/demo/warmstart.py) first learns right programs, then a
sloppy teacher that writes the constant one too high 70 % of the time; GRPO with the code reward switches that
habit off, which raises held-out pass@1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from grpokit.data.char_tokenizer import build_char_tokenizer
from grpokit.demo.warmstart import WarmStartConfig, _lr_factor, build_model, single_thread

HERE = Path(__file__).parent
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789+-*=:() "
OPERATIONS = {"add": "x+{k}", "sub": "x-{k}", "mul": "x*{k}", "from": "{k}-x"}
VALUES = {"add": lambda x, k: x + k, "sub": lambda x, k: x - k, "mul": lambda x, k: x * k, "from": lambda x, k: k - x}
INPUTS = (2, 7)
# the warm start: smaller than the demo's schedule (the programs are longer, so a step costs more)
WARM_START = WarmStartConfig(clean_steps=600, sloppy_steps=200, batch_size=64, teacher_accuracy=0.3)


def program(op: str, k: int) -> str:
    return "f=lambda x:" + OPERATIONS[op].format(k=k)


def make_row(op: str, k: int) -> dict:
    expected = [VALUES[op](x, k) for x in INPUTS]
    return {
        "prompt": f"{op} {k}:",
        "test_list": [f"assert f({x})=={y}" for x, y in zip(INPUTS, expected)],
        "op": op,
        "k": k,
    }


def splits(seed: int = 0) -> tuple[list[dict], list[dict]]:
    rows = [make_row(op, k) for op in OPERATIONS for k in range(40)]
    random.Random(seed).shuffle(rows)
    return rows[32:], rows[:32]


def sloppy_program(op: str, k: int, accuracy: float, rng: random.Random) -> str:
    """Right with probability ``accuracy``, else the constant one too high (one shared habit GRPO can remove)."""
    return program(op, k if rng.random() < accuracy else k + 1)


def warm_start(config: WarmStartConfig, train: list[dict], log=print):
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_model(tokenizer, config)
    rng = random.Random(config.seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    total = config.clean_steps + config.sloppy_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, total))
    model.train()
    start = time.perf_counter()
    for step in range(total):
        accuracy = 1.0 if step < config.clean_steps else config.teacher_accuracy
        rows, targets = [], []
        for _ in range(config.batch_size):
            row = train[rng.randrange(len(train))]
            prompt_ids = tokenizer(row["prompt"])["input_ids"]
            label = tokenizer(sloppy_program(row["op"], row["k"], accuracy, rng), add_special_tokens=False)
            label_ids = label["input_ids"] + [eos]
            rows.append(prompt_ids + label_ids)
            targets.append([-100] * len(prompt_ids) + label_ids)
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # [batch, width]
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])  # [batch, width]
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 200 == 0 or step == total - 1:
            log(f"warm start {step + 1}/{total}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    return model, tokenizer


def build(out: Path, config: WarmStartConfig = WARM_START, log=print) -> Path:
    """Write ``out/train.jsonl``, ``out/eval.jsonl`` and the warm-started policy ``out/policy``."""
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = splits()
    for name, rows in (("train", train), ("eval", held_out)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with single_thread():
        model, tokenizer = warm_start(config, train, log)
    model.save_pretrained(out / "policy")
    tokenizer.save_pretrained(out / "policy")
    return out / "policy"


def train(out: Path, steps: int, overrides: list[str] = ()) -> dict:
    """GRPO with examples/code/config.yaml on the built task; returns held-out pass@1 before and after."""
    from grpokit.cli import main

    settings = [
        f"model_name_or_path={out / 'policy'}",
        f"train_dataset={out / 'train.jsonl'}",
        f"eval_dataset={out / 'eval.jsonl'}",
        f"output_dir={out / 'run'}",
        f"max_steps={steps}",
        *overrides,
    ]
    with single_thread():
        code = main(["train", str(HERE / "config.yaml"), *settings])
    if code != 0:
        raise SystemExit(code)
    evals = [
        json.loads(line)
        for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
        if "eval/pass@1" in json.loads(line)
    ]
    return {"before": evals[0]["eval/pass@1"], "after": evals[-1]["eval/pass@1"], "evals": evals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/code", help="folder for the data, the warm start and the run")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the data and the warm start")
    parser.add_argument("overrides", nargs="*", help="key=value settings for grpokit train")
    args = parser.parse_args(argv)
    out = Path(args.out)
    start = time.perf_counter()
    if args.rebuild or not (out / "policy" / "model.safetensors").exists():
        build(out)
    result = train(out, args.steps, args.overrides)
    print(
        f"held-out pass@1 {result['before']:.2f} -> {result['after']:.2f} ({time.perf_counter() - start:.0f} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
