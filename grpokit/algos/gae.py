"""PPO's advantages from a learned value: token-level rewards, GAE, masked whitening.

Shapes: N sequences, T completion tokens, right-padded. ``completion_mask`` [N, T] is 1 on real
completion tokens (a masked-out token inside a row is skipped, as verl skips observation tokens).
``values[:, t]`` is the critic's V(s_t), the value of the state before completion token t is
emitted, i.e. read at the same position as the logits that give ``logprobs[:, t]`` (as in verl's
critic and TRL's former PPOTrainer). Results are 0 at padding.
"""

from __future__ import annotations

import torch

from grpokit.algos.kl import kl_estimate
from grpokit.algos.masked import masked_mean, masked_sum

# Added to the variance before the inverse square root in whitening, as verl and TRL do.
WHITEN_EPS = 1e-8


def last_token_rewards(rewards: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Sequence rewards placed on the last completion token, [N] x [N, T] -> [N, T].

    r_{i,t} = R_i if t is the last masked-in token of row i (t = |o_i| - 1 with right padding) else 0
    (Ouyang et al. 2022, InstructGPT: the reward model scores the whole completion, once, at its
    end). A row without completion tokens gets no reward. NaN rewards ("no reward applies") are
    refused: PPO has no neutral value for them, so the caller drops those rows or gives them a
    reward first.
    """
    if rewards.dim() != 1 or rewards.size(0) != completion_mask.size(0):
        raise ValueError(
            f"rewards must be [N] for a completion mask of {tuple(completion_mask.shape)}, got {tuple(rewards.shape)}"
        )
    if rewards.isnan().any():
        raise ValueError("rewards contain NaN (no reward applied); drop those rows or give them a reward first")
    mask = completion_mask.bool()  # [N, T]
    positions = torch.arange(mask.size(1), device=mask.device).expand(mask.shape)  # [N, T]
    last = positions.masked_fill(~mask, -1).amax(dim=1)  # [N, T] -> [N]: last masked-in token, -1 if none
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    token_rewards = torch.zeros(mask.shape, dtype=dtype, device=rewards.device)  # [N, T]
    placed = torch.where(last >= 0, rewards.to(dtype), 0.0)  # [N]
    return token_rewards.scatter(1, last.clamp(min=0)[:, None], placed[:, None])  # [N, T]


def kl_in_reward(
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    completion_mask: torch.Tensor,
    beta: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token KL penalty folded into the rewards: (rewards - beta * kl, kl), all [N, T].

    r'_{i,t} = r_{i,t} - beta * KL_{i,t}, with KL_{i,t} the ``kind`` estimator (``algos.kl``; k1 =
    logprobs - ref_logprobs is InstructGPT's and verl's default) of the tokens' log-probs under the
    policy that sampled them (``old_logprobs``) and the reference (Ziegler et al. 2019; Ouyang et
    al. 2022). The KL is 0 at padding; ``aggregate(kl, mask, "grpo")`` is the measured KL that verl
    gives the adaptive controller (mean over sequences of the per-token mean).
    """
    mask = completion_mask.to(token_rewards.dtype)  # [N, T]
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), kind).to(token_rewards.dtype) * mask  # [N, T]
    return token_rewards - beta * kl, kl


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, completion_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation: (advantages, returns), both [N, T], 0 at padding.

    delta_t = r_t + gamma * V_{t+1} - V_t  and  A_t = sum_l (gamma * lam)^l delta_{t+l}  (Schulman et
    al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation"), with
    V = 0 after the last token; returns R_t = A_t + V_t are the critic's targets. Masked-out tokens
    are skipped (t+1 is the next masked-in token), as in verl's ``compute_gae_advantage_return``;
    with right padding that is simply the end of the sequence. No gradient flows (targets).
    """
    if not token_rewards.shape == values.shape == completion_mask.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and completion_mask "
            f"{tuple(completion_mask.shape)} must have the same [N, T] shape"
        )
    with torch.no_grad():
        mask = completion_mask.to(values.dtype)  # [N, T]
        next_value = torch.zeros_like(values[:, 0])  # [N]
        running = torch.zeros_like(values[:, 0])  # [N]: A_{t+1}
        advantages = torch.zeros_like(values)  # [N, T]
        for t in reversed(range(values.size(1))):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # [N]
            m = mask[:, t]  # [N]
            running = m * (delta + gamma * lam * running) + (1 - m) * running
            next_value = m * values[:, t] + (1 - m) * next_value
            advantages[:, t] = running
        advantages = advantages * mask  # [N, T]
        returns = (advantages + values) * mask  # [N, T]
    return advantages, returns


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel) variance of ``values`` over the masked elements, [N, T] -> []."""
    count = mask.to(values.dtype).sum()  # []
    if count < 2:
        raise ValueError(f"a masked variance needs at least 2 masked-in elements, got {int(count)}")
    centered = values - masked_mean(values, mask)  # [N, T]
    return masked_sum(centered**2, mask) / (count - 1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Values normalised over the masked elements, [N, T] -> [N, T], 0 at padding.

    (x - mean) / sqrt(var + 1e-8), mean and unbiased variance over the masked elements; with
    ``shift_mean=False`` the mean is added back (only the scale changes), as for rewards in TRL's
    former PPOTrainer. Same numbers as verl's ``masked_whiten`` on masked-in elements.
    """
    mean = masked_mean(values, mask)  # []
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + WHITEN_EPS)  # [N, T]
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)  # [N, T]


def ppo_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k1",
    whiten_rewards: bool = False,
    whiten_advantages: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """PPO's advantages from sequence rewards [N] and the critic's values [N, T]: (advantages, returns, kl).

    The steps of InstructGPT-style PPO (Ouyang et al. 2022; TRL's former PPOTrainer, whose defaults
    gamma 1, lambda 0.95, k1 these are; verl's ``apply_kl_penalty`` + ``compute_gae_advantage_return``):
    the reward on the last token (``last_token_rewards``); with ``ref_logprobs`` and beta > 0, the
    KL penalty folded in (``kl_in_reward``, on the sampling policy's ``old_logprobs``; ``kl`` is then
    [N, T], else None); optionally the token rewards scaled without shifting (``whiten_rewards``,
    TRL's option); GAE (``gae_advantages``); the advantages whitened over the batch's tokens.
    """
    token_rewards = last_token_rewards(rewards, completion_mask).to(values.dtype)  # [N, T]
    kl = None
    if ref_logprobs is not None and beta > 0:
        if old_logprobs is None:
            raise ValueError("the KL in the reward needs old_logprobs (the sampling policy's log-probs)")
        token_rewards, kl = kl_in_reward(token_rewards, old_logprobs, ref_logprobs, completion_mask, beta, kl_estimator)
    if whiten_rewards:
        token_rewards = masked_whiten(token_rewards, completion_mask, shift_mean=False)  # [N, T]
    advantages, returns = gae_advantages(token_rewards, values.detach(), completion_mask, gamma, lam)  # [N, T]
    if whiten_advantages:
        advantages = masked_whiten(advantages, completion_mask)  # [N, T]
    return advantages, returns, kl
