"""RolloutRecord: one completion as the rollout store keeps it, and how a training step's records are built.

Numbers are finite or None once a record exists: JSON has no NaN or infinity, and SQLite stores a NaN
REAL as NULL anyway, so a reward that does not apply (NaN) or overflowed is None from here on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.store.versions import version_runs


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float, or None when it is None, NaN or infinite."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class RolloutRecord:
    """One completion of one step: what it was sampled from and what it scored.

    ``rewards``: each reward function's value (None where it did not apply or failed); ``reward`` the
    weighted sum; ``error`` the reward errors of this completion; ``extra`` the ``log_extra`` columns
    (a JSON-able dict, or None); ``conversation`` a multi-turn rollout's turns (:func:`conversation_record`),
    None for a single-turn completion; ``token_versions`` the runs of its tokens' policy versions
    (:mod:`grpokit.store.versions`), None when every token is by ``policy_version``; ``per_token`` its per-token
    values (:mod:`grpokit.store.token_values`: ``tokens``, a list of each token's text, and a float16 blob per kept
    value), None when none are kept; ``images`` the sha256 of each image of its prompt then of each image a tool
    showed in its completion (None: none), and
    ``image_sources`` those images (PIL), for the store to write the ones it does not have (not a column).
    """

    prompt_index: int
    completion_index: int
    prompt: str
    completion: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    rewards: dict[str, float | None]
    reward: float | None
    advantage: float | None
    policy_version: int
    error: str | None = None
    extra: dict[str, Any] | None = None
    conversation: dict[str, Any] | None = None
    token_versions: list[list[int]] | None = None
    per_token: dict[str, Any] | None = None
    teacher_logprobs: bytes | None = None  # on-policy distillation: float32 per token (store/teacher_values.py)
    teacher_tokens_key: str | None = None  # the teacher and the tokens it scored (train/teacher/replay.py)
    images: list[str] | None = None
    image_sources: list | None = None

    def __post_init__(self) -> None:
        self.rewards = {name: finite_or_none(value) for name, value in self.rewards.items()}
        self.reward = finite_or_none(self.reward)
        self.advantage = finite_or_none(self.advantage)


def conversation_record(conversation: Any) -> dict[str, Any]:
    """A multi-turn rollout (a ``rollout.types.Conversation``) as the store keeps it (JSON-able):
    ``{"stop_reason", "tool_rounds", "turns": [...]}``, each turn with its ``role`` and ``text``, and where they
    apply ``tool_calls`` (an assistant's), ``name``, ``arguments``, ``status``, ``error`` (a tool result's),
    ``tokens`` ([start, end) in the completion's tokens), ``images`` (a tool result's images, sha256), ``start``
    (seconds after the first turn began) and ``duration`` (seconds)."""
    begun = [t.started for t in conversation.turns if t.started is not None]
    t0 = min(begun) if begun else 0.0
    turns = []
    for turn in conversation.turns:
        fields = {
            "role": turn.role,
            "text": turn.text,
            "tool_calls": turn.tool_calls or None,
            "name": turn.name,
            "arguments": turn.arguments,
            "status": turn.status,
            "error": turn.error,
            "tokens": None if turn.tokens is None else list(turn.tokens),
            "images": getattr(turn, "images", None) or None,
            "start": None if turn.started is None else round(turn.started - t0, 6),
            "duration": None if turn.started is None or turn.ended is None else round(turn.ended - turn.started, 6),
        }
        turns.append({k: v for k, v in fields.items() if v is not None})
    return {"stop_reason": conversation.stop_reason, "tool_rounds": conversation.tool_rounds, "turns": turns}


def completion_runs(rollouts: Any, n: int) -> list[list[int]] | None:
    """Completion ``n``'s per-token policy versions as stored runs (None: all by ``rollouts.policy_version``)."""
    if getattr(rollouts, "token_versions", None) is None:
        return None
    length = int(rollouts.completion_lengths[n])
    return version_runs(rollouts.token_versions[n, :length].tolist(), rollouts.policy_version)


def prompt_images(prompt: Any) -> dict[str, Any]:
    """A record's ``images`` and ``image_sources`` for a prompt's token ids (a ``VisionPrompt`` carries its images'
    hashes and images; a text prompt has none)."""
    hashes = getattr(prompt, "image_hashes", None)
    if not hashes:
        return {}
    return {"images": list(hashes), "image_sources": list(getattr(prompt, "images", None) or [])}


def record_images(prompt: Any, rollouts: Any, n: int) -> dict[str, Any]:
    """:func:`prompt_images`, then the images tools showed in completion ``n`` (``Rollouts.completion_image_hashes``
    and ``completion_images``): each stored once by its hash, the row naming them in order."""
    found = prompt_images(prompt)
    hashes = getattr(rollouts, "completion_image_hashes", None)
    if not hashes or not hashes[n]:
        return found
    return {
        "images": [*found.get("images", []), *hashes[n]],
        "image_sources": [*found.get("image_sources", []), *rollouts.completion_images[n]],
    }


def rollout_records(
    indices: Sequence[int], rollouts: Any, completions: Sequence[str], reward: Any, advantages: Any, source: Any
) -> list[RolloutRecord]:
    """The records of one step's rollouts, in the rollouts' order.

    ``indices``: the prompt index of each group; ``rollouts``: the step's ``rollout.Rollouts`` (G =
    ``num_generations`` adjacent completions per prompt); ``completions``: their decoded texts;
    ``reward``: their ``rewards.RewardResult``; ``advantages``: [N]; ``source``: the ``PromptSource``
    they were drawn from (its ``texts`` and token ``ids`` per prompt index).
    """
    G = rollouts.num_generations
    per_func = reward.per_func.tolist()  # [N][F]
    records = []
    for n, text in enumerate(completions):
        i = indices[n // G]
        records.append(
            RolloutRecord(
                prompt_index=i,
                completion_index=n % G,
                prompt=source.texts[i],
                completion=text,
                prompt_tokens=len(source.ids[i]),
                completion_tokens=int(rollouts.completion_lengths[n]),
                finish_reason=rollouts.finish_reasons[n],
                rewards=dict(zip(reward.names, per_func[n])),
                reward=float(reward.combined[n]),
                advantage=float(advantages[n]),
                policy_version=rollouts.policy_version,
                error=reward.errors[n],
                extra={column: values[n] for column, values in reward.extra.items()} or None,
                conversation=None if rollouts.conversations is None else conversation_record(rollouts.conversations[n]),
                token_versions=completion_runs(rollouts, n),
                **record_images(source.ids[i], rollouts, n),
            )
        )
    return records
