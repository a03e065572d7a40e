"""A slow reward for tests/integration/test_signals.py: its ``at``-th call sends ``signal`` to the training
process (pid in $GRPOKIT_TEST_TRAINER_PID), then sleeps, so the signal lands while rewards are computed.
Calls are counted in the file $GRPOKIT_TEST_CALLS, which works whether the runner calls it in a thread or
in a worker process."""

import os
import signal as signals
import time


def slow_target_fraction(prompts, completions, target, at=2, signal="SIGTERM", **columns):
    with open(os.environ["GRPOKIT_TEST_CALLS"], "a+") as f:
        f.write(".")
        f.seek(0)
        calls = len(f.read())
    if calls == at:
        os.kill(int(os.environ["GRPOKIT_TEST_TRAINER_PID"]), getattr(signals, signal))
        time.sleep(2.0)
    return [c.split().count(t) / max(1, len(c.split())) for c, t in zip(completions, target)]
