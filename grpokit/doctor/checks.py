"""The doctor's checks of a built run (grpokit/doctor/__init__.py): a line per check and the exit status;
`grpokit doctor` (commands/doctor.py) builds the run and prints them."""

from __future__ import annotations


def doctor(run, groups: int = 4) -> tuple[list[str], int]:
    """(the lines, the exit status) of every check of the built ``run``, which it closes."""
    from grpokit.doctor.result import summary

    try:
        checks = _checks(run, groups)
    finally:
        run.rollout_scheduler.close()
        run.rewards.close()
    line, code = summary(checks)
    return [c.line() for c in checks] + [line], code


def refused(message: str) -> tuple[list[str], int]:
    """(the lines, the exit status) when the run could not be built: grpokit's own error, which names the fix."""
    from grpokit.doctor.result import FAIL, Check, summary

    check = Check("inputs", FAIL, message.splitlines()[0])
    return [check.line(), *summary([check])[:1]], 1


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
    column, G = run.evaluator.prompt_column, sample.rollouts.num_generations
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
