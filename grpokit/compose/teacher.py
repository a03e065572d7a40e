"""Building on-policy distillation's teacher (``teacher_model_name_or_path`` or ``teacher_server_url``): loaded or
reached, checked against the student's tokenizer, wrapped in the step's :class:`~grpokit.train.teacher.distiller
.Distiller`; None without a teacher."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.machine.hardware import pick_device


def build_distiller(args: GRPOConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, procs):
    """The run's Distiller (None: no teacher). ``model``, ``tokenizer``, ``device``: the student's."""
    from grpokit.train.teacher.distiller import Distiller

    algo = args.algo
    if not algo.distilling:
        return None
    if algo.teacher_server_url:
        from grpokit.train.teacher.served import ServedTeacher

        teacher = ServedTeacher(algo.teacher_server_url, algo.teacher_temperature, algo.teacher_server_timeout)
        name = f"{teacher.url} {teacher.model} T=1"
    else:
        teacher = local_teacher(args, model, tokenizer, device)
        name = f"{algo.teacher_model_name_or_path} T={algo.teacher_temperature:g}"
    return Distiller(teacher, algo.distill_coef, procs, tokenizer.pad_token_id, name)


def local_teacher(args: GRPOConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device):
    """The frozen local teacher: its tokenizer checked against the student's, its model loaded in ``teacher_dtype`` on
    ``teacher_device`` (default the student's), scored on the ids both output layers have."""
    from grpokit.models.loading import load_model, load_tokenizer
    from grpokit.train.teacher.local import LocalTeacher, teacher_dtype
    from grpokit.train.teacher.tokens import check_same_tokenizer, output_width, shared_width

    algo = args.algo
    name = algo.teacher_model_name_or_path
    check_same_tokenizer(tokenizer, load_tokenizer(name, args.trust_remote_code), name)
    where = device if algo.teacher_device is None else pick_device(algo.teacher_device)
    teacher = load_model(name, teacher_dtype(algo.teacher_dtype, where), where, args.trust_remote_code)
    width = shared_width(output_width(model), output_width(teacher), len(tokenizer), name)
    return LocalTeacher(teacher, width, algo.teacher_temperature, args.per_device_train_batch_size)


def teacher_alone(rewards) -> bool:
    """Whether ``rewards`` (the run's RewardRunner) is distillation alone's: only the built-in ``teacher_only`` reward
    (``rewards: []`` with a teacher), whose groups all tie by design."""
    from grpokit.train.teacher.distiller import teacher_only

    return len(rewards.functions) == 1 and rewards.functions[0] is teacher_only
