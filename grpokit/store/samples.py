"""The report's best and worst completions of chosen steps, and how a stored rollout is drawn in HTML (a prompt with
images: their thumbnails under it, store/thumbs.py)."""

from __future__ import annotations

import json

from grpokit.store.html_text import number, text
from grpokit.store.store import RolloutStore
from grpokit.store.thumbs import thumbnails


def fmt(value) -> str:
    """A stored number for the page: 4 significant digits, "-" for None, a value of another type escaped."""
    return number(value)


def best_and_worst(store: RolloutStore, steps: list[int]) -> list[dict]:
    """[{"step", "best", "worst"}] for the ``steps`` that have rewarded rollouts."""
    samples = []
    for step in steps:
        best = store.rollouts(step=step, order_by_reward="desc", limit=1)
        worst = store.rollouts(step=step, order_by_reward="asc", limit=1)
        if best:
            samples.append({"step": step, "best": best[0], "worst": worst[0]})
    return samples


def samples_html(samples: list[dict], images_url: str = "images", known: dict[str, dict] | None = None) -> str:
    """The section of :func:`best_and_worst`'s ``samples``; ``known``: ``RolloutStore.images`` of their prompts'
    images, drawn as thumbnails of ``images_url`` (the run's images folder relative to the page)."""
    body = "\n".join(_sample_section(s, images_url, known or {}) for s in samples) or "<p>No rollouts stored.</p>"
    return f'<section id="samples" class="view"><h2>Best and worst completions</h2>\n{body}</section>'


def _sample_section(sample: dict, images_url: str, known: dict[str, dict]) -> str:
    best, worst = sample["best"], sample["worst"]
    return (
        f"<h3>Step {text(sample['step'])}</h3>\n"
        + rollout_html(best, "best", thumbnails(best.get("images"), known, images_url))
        + "\n"
        + rollout_html(worst, "worst", thumbnails(worst.get("images"), known, images_url))
    )


def rollout_html(rollout: dict, kind: str, thumbs: str = "") -> str:
    """One stored rollout: its rewards, advantage, length, prompt (and ``thumbs``, its images), completion."""
    rewards = ", ".join(f"{text(name)} {fmt(v)}" for name, v in sorted(rollout["rewards"].items(), key=str))
    error = f'<div class="error">error: {text(rollout["error"])}</div>' if rollout["error"] is not None else ""
    # log_extra columns (the code reward's per-test results: code_tests), as `grpokit inspect` shows them
    extra = "".join(
        f'<div class="extra">{text(column)}: {text(json.dumps(value, default=str))}</div>'
        for column, value in sorted((rollout.get("extra") or {}).items(), key=str)
    )
    return (
        f'<div class="sample {kind}"><b>{kind}</b>: reward {fmt(rollout["reward"])} '
        f"({rewards}) · advantage {fmt(rollout['advantage'])} · "
        f"{fmt(rollout['completion_tokens'])} tokens · {text(rollout['finish_reason'])} · "
        f"prompt {text(rollout['prompt_index'])} #{text(rollout['completion_index'])}"
        f'<pre class="prompt">{text(rollout["prompt"])}</pre>{thumbs}'
        f"{completion_html(rollout)}{extra}{error}</div>"
    )


def completion_html(rollout: dict) -> str:
    """The completion; a multi-turn rollout as its conversation (each turn, each tool call and its result)."""
    conversation = rollout.get("conversation")
    if not conversation:
        return f'<pre class="completion">{text(rollout["completion"])}</pre>'
    parts = []
    for turn in conversation["turns"]:
        if turn["role"] == "tool":
            arguments = json.dumps(turn.get("arguments") or {}, ensure_ascii=False)
            head = f"tool {turn.get('name')}({arguments}) -> {turn.get('status')}"
            if "duration" in turn:
                head += f", {number(turn['duration'], '.3g')} s"
            error = f"\nerror: {turn['error']}" if turn.get("error") else ""
            parts.append(f'<pre class="tool">{text(head)}\n{text(turn["text"])}{text(error)}</pre>')
        else:
            parts.append(f'<pre class="completion">{text(turn["text"])}</pre>')
    rounds = conversation["tool_rounds"]
    ended = f"ended: {conversation['stop_reason']} after {rounds} tool round{'s' * (rounds != 1)}"
    return "".join(parts) + f'<div class="meta">{text(ended)}</div>'
