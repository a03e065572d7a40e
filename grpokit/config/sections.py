"""The config's shape: its sections by name, aliases, allowed values, and the field -> section map.

A config has sections (``model``, ``data``, ``algo``, ``generation``, ``optim``, ``run``, ``eval``,
``lora``, ``distributed``, ``reward``, ``agent``) plus a ``rewards`` list. Field names are unique across
sections, so a bare key (``num_generations=16``) names the one field of that name in whichever section
holds it; the seeds' aliases (``group_size``, ``kl_coef``, ``kl_beta``, ``clip_range``) are accepted too.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap

from grpokit.algos.names import (
    IMPORTANCE_SAMPLING_LEVELS,
    IMPORTANCE_WEIGHT_MODES,
    KL_CONTROLLERS,
    OFF_POLICY_CORRECTIONS,
    SCALE_REWARDS,
)
from grpokit.config.running import (
    AgentConfig,
    DistributedConfig,
    EvalConfig,
    RewardSettings,
    RunConfig,
)
from grpokit.config.training import AlgoConfig, DataConfig, GenerationConfig, ModelConfig, OptimConfig
from grpokit.errors import ConfigError
from grpokit.models.lora_settings import LoraSettings
from grpokit.train.learning.optimizer_settings import LR_SCHEDULES, OPTIMIZERS
from grpokit.train.tracking_settings import REPORT_SINKS  # noqa: F401  (the config package's name for them)

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "algo": AlgoConfig,
    "generation": GenerationConfig,
    "optim": OptimConfig,
    "run": RunConfig,
    "eval": EvalConfig,
    "lora": LoraSettings,
    "distributed": DistributedConfig,
    "reward": RewardSettings,
    "agent": AgentConfig,
}

ALIASES = {
    "group_size": "num_generations",
    "kl_coef": "beta",
    "kl_beta": "beta",
    "clip_range": "epsilon",
    "cliprange": "epsilon",
    "num_ppo_epochs": "num_iterations",
    "teacher_model_server_url": "teacher_server_url",  # TRL's server_distillation
}

# The algorithms' option lists are defined in grpokit/algos/names.py, with the code that implements them; the
# loss types and algorithms are their registries' names (checked in rules.py, after algo.imports has run).
CHOICES = {
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "mixed_precision": ("auto", "bf16", "fp16", "no"),
    "ref_model_dtype": ("auto", "bfloat16"),
    "vllm_dtype": ("auto", "float32", "bfloat16", "float16"),
    "vllm_mode": ("colocate", "server"),
    "optimizer": OPTIMIZERS,
    "scale_rewards": SCALE_REWARDS,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
    "off_policy_correction": OFF_POLICY_CORRECTIONS,
    "off_policy_is_mode": IMPORTANCE_WEIGHT_MODES,
    "kl_controller": KL_CONTROLLERS,
    "lr_scheduler_type": LR_SCHEDULES,
    "prompt_overflow": ("truncate", "drop", "error"),
    "backend": ("none", "ray"),
    "strategy": ("ddp", "fsdp"),
    "save_strategy": ("steps", "epoch", "no"),
    "eval_strategy": ("steps", "epoch", "no"),
    "tool_isolation": ("process", "thread"),
}


# The keys of a dataset given as a mapping (data.train_dataset / eval_dataset): datasets.load_dataset's arguments.

# field name -> section name; built once, field names are unique across sections.
FIELD_SECTION: dict[str, str] = {f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}

# Fields holding a filesystem path (or a hub id / keyword, which expansion leaves alone). Reward files
# (`path/to/file.py:function`) are expanded where they are loaded (rewards/resolve.py), with expand_path.
PATH_FIELDS = (
    "model_name_or_path",
    "tokenizer_name_or_path",
    "value_model_name_or_path",
    "train_dataset",
    "eval_dataset",
    "output_dir",
    "resume_from",
)


def section_fields(cls: type) -> list[dataclasses.Field]:
    """A section's fields in reading order: its own first, then those of each part's settings class it is assembled
    from, base by base (``dataclasses.fields`` lists the bases' first)."""
    own = set(inspect.get_annotations(cls))
    fields = dataclasses.fields(cls)
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field (dataclass attribute docstrings) as one line, read from the source of the
    class and of the parts' settings classes it is assembled from (its dataclass bases)."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for prev, node in itertools.pairwise(body):
            if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                docs[prev.target.id] = " ".join(str(node.value.value).split())
    return docs


def part_checks(sections: dict) -> None:
    """Run the ``check()`` of every part's settings class a section is assembled from (``OptimConfig`` from
    ``OptimizerSettings`` ...) on that section: a part checks its own settings, and a new part's check runs with no
    line here. ``sections``: {name: the section object}."""
    for section in sections.values():
        for part in type(section).__mro__:
            own = vars(part).get("check")
            if own is not None:
                try:
                    own(section)
                except ConfigError:
                    raise
                except ValueError as exc:  # a part's check may raise a plain ValueError naming the fix
                    raise ConfigError(str(exc)) from None


def check(ok: bool, message: str) -> None:
    """Raise a ConfigError with ``message`` unless ``ok``."""
    if not ok:
        raise ConfigError(message)
