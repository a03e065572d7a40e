"""Values that flow from the rollout engine to rewards, the store and the learner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SamplingParams:
    """How completions are sampled. The fields after ``min_p`` are transformers' logits processors grpokit honours
    (TRL's ``repetition_penalty`` and ``generation_kwargs``; :mod:`grpokit.rollout.logits_rules`), each off at its
    default."""

    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float  # a token already in the prompt or completion: logit / p if > 0, else logit * p
    greedy: bool = False
    no_repeat_ngram_size: int = 0  # n > 0: no n-gram occurs twice in prompt + completion
    min_new_tokens: int = 0  # EOS cannot be sampled before this many tokens of a completion (or turn)
    suppress_tokens: tuple[int, ...] = ()  # never sampled
    begin_suppress_tokens: tuple[int, ...] = ()  # not sampled as a completion's (or turn's) first token
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never completed
    # generation_kwargs only transformers' generate honours (num_beams, length_penalty, typical_p ...): they make
    # the run sample with generation.engine: transformers (grpokit.rollout.transformers_engine)
    transformers_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def plain(cls, max_completion_length: int, temperature: float = 1.0, **rules: Any) -> SamplingParams:
        """Sampling from the whole distribution at ``temperature``: no top-p, top-k or min-p filter, no repetition
        penalty (each filter's "off" value, not a setting's default: a run's come from its config), plus ``rules``
        (``greedy``, the logits processors)."""
        return cls(max_completion_length, temperature, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, **rules)

    @property
    def has_rules(self) -> bool:
        """Whether any logits processor is on (:class:`grpokit.rollout.logits_rules.LogitsRules`)."""
        return bool(
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram_size
            or self.min_new_tokens
            or self.suppress_tokens
            or self.begin_suppress_tokens
            or self.bad_words_ids
        )


@dataclass
class Turn:
    """One message of a multi-turn rollout after its prompt, as the store keeps it.

    ``role``: "assistant" (a turn the model generated) or "tool" (one call's result). ``text``: the
    assistant's text as generated (tool calls included, end-of-turn token left out) or the tool
    message's content. ``tokens``: [start, end) of the turn's tokens in the rollout's ``completion_ids``
    (for a tool message, the tokens appended after that round, shared by the round's tool messages;
    None when its result was not shown). ``tool_calls``: the assistant's calls ({"name", "arguments"}).
    For tool messages: ``name``, ``arguments``, ``status`` (grpokit.tools.STATUSES), ``error``.
    ``started`` / ``ended``: ``time.monotonic()`` around the turn's decoding or the call.
    """

    role: str
    text: str
    tokens: tuple[int, int] | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None
    arguments: dict[str, Any] | None = None
    status: str | None = None
    error: str | None = None
    started: float | None = None
    ended: float | None = None


@dataclass
class Conversation:
    """A multi-turn rollout's record: ``messages`` after the prompt (assistant and tool chat messages,
    what reward functions see as the completion), ``turns`` (:class:`Turn`, one per message, then one per
    tool result not shown because it did not fit in the token budget),
    ``stop_reason`` ("answered" | "max_iterations" | "length") and ``tool_rounds`` run."""

    messages: list[dict[str, Any]]
    turns: list[Turn]
    stop_reason: str
    tool_rounds: int


@dataclass
class Rollouts:
    """G completions for each of B prompts; the G completions of a prompt are adjacent (N = B*G).

    Token tensors are right-padded with ``pad_token_id`` to T = the longest completion.
    """

    prompt_ids: list[list[int]]  # B lists of prompt token ids (unpadded)
    completion_ids: torch.Tensor  # [N, T] long
    completion_mask: torch.Tensor  # [N, T] float, 1 = a real completion token (EOS included)
    # [N, T] float32, sampling log-probs at the sampling temperature; the HF engine's are before
    # min-p/top-k/top-p filtering, vLLM's after it (the distribution the token was drawn from)
    logprobs: torch.Tensor
    finish_reasons: list[str]  # N values: "stop" (EOS) | "length" (hit max_completion_length)
    num_generations: int  # G
    policy_version: int = 0  # optimizer steps of the policy that sampled these
    # multi-turn rollouts (grpokit.rollout.multiturn): completion_ids hold every token after the prompt, the
    # model's and those the environment added (tool results, template tokens); loss_mask [N, T] float is 1 on
    # the tokens the model sampled (None: the same as completion_mask); conversations: N records of the turns
    loss_mask: torch.Tensor | None = None
    conversations: list[Conversation] | None = None
    # columns for the reward functions that came with the rollouts, not from the dataset (a rollout_func's other
    # keys, grpokit.rollout.rollout_func): {name: N values, one per completion}; None: none
    columns: dict[str, list] | None = None
    # [N, T] long, the policy version that sampled each token (a partial rollout continued on newer weights,
    # grpokit.rollout.vllm.partial; 0 on padding); None: every token by policy_version, the oldest of them
    token_versions: torch.Tensor | None = None
    # images a tool showed inside a completion (multi-turn rollouts with a vision-language model; docs/vision.md,
    # "Tools that return images"). completion_pixels: N entries, each None (no image) or the processor's pixel inputs
    # of that completion's images in the order of their placeholders in completion_ids, concatenated along dim 0 as
    # the processor batches them ({"pixel_values": [patches, D], "image_grid_thw": [k, 3]} for Qwen2-VL): a
    # completion's full input is its prompt's VisionPrompt.pixels (if any) then these, concatenated.
    # completion_images: N lists of those PIL images; completion_image_hashes: N lists of their sha256 (PNG bytes,
    # models.vision_inputs.image_hash), what the store keeps them by. All None when no completion holds an image.
    completion_pixels: list[dict[str, torch.Tensor] | None] | None = None
    completion_images: list[list[Any]] | None = None
    completion_image_hashes: list[list[str]] | None = None

    @property
    def group_index(self) -> torch.Tensor:
        """[N] index of each completion's prompt."""
        return torch.arange(len(self.prompt_ids)).repeat_interleave(self.num_generations)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] number of real completion tokens."""
        return self.completion_mask.sum(dim=1).long()

    @property
    def sampled_lengths(self) -> torch.Tensor:
        """[N] tokens the model sampled: ``completion_lengths`` without the tokens tools and templates added
        (TRL's completion lengths of multi-turn rollouts)."""
        mask = self.completion_mask if self.loss_mask is None else self.loss_mask
        return mask.sum(dim=1).long()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Rollouts:
        """Rollouts from ``dataclasses.asdict`` of Rollouts (a checkpoint's), conversations rebuilt."""
        values = dict(values)
        if values.get("conversations") is not None:
            values["conversations"] = [
                Conversation(
                    c["messages"],
                    [Turn(**{**t, "tokens": None if t["tokens"] is None else tuple(t["tokens"])}) for t in c["turns"]],
                    c["stop_reason"],
                    c["tool_rounds"],
                )
                for c in values["conversations"]
            ]
        return cls(**values)

    @property
    def truncated(self) -> torch.Tensor:
        """[N] bool, True where the completion hit max_completion_length."""
        return torch.tensor([r == "length" for r in self.finish_reasons])
