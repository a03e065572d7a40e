"""Building on-policy distillation's teacher (``teacher_model_name_or_path`` or ``teacher_server_url``): loaded or
reached, checked against the student's tokenizer, wrapped in the step's :class:`~grpokit.train.teacher.distiller
.Distiller`; None without a teacher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.config import ConfigError, GRPOConfig
from grpokit.machine.hardware import pick_device
from grpokit.train.teacher.settings import IN_MEMORY

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def loaded_name(teacher: torch.nn.Module) -> str:
    """A loaded teacher's name in the config and the stored tokens keys: the folder or hub id it was loaded from, else
    ``<Class passed as teacher_model>``."""
    loaded_from = getattr(getattr(teacher, "config", None), "_name_or_path", None)
    return str(loaded_from) if loaded_from else f"<{type(teacher).__name__}{IN_MEMORY}"


def fold_teacher_model(args: GRPOConfig, teacher_model: Any) -> GRPOConfig:
    """GRPOTrainer's ``teacher_model`` (TRL's GKD name: a path, a hub id or a loaded causal LM) into the config's
    ``teacher_model_name_or_path`` (a loaded one: :func:`loaded_name`), so that every check of a run with a teacher
    applies; the loaded module itself goes to :func:`build_distiller`. One ConfigError line for anything else."""
    if teacher_model is None:
        return args
    fix = "give a path, a hub id or a loaded causal LM (torch.nn.Module) with the student's tokenizer"
    if isinstance(teacher_model, torch.nn.Module):
        if not callable(getattr(teacher_model, "get_output_embeddings", None)):
            raise ConfigError(
                f"teacher_model is a {type(teacher_model).__name__}, not a causal LM (no output layer); {fix}."
            )
        name = loaded_name(teacher_model)
    elif isinstance(teacher_model, str) and teacher_model:
        name = teacher_model
    else:
        raise ConfigError(f"teacher_model has type {type(teacher_model).__name__}; {fix}.")
    if args.algo.distilling:
        raise ConfigError(
            "teacher_model is given and the config has a teacher too (teacher_model_name_or_path or "
            "teacher_server_url); give the teacher one way."
        )
    return args.replace(teacher_model_name_or_path=name)


def build_distiller(
    args: GRPOConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, procs, teacher_model: Any = None
):
    """The run's Distiller (None: no teacher). ``model``, ``tokenizer``, ``device``: the student's; ``teacher_model``:
    GRPOTrainer's (a loaded module is used as it is, else the config's teacher is loaded or reached)."""
    from grpokit.train.teacher.distiller import Distiller

    algo = args.algo
    if not algo.distilling:
        return None
    if algo.teacher_server_url:
        from grpokit.train.teacher.served import ServedTeacher

        teacher = ServedTeacher(
            algo.teacher_server_url, algo.teacher_temperature, algo.teacher_server_timeout, algo.teacher_server_api_key
        )
        name = f"{teacher.url} {teacher.model} T=1"
    else:
        loaded = teacher_model if isinstance(teacher_model, torch.nn.Module) else None
        student = {id(p) for p in model.parameters()}
        if loaded is not None and any(id(p) in student for p in loaded.parameters()):
            raise ConfigError(
                "teacher_model shares its weights with the model being trained (freezing the teacher would freeze the "
                "student); pass a separate copy, e.g. copy.deepcopy(model) or the teacher loaded again."
            )
        teacher = local_teacher(args, model, tokenizer, device, loaded)
        name = f"{algo.teacher_model_name_or_path} T={algo.teacher_temperature:g}"
    topk = algo.distill_topk if algo.distill_loss != "reverse_kl" else 0  # a local teacher's (served: refused)
    return Distiller(teacher, algo.distill_coef, procs, tokenizer.pad_token_id, name, topk)


def local_teacher(args: GRPOConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, loaded=None):
    """The frozen local teacher: its tokenizer checked against the student's, its model loaded in ``teacher_dtype`` on
    ``teacher_device`` (default the student's), scored on the ids both output layers have. ``loaded``: a module given
    as teacher_model, kept on its own device and in its own dtype unless teacher_device / teacher_dtype say otherwise;
    its tokenizer is checked when it was loaded from a folder that has one, its output layer's width always."""
    from grpokit.models.loading import load_model, load_tokenizer
    from grpokit.train.teacher.local import LocalTeacher, teacher_dtype
    from grpokit.train.teacher.tokens import check_same_tokenizer, output_width, shared_width

    algo = args.algo
    name = algo.teacher_model_name_or_path
    if loaded is None or (Path(name).is_dir() and any((Path(name) / f).is_file() for f in TOKENIZER_FILES)):
        check_same_tokenizer(tokenizer, load_tokenizer(name, args.trust_remote_code), name)
    if loaded is None:
        where = device if algo.teacher_device is None else pick_device(algo.teacher_device)
        teacher = load_model(name, teacher_dtype(algo.teacher_dtype, where), where, args.trust_remote_code)
    else:
        where = next(loaded.parameters()).device if algo.teacher_device is None else pick_device(algo.teacher_device)
        dtype = None if algo.teacher_dtype == "auto" else teacher_dtype(algo.teacher_dtype, where)
        teacher = loaded.to(device=where, dtype=dtype)
    width = shared_width(output_width(model), output_width(teacher), len(tokenizer), name)
    return LocalTeacher(teacher, width, algo.teacher_temperature, args.per_device_train_batch_size)


def teacher_ahead(scheduler, distiller) -> None:
    """Sampling ahead (max_staleness >= 1, one process): each batch's teacher request starts when the producer has
    collected its rollouts, so a served teacher scores step t + 1's batch while step t trains."""
    if distiller is not None and getattr(scheduler.source, "on_collected", False) is None:
        scheduler.source.on_collected = distiller.ahead


def teacher_alone(rewards) -> bool:
    """Whether ``rewards`` (the run's RewardRunner) is distillation alone's: only the built-in ``teacher_only`` reward
    (``rewards: []`` with a teacher), whose groups all tie by design."""
    from grpokit.train.teacher.distiller import teacher_only

    return len(rewards.functions) == 1 and rewards.functions[0] is teacher_only
