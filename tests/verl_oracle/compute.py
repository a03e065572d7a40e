"""verl's PPO functions on the inputs of tests/unit/test_ppo_vs_verl.py: ``python compute.py IN.pt OUT.pt``.

Run in a subprocess with the verl oracle folder first on PYTHONPATH (see requirements.txt); imports
nothing from grpokit. Every number comes from verl 0.9.1's own code:
verl/trainer/ppo/core_algos.py (compute_gae_advantage_return, compute_value_loss, agg_loss, kl_penalty,
compute_rewards, AdaptiveKLController, compute_policy_loss_vanilla), verl/utils/torch_functional.py (masked_whiten) and
verl/trainer/ppo/metric_utils.py (compute_data_metrics: critic/vf_explained_var).
"""

from __future__ import annotations

import sys

import torch
import verl.trainer.ppo.core_algos as core_algos
import verl.utils.torch_functional as verl_F
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics

# grpokit loss_type -> verl (loss_agg_mode, extra agg_loss arguments); see the test for the equivalences
LOSS_MODES = {
    "bnpo": ("token-mean", {}),
    "dapo": ("token-mean", {"batch_num_tokens": "num_items_in_batch"}),
    "grpo": ("seq-mean-token-mean", {}),
    "dr_grpo": ("seq-mean-token-sum-norm", {"loss_scale_factor": "max_completion_length"}),
}


def main(source: str, target: str) -> None:
    x = torch.load(source)
    mask = x["mask"]
    out = {}
    for gamma, lam in x["gae_settings"]:
        out[f"gae/{gamma}/{lam}"] = core_algos.compute_gae_advantage_return(
            x["token_rewards"], x["values"], mask, gamma, lam
        )
    for shift_mean in (True, False):
        out[f"whiten/{shift_mean}"] = verl_F.masked_whiten(x["whiten_values"], mask, shift_mean=shift_mean)
    for name, (mode, extra) in LOSS_MODES.items():
        vpreds = x["vpreds"].clone().requires_grad_(True)
        kwargs = {key: x[source_key] for key, source_key in extra.items()}
        loss, clipfrac = core_algos.compute_value_loss(
            vpreds, x["returns"], x["values"], mask, x["cliprange_value"], loss_agg_mode=mode, **kwargs
        )
        loss.backward()
        out[f"value_loss/{name}"] = (loss.detach(), clipfrac, vpreds.grad)
    for name, (mode, extra) in LOSS_MODES.items():
        batch_info = {key: x[source_key] for key, source_key in extra.items()}
        sequence = x["advantages"][:, None].expand_as(x["logprobs"])  # one per sequence, on every token
        out[f"policy_loss/{name}"] = policy_loss(x, sequence, mode, batch_info)
        out[f"policy_loss_token/{name}"] = policy_loss(x, x["token_advantages"], mode, batch_info)
    out["rewards/k1"] = core_algos.compute_rewards(x["token_rewards"], x["old_logprobs"], x["ref_logprobs"], x["beta"])
    # PPO's advantages from sequence scores: the KL in the reward (as apply_kl_penalty in
    # verl/trainer/ppo/ray_trainer.py, which needs more packages to import: scores - beta * kl_penalty * mask),
    # then GAE, whitened
    kld = core_algos.kl_penalty(x["old_logprobs"], x["ref_logprobs"], "kl") * mask
    out["pipeline"] = core_algos.compute_gae_advantage_return(
        x["sequence_scores"] - x["beta"] * kld, x["values"], mask, 1.0, 0.95
    )
    for kind in ("k1", "k2", "k3"):
        out[f"kl/{kind}"] = core_algos.kl_penalty(x["old_logprobs"], x["ref_logprobs"], kind)
    controller = core_algos.AdaptiveKLController(x["init_kl_coef"], x["target_kl"], x["horizon"])
    betas = []
    for kl, n_steps in x["kl_steps"]:
        controller.update(kl, n_steps)
        betas.append(float(controller.value))
    out["adaptive_kl"] = betas
    N, T = mask.shape
    prompts = torch.ones(N, 2, dtype=torch.long)
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": x["token_rewards"],
            "token_level_rewards": x["token_rewards"],
            "advantages": x["values"],
            "returns": x["returns"],
            "values": x["values"],
            "prompts": prompts,
            "responses": torch.ones(N, T, dtype=torch.long),
            "response_mask": mask,
            "attention_mask": torch.cat([prompts, mask], dim=1),
        }
    )
    out["explained_variance"] = compute_data_metrics(batch, use_critic=True)["critic/vf_explained_var"]
    torch.save(out, target)


def policy_loss(x: dict, advantages: torch.Tensor, mode: str, batch_info: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, its gradient wrt the log-probs): verl's actor loss as verl/workers/utils/losses.py ``ppo_loss``
    composes it (lines 103-140): ``compute_policy_loss_vanilla`` + kl_loss_coef * agg_loss(kl_penalty(low_var_kl)).
    The dual clip (clip_ratio_c) is set out of reach: grpokit has none."""
    config = OmegaConf.create(
        {
            "clip_ratio": x["epsilon"],
            "clip_ratio_low": x["epsilon"],
            "clip_ratio_high": x["epsilon_high"],
            "clip_ratio_c": 1e9,
            "global_batch_info": batch_info,
        }
    )
    mask = x["mask"].bool()
    log_prob = x["logprobs"].clone().requires_grad_(True)
    pg_loss, _ = core_algos.compute_policy_loss_vanilla(
        x["old_logprobs"], log_prob, advantages, mask, loss_agg_mode=mode, config=config
    )
    kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=x["ref_logprobs"], kl_penalty="low_var_kl")
    loss = pg_loss + core_algos.agg_loss(kld, mask, mode, **batch_info) * x["kl_loss_coef"]
    loss.backward()
    return loss.detach(), log_prob.grad


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
