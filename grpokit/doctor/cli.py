"""`grpokit doctor [--groups N] CONFIG [key=value ...]` (options go before the config: what follows it are
overrides): build the run as `grpokit train` would, check it, and print a line per check (grpokit/doctor/__init__.py);
exit 1 when a check failed. grpokit/cli.py adds the command with `register(subparsers)`."""

from __future__ import annotations

import argparse
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check a setup before training: data, templates, tokens, sampler-learner parity, rewards, resources",
        description="Check a config before training: its data and prompt lengths, EOS and pad, the chat template "
        "(renders, prefix-preserving), token round trips, the sampler-learner log-prob gap, the rewards (time, None "
        "and error rates, spread, zero-variance groups), memory and time per step. One line per check, with the "
        "fix on a failure; exit status 1 when a check failed. Writes nothing.",
    )
    p.add_argument("config", help="a YAML config (as `grpokit train` takes)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value settings that replace the config's")
    p.add_argument("--groups", type=int, default=4, help="groups of G completions to sample (default 4); before CONFIG")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from grpokit.commands.user_errors import command_overrides
    from grpokit.config import load_config

    started = time.perf_counter()
    cfg = load_config(args.config, command_overrides(args.overrides))
    lines, code = doctor(cfg, groups=max(1, args.groups))
    print("\n".join(lines))
    print(f"doctor took {time.perf_counter() - started:.1f} s")
    return code


def doctor(cfg, groups: int = 4) -> tuple[list[str], int]:
    """(the lines, the exit status) of every check of the config ``cfg``."""
    from grpokit.commands.user_errors import is_user_error
    from grpokit.compose.run import build_run
    from grpokit.doctor.result import FAIL, Check, summary

    try:
        run = build_run(cfg)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        check = Check("inputs", FAIL, str(exc).splitlines()[0])  # grpokit's own errors name the fix
        return [check.line(), *summary([check])[:1]], 1
    try:
        checks = _checks(run, groups)
    finally:
        run.rollout_scheduler.close()
        run.rewards.close()
    line, code = summary(checks)
    return [c.line() for c in checks] + [line], code


def _checks(run, groups: int) -> list:
    from grpokit.doctor import inputs, resources, samples
    from grpokit.doctor.result import SKIP, Check

    rows = [run.train_rows[i] for i in [int(i) for i in run.train_source.usable][:groups]]
    checks = [
        inputs.data_check(run),
        inputs.prompt_length_check(run),
        inputs.eos_pad_check(run),
        inputs.template_check(run, rows),
    ]
    if run.engine.takes_raw_prompts:  # a rollout_func samples as it likes, from the trainer's own closure
        skipped = "the rollout_func engine samples through the trainer: run a step to see its rollouts"
        return [*checks, Check("sampling checks", SKIP, skipped), resources.memory_check(run)]
    sample = samples.sample_groups(run, groups)
    column, G = run.evaluator.spec.prompt_column, sample.rollouts.num_generations
    texts = [samples.decode(run.tokenizer, ids[: int(n)].tolist()) for ids, n in zip(
        sample.rollouts.completion_ids[::G], sample.rollouts.completion_lengths[::G])]  # fmt: skip
    chats = [
        [*run.train_rows[i][column], {"role": "assistant", "content": text}]
        for i, text in zip(sample.indices, texts)
        if isinstance(run.train_rows[i][column], list)
    ]
    checks += [
        inputs.prefix_check(run, chats),
        samples.round_trip_check(run, sample),
        samples.parity_check(run, sample),
        *samples.reward_checks(run, sample),
        resources.memory_check(run),
    ]
    checks.append(
        resources.step_time_check(run, sample.sample_seconds, sample.score_seconds, sample.forward_seconds, groups)
    )
    return checks
