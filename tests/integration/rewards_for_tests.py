"""Reward functions loaded by path (`file.py:function`) from the CLI tests."""


def target_fraction(prompts, completions, target, **columns):
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]


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
