"""Values that flow from the rollout engine to rewards, the store and the learner."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    """How completions are sampled."""

    max_completion_length: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    min_p: float = 0.0


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

    @property
    def group_index(self) -> torch.Tensor:
        """[N] index of each completion's prompt."""
        return torch.arange(len(self.prompt_ids)).repeat_interleave(self.num_generations)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] number of real completion tokens."""
        return self.completion_mask.sum(dim=1).long()

    @property
    def truncated(self) -> torch.Tensor:
        """[N] bool, True where the completion hit max_completion_length."""
        return torch.tensor([r == "length" for r in self.finish_reasons])
