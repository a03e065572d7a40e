"""``grpokit demo``: warm start (cached), then GRPO on arithmetic, evaluated on held-out questions.

The whole demo runs single-threaded, for the reason given in :mod:`grpokit.demo.warmstart`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from grpokit.demo.warmstart import WarmStartConfig, ensure_demo_policy, single_thread

CONFIG_PATH = Path(__file__).with_name("config.yaml")
SHOWN_QUESTIONS = 6
REWARD_WINDOW = 5


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int = 4) -> list[str]:
    """The model's greedy completion of each prompt, decoded without special tokens."""
    was_training = model.training
    model.eval()
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    output = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.train(was_training)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def run_demo(
    steps: int | None = None,
    output_dir: str | Path = "runs/demo",
    rebuild: bool = False,
    cache_dir: str | Path | None = None,
    warm_start: WarmStartConfig | None = None,
    overrides: dict | None = None,
) -> dict:
    """Warm-start (or reuse) the demo policy, train it with GRPO, and report before/after numbers.

    ``steps`` overrides the GRPO steps of ``grpokit/demo/config.yaml``; ``overrides`` any other
    config key (as in ``GRPOConfig(**overrides)``); ``cache_dir``, ``rebuild`` and ``warm_start``
    go to :func:`ensure_demo_policy`. Returns pass1/pass8/greedy before and after (held-out,
    sampled at the training temperature, n = 8 per question, unbiased pass@k), reward_start and
    reward_end (mean correctness of the training samples over the first and last 5 steps) and
    wall_seconds (warm start included when it had to be built).
    """
    from rich.console import Console
    from rich.table import Table

    from grpokit.config import load_config
    from grpokit.store import RolloutStore
    from grpokit.trl.trainer import GRPOTrainer

    console = Console()
    start = time.perf_counter()
    with single_thread():
        console.print("[bold]grpokit demo[/bold]: GRPO teaches a tiny model to add, on this CPU")
        policy = ensure_demo_policy(cache_dir, force=rebuild, config=warm_start, log=console.print)
        settings = {"model_name_or_path": str(policy), "output_dir": str(output_dir), **(overrides or {})}
        if steps is not None:
            settings["max_steps"] = steps
        config = load_config(CONFIG_PATH, settings)
        trainer = GRPOTrainer(args=config)
        size = sum(p.numel() for p in trainer.model.parameters()) / 1e6
        console.print(f"policy: {policy} ({size:.2f}M parameters, warm-started on a sloppy teacher)")
        questions = trainer.eval_rows[:SHOWN_QUESTIONS]
        prompts = [q["prompt"] for q in questions]
        answers_before = greedy_answers(trainer.model, trainer.tokenizer, prompts)
        trainer.train()
        answers_after = greedy_answers(trainer.model, trainer.tokenizer, prompts)
        with RolloutStore(trainer.run_dir, readonly=True) as store:
            evals = [e for e in store.evals() if e["dataset"] == "eval"]
            rewards = [m["rewards/arithmetic_correct/mean"] for m in store.metrics()]
    wall = time.perf_counter() - start

    window = min(REWARD_WINDOW, len(rewards))
    first, last = evals[0], evals[-1]
    result = {
        "pass1_before": first["eval/pass@1"],
        "pass1_after": last["eval/pass@1"],
        "pass8_before": first["eval/pass@8"],
        "pass8_after": last["eval/pass@8"],
        "greedy_before": first["eval/greedy_accuracy"],
        "greedy_after": last["eval/greedy_accuracy"],
        "reward_start": sum(rewards[:window]) / window,
        "reward_end": sum(rewards[-window:]) / window,
        "wall_seconds": wall,
    }

    examples = Table(title="held-out questions, greedy answers")
    for column in ("question", "right", "before GRPO", "after GRPO"):
        examples.add_column(column)
    for q, before, after in zip(questions, answers_before, answers_after):
        examples.add_row(q["prompt"], q["answer"], _marked(before, q["answer"]), _marked(after, q["answer"]))
    summary = Table(title=f"held-out accuracy ({int(first['eval/num_prompts'])} questions, 8 samples each)")
    for column in ("", "before", "after"):
        summary.add_column(column)
    for label, key in (("pass@1 (sampled)", "pass1"), ("pass@8", "pass8"), ("greedy", "greedy")):
        summary.add_row(label, f"{result[key + '_before']:.2f}", f"{result[key + '_after']:.2f}")
    summary.add_row(
        f"train reward (first / last {window} steps)", f"{result['reward_start']:.2f}", f"{result['reward_end']:.2f}"
    )
    summary.add_row("wall time (s)", "", f"{wall:.0f}")
    console.print(examples, summary)
    console.print(f"done in {wall:.0f}s; run folder {trainer.run_dir} (grpokit inspect / report.html)")
    return result


def _marked(answer: str, right: str) -> str:
    return f"[green]{answer}[/green]" if answer.strip() == right else f"[red]{answer}[/red]"
