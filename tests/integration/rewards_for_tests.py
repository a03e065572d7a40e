"""Reward functions loaded by path (`file.py:function`) from the CLI tests."""


def target_fraction(prompts, completions, target, **columns):
    """The fraction of the completion's words that are ``target`` (chat completions: of its message)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(texts, target)]


def target_fraction_logged(prompts, completions, target, log, **columns):
    """target_fraction, and one line per call in ``log``: pid, whether this process is a torch.distributed
    rank, and whether it is a Ray actor."""
    import os
    import sys

    import torch.distributed

    ray = sys.modules.get("ray")
    actor = ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {int(torch.distributed.is_initialized())} {int(actor)} {len(completions)}\n")
    return target_fraction(prompts, completions, target)


def recording(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, target, **kwargs):
    """target_fraction, and what it was given: a metric and a stored column that a test checks."""
    assert all(isinstance(t, int) for ids in completion_ids for t in ids)
    log_metric("recording/global_step", float(trainer_state.global_step))
    log_extra("n_ids", [len(ids) for ids in completion_ids])
    log_extra("state", [f"{trainer_state.global_step}/{trainer_state.max_steps}"] * len(completions))
    return target_fraction(prompts, completions, target)


def always_raises(prompts, completions, **kwargs):
    raise ValueError("this reward is broken")


def raises_at_step_3(prompts, completions, trainer_state, **kwargs):
    if trainer_state.global_step == 2:  # the third step (global_step counts the updates done)
        raise RuntimeError("flaky judge at step 3")
    return [0.5] * len(completions)


def gil_hog(prompts, completions, pid_file=None, **kwargs):
    """Catastrophic backtracking, as a careless format regex does: holds the GIL for minutes."""
    import os
    import re

    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    re.match(r"^(a+)+$", "a" * 40 + "b")
    return [0.0] * len(completions)
