"""The reward runner of a run, and of ``grpokit serve-rewards`` (the rewards list and the reward settings it serves)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from grpokit.config import ConfigError, GRPOConfig
from grpokit.machine.hardware import pick_device, pick_dtype


def build_reward_runner(
    reward_funcs: Any,
    args: GRPOConfig,
    ray_workers: bool = True,
    processing_classes: Any = None,
    extra: list | None = None,
):
    """The RewardRunner of ``reward_funcs``. ``ray_workers=False`` (torchrun ranks other than 0): no
    Ray reward workers even with ``num_reward_workers > 0``, since rank 0 scores every rank's rows on them.
    ``processing_classes``: TRL's ``reward_processing_classes`` (a tokenizer or a list, one per function).
    ``extra``: reward functions added after them with weight 1 (environments' ``get_reward``, as TRL adds them)."""
    from grpokit.rewards import RewardRunner

    extra = list(extra or [])
    if not reward_funcs and not extra and args.algo.distilling:  # `rewards: []` with a teacher: distillation alone
        from grpokit.train.teacher.distiller import teacher_only

        extra = [teacher_only]
    if (reward_funcs is None or (isinstance(reward_funcs, list) and not reward_funcs)) and not extra:
        raise ConfigError(
            "No reward source provided: pass reward_funcs=... or list them under `rewards:` in the config (e.g. "
            "- accuracy), or an environment_factory whose environment defines get_reward()."
        )
    specs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    if processing_classes is not None and not isinstance(processing_classes, list):
        processing_classes = [processing_classes]  # TRL: one processing class is the list of one
    if processing_classes is not None and len(processing_classes) != len(specs):
        raise ConfigError(
            f"The number of reward processing classes ({len(processing_classes)}) must match the number of reward "
            f"functions ({len(specs)}); pass reward_processing_classes as a list with one entry per reward function, "
            "in order (None for a plain function)."
        )
    weights = args.reward_weights
    if extra:
        weights = None if weights is None else [*weights, *[1.0] * len(extra)]
        processing_classes = None if processing_classes is None else [*processing_classes, *[None] * len(extra)]
        specs = [*specs, *extra]
    try:
        pool = None  # reward_workers processes in the learner (0 = one each, or none)
        if args.num_reward_workers > 0 and ray_workers:  # Ray reward actors
            from grpokit.distributed.ray_rewards import RayRewardPool

            pool = functools.partial(
                RayRewardPool, workers=args.num_reward_workers, worker_cpus=args.reward_worker_cpus
            )
        device = pick_device(args.device)
        return RewardRunner(
            specs,
            weights=weights,
            timeout=args.reward_timeout,
            workers=0 if args.num_reward_workers > 0 else args.reward_workers,
            isolate=args.reward_isolation,  # None: named rewards isolated, Python functions here (RewardRunner)
            processing_classes=processing_classes,
            pool=pool,
            # reward models named by a string, loaded as TRL loads them, on the policy's device and in its dtype
            model_kwargs={
                "device": device,
                "dtype": pick_dtype(args.dtype, device),
                "trust_remote_code": args.trust_remote_code,
            },
        )
    except (
        ValueError,
        TypeError,
        ImportError,
        OSError,
    ) as exc:  # a bad spec: unknown name, missing file, bad params, not picklable
        raise ConfigError(f"rewards: {exc}") from exc


def eval_reward_runner(args: GRPOConfig, training):
    """The rewards evaluation scores with: ``eval_rewards`` (each weight 1) when set, else ``training`` (the run's)."""
    if args.eval_rewards is None:
        return training
    return build_reward_runner(list(args.eval_rewards), args.replace(reward_weights=None), ray_workers=False)


def served_rewards(targets: list[str]) -> tuple[list, dict[str, Any]]:
    """The rewards list and the reward settings (``reward_*``) of a YAML config (or a YAML list of rewards), or reward
    specs given as they are: what ``grpokit serve-rewards`` serves."""
    if len(targets) == 1 and targets[0].endswith((".yaml", ".yml")):
        import yaml

        path = Path(targets[0])
        if not path.is_file():
            raise ConfigError(f"{path} does not exist; give a YAML config with a rewards: list, or reward names")
        data = yaml.safe_load(path.read_text())
        if isinstance(data, list):
            return data, {}
        if not isinstance(data, dict) or not data.get("rewards"):
            raise ConfigError(f"{path}: no rewards: list to serve")
        settings = data.get("reward") or {}
        return list(data["rewards"]), {k: v for k, v in settings.items() if k.startswith("reward_")}
    return list(targets), {}


def served_reward_runner(targets: list[str], timeout: float | None = None):
    """``grpokit serve-rewards``' RewardRunner: the rewards of :func:`served_rewards`, each in its killable worker
    process, ``timeout`` (default the config's reward_timeout, else 10 s) per batch."""
    from grpokit.rewards import RewardRunner

    rewards, settings = served_rewards(targets)
    return RewardRunner(
        rewards,
        weights=settings.get("reward_weights"),
        timeout=float(timeout or settings.get("reward_timeout", 10.0)),
        workers=int(settings.get("reward_workers", 0)),
        isolate=True,
    )
