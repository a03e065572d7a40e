"""Building the learner: the reference copy, the DDP / FSDP wrap, the optimizer and its schedule, the critic of an
algorithm that has one."""

from __future__ import annotations

import dataclasses

import torch

from grpokit.algos.algorithms import get_algorithm
from grpokit.compose import specs
from grpokit.config import ConfigError, GRPOConfig
from grpokit.machine.hardware import pick_dtype
from grpokit.system.processes import is_sharded
from grpokit.train.learning.learner import Learner
from grpokit.train.learning.optimizer import make_optimizer, make_schedule
from grpokit.train.learning.optimizer_settings import OptimizerSettings
from grpokit.train.learning.reference import Reference


def build_optimizer(
    model: torch.nn.Module, settings: OptimizerSettings, total_steps: int, optimizers: tuple, sharded: bool, device
):
    """(optimizer, lr scheduler): TRL's ``optimizers=(optimizer, lr_scheduler)`` where given, else the optimizer
    ``settings`` name over the trainable parameters and its schedule over ``total_steps`` optimizer steps."""
    optimizer, scheduler = optimizers
    if optimizer is not None and sharded:
        raise ConfigError(
            "optimizers=(optimizer, ...) cannot be used with strategy: fsdp, which replaces the parameters "
            "the optimizer holds; leave optimizers out (grpokit's AdamW) or use strategy: ddp."
        )
    optimizer = optimizer or make_optimizer([p for p in model.parameters() if p.requires_grad], settings, device)
    return optimizer, scheduler or make_schedule(optimizer, settings, total_steps)


def build_learner(
    model,
    args: GRPOConfig,
    *,
    procs,
    device,
    use_lora: bool,
    optimizers: tuple,
    autocast_dtype,
    kernels,
    prompt_tokens: int,
):
    """(reference or None, optimizer, lr scheduler, Learner) of the policy ``model``, wrapped for DDP / FSDP by
    ``procs``; ``prompt_tokens`` (the longest prompt) sizes the update's passes (``memory.update_chunk_rows``). FSDP
    shards in place and replaces the parameters, so it comes before the optimizer sees them; the reference copy is
    sharded the same way (its pass and its resync stay shard by shard). An algorithm with a critic
    (``algos.registry``) gets one (``train.learning.critic.Critic``), built from the policy before any update."""
    from grpokit.compose.memory import update_chunk_rows

    critic = None
    if get_algorithm(args.algorithm).uses_critic:
        critic = build_critic(model, args, device, autocast_dtype, kernels)
    reference = Reference(model, use_adapters=use_lora) if args.beta > 0 else None
    trained = procs.wrap(model, device, args.strategy, compute_dtype=autocast_dtype)
    if is_sharded(trained) and reference is not None and reference.model is not None:
        procs.wrap(reference.model, device, args.strategy, compute_dtype=autocast_dtype)
    rows = update_chunk_rows(args, model, device, procs.world_size, prompt_tokens)  # before the optimizer's state
    settings = specs.part_settings(OptimizerSettings, args)
    sharded = is_sharded(trained)
    optimizer, scheduler = build_optimizer(model, settings, specs.optimizer_steps(args), optimizers, sharded, device)
    learner = Learner(
        trained,
        reference,
        optimizer,
        scheduler,
        specs.learner_spec(args, rows),
        autocast_dtype=autocast_dtype,
        kernels=kernels,
        critic=critic,
        procs=procs,
    )
    return reference, optimizer, scheduler, learner


def build_critic(model, args: GRPOConfig, device, autocast_dtype, kernels):
    """PPO's critic (``train.learning.critic.Critic``) from the policy ``model``: its settings filled from the
    config, with the policy's optimizer settings, the run's optimizer steps and the lora section (None: no LoRA)."""
    from grpokit.train.learning.critic import Critic, CriticSpec

    spec = specs.part_settings(
        CriticSpec,
        args,
        optim=specs.part_settings(OptimizerSettings, args),
        total_steps=specs.optimizer_steps(args),
        lora=dataclasses.replace(args.lora) if args.lora.r > 0 else None,
    )
    dtype = pick_dtype(args.dtype, device)
    return Critic.build(model, spec, device=device, dtype=dtype, autocast_dtype=autocast_dtype, kernels=kernels)
