"""The learner's side of partial rollouts in Ray rollout workers (:mod:`grpokit.rollout.partial`): which
batches wait for which version, and when their continuations are launched.

A batch admitted with a switch version w (its first S tokens sampled by the admitted version, the rest by w) is
*waiting* until w is published. :meth:`PartialTails.published` is called when the learner publishes a version, on
the learner's thread, before the batch admitted in the same step is submitted: the continuations of every waiting
batch whose w has come are launched there and then, each chunk's on its worker with the head's result passed as
an ObjectRef (Ray runs an actor's calls in the order they were made, so a continuation runs before the next
batch's head, whatever the threads' timing; what either samples does not depend on it). The producer's thread
waits for a batch's continuations to be launched (:meth:`PartialTails.wait`, at most ``timeout`` seconds, then
:class:`~grpokit.rollout.partial.PartialRolloutTimeout`) and collects them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpokit.rollout.partial import VersionWait


class PartialTails(VersionWait):
    """Published versions still needed, the batches waiting for theirs, and the wait (see the module docstring).
    ``tokens``: S; ``timeout``: seconds a batch may wait for its version to be published."""

    def __init__(self, tokens: int, timeout: float) -> None:
        super().__init__(timeout)
        self.tokens = tokens
        self.weights: dict[int, list] = {}  # version -> [ObjectRef] of its weights, while a batch may need them
        self._waiting: list[Any] = []  # PendingRollouts whose switch version is not published yet

    def admit(self, pending) -> None:
        """``pending`` (a batch with a switch version) waits for it."""
        with self._cond:
            self._waiting.append(pending)

    def published(self, version: int, weights: list, launch: Callable[[Any], dict]) -> None:
        """``version``'s weights ([ObjectRef]) are published: ``launch(pending)`` the continuations of every batch
        waiting for it (their refs go to ``pending.tails``), in the order the batches were admitted."""
        with self._cond:
            self.weights[version] = weights
            due = [p for p in self._waiting if p.switch <= version]
            self._waiting = [p for p in self._waiting if p.switch > version]
            for pending in due:
                pending.tails = launch(pending)
            self._cond.notify_all()

    def wait(self, pending) -> None:
        """Until ``pending``'s continuations are launched (its version published); raises after ``timeout`` seconds
        or when :meth:`interrupt` is called."""
        with self._cond:
            self._wait(lambda: pending.tails is not None, pending.switch)

    def done(self, pending) -> None:
        """``pending`` is collected: batches are collected in order, so no later one needs an older version."""
        with self._cond:
            for version in [v for v in self.weights if v < pending.switch]:
                del self.weights[version]
