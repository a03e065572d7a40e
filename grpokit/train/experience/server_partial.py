"""Partial rollouts from a vLLM server sampling ahead (``generation.vllm_partial_rollout_tokens`` S with
``vllm_mode: server`` and ``max_staleness`` K >= 1): the rule of the Ray rollout workers
(:mod:`grpokit.rollout.partial`, whose pure pieces are used as they are), driven from the producer's thread
of :class:`~grpokit.train.experience.server_ahead.ServerAheadSampler`.

The batch of step b, admitted with version v, samples its first S tokens by v (``head_params``: the same requests and
seeds as without partial rollouts, so those tokens are a run's without them), then its samples still going continue
by w = min(v + 1, b - 1) (``switch_version``; none for batch 1): n = 1 per continuation, its own seed, the rest of
the length (``continuations`` / ``tail_params``), pushed to the server as version w (``generate_at``). w is the
learner's weights after step w: :meth:`VersionCopies.share` takes a CPU copy of them on the learner's thread (the
source's ``share_weights``, at each step before it takes its batch and before a checkpoint waits), when a batch
admitted and not collected yet continues on that version; the producer's thread waits for it
(:meth:`VersionCopies.wait`, at most ``vllm_partial_rollout_timeout`` seconds). The switch point is a token count,
so a batch is a function of (seed, step, v, w) whatever the threads' timing, and a resume stays exact.

Memory: a copy is dropped once the last batch that continues on it is collected; batches continue on versions in
admission order, and a batch's w is at most one above its v, so with the K + 1 batches' admission copies in the queue
at most K + 2 CPU copies of the weights are held at once (in the steady state the copy of w is the one the next
batch's admission took: no more than without partial rollouts).

The server holds one set of weights, pushed whenever the next request needs another version (correct and
deterministic, only more pushes). The producer finishes batches in order, head then continuations: in the steady
state a batch's head runs on the version its predecessor's continuations left there (its v is their w) and one push
a batch follows, as without partial rollouts. At the start batches 2..K+1 are all admitted at 0 and continue at 1, so
the pushes go 0, 1, 0, 1 ...: 2(K - 1) extra pushes (K = 2: 0, 1, 0, 1, 2, 3 ...), which ``vllm_server_pushes``
counts.
"""

from __future__ import annotations

from collections import Counter

from grpokit.rollout.partial import VersionWait


class VersionCopies(VersionWait):
    """CPU copies of the versions partial rollouts continue on, keyed by version, while a batch may need them (module
    docstring). ``tokens``: S; ``timeout``: seconds the producer waits for a version's copy."""

    def __init__(self, tokens: int, timeout: float) -> None:
        super().__init__(timeout)
        self.tokens = tokens
        self._copies: dict[int, dict] = {}  # version -> its CPU weights, while an uncollected batch continues on it
        self._awaited: Counter[int] = Counter()  # version -> batches admitted, not collected, continuing on it

    def admit(self, version: int) -> None:
        """A batch was admitted that continues on ``version`` (the learner's thread)."""
        with self._cond:
            self._awaited[version] += 1

    def needs(self, version: int) -> bool:
        """Whether an uncollected batch continues on ``version`` and no copy of it is held yet."""
        with self._cond:
            return self._awaited[version] > 0 and version not in self._copies

    def share(self, version: int, weights: dict) -> None:
        """``version``'s CPU weights, for the batches that continue on it (the learner's thread)."""
        with self._cond:
            self._copies[version] = weights
            self._cond.notify_all()

    def wait(self, version: int) -> dict:
        """``version``'s copy, once shared (the producer's thread); raises after ``timeout`` seconds, or when
        :meth:`interrupt` is called."""
        with self._cond:
            self._wait(lambda: version in self._copies, version)
            return self._copies[version]

    def done(self, version: int) -> None:
        """A batch that continued on ``version`` is collected: its copy goes when no other batch needs it."""
        with self._cond:
            self._awaited[version] -= 1
            if self._awaited[version] <= 0:
                del self._awaited[version]
                self._copies.pop(version, None)

    def held(self) -> list[int]:
        """The versions whose copies are held now."""
        with self._cond:
            return sorted(self._copies)
