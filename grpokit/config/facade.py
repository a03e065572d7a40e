"""The user-facing config object: GRPOConfig, the flat facade over the sections.

Defaults follow TRL's GRPOConfig where the concept exists there, except ``beta = 0.04`` and
``use_bias_correction_kl = False`` (plain k3, the formula of docs/algorithms.md; TRL 1.16: True).
Every error is raised before any model is loaded, as a :class:`ConfigError` naming the problem
and the fix. The facade is for users, YAML and TRL scripts; inside grpokit only the config package and
the composition root (the grpokit/compose/ package) read it
(tests/unit/test_config_reads.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import yaml

import grpokit.config.trl_forms as trl_forms
import grpokit.config.trl_keys as trl_keys
from grpokit.config import validation
from grpokit.config.coerce import coerce
from grpokit.config.keys import flatten, from_trl, unknown_key_message
from grpokit.config.rules import loss_params
from grpokit.config.sections import ALIASES, FIELD_SECTION, SECTIONS, ConfigError, section_fields
from grpokit.config.typed_keys import TypedKeys

if TYPE_CHECKING:
    from grpokit.algos.losses import LossSpec


class GRPOConfig(TypedKeys):
    """The whole run configuration.

    Accepts sections (``GRPOConfig(algo={"beta": 0.0})``), bare field names
    (``GRPOConfig(num_generations=8, learning_rate=1e-5)``) and the seeds' aliases, in any mix.
    Reading ``cfg.num_generations`` returns the field from its section.

    Every key of TRL's GRPOConfig is accepted too (grpokit/config/trl_keys.py): those grpokit acts on map
    onto its fields (``bf16=True`` -> ``mixed_precision: bf16``), the others are named in one warning and
    read back as given (``cfg.push_to_hub``).
    """

    def __init__(self, rewards: list | None = None, **kwargs: Any) -> None:
        # keyword arguments by TRL's names are TRL's form: with num_iterations, the step counts count optimizer steps
        unused = self._init(rewards, kwargs, frozenset(k for k in kwargs if k in trl_keys.TRL_DEFAULTS))
        if unused:
            warnings.warn(trl_forms.unused_message(unused), UserWarning, stacklevel=2)

    @classmethod
    def from_grpokit(cls, rewards: list | None = None, **kwargs: Any) -> GRPOConfig:
        """A config in grpokit's form (a YAML file, a command line, a run's saved config.yaml): ``max_steps``,
        ``save_steps``, ``eval_steps`` and ``logging_steps`` count generation batches whatever ``num_iterations`` is
        (the constructor's keyword arguments are TRL's form, where they count optimizer steps)."""
        new = object.__new__(cls)
        unused = new._init(rewards, kwargs, frozenset())
        if unused:
            warnings.warn(trl_forms.unused_message(unused), UserWarning, stacklevel=2)
        return new

    def _init(self, rewards: list | None, kwargs: dict, trl_keywords: frozenset) -> dict:
        values = flatten(kwargs)
        grpokit_values, trl_given, unused = from_trl(values, values, trl_keywords)
        self._build(rewards, grpokit_values, trl_given, unused)
        object.__setattr__(self, "given_keys", frozenset(values))  # see is_given
        return unused

    def _build(self, rewards: list | None, values: dict, trl_given: dict, unused: dict) -> None:
        for section, cls in SECTIONS.items():
            own = {k: v for k, v in values.items() if FIELD_SECTION[k] == section}
            object.__setattr__(self, section, cls(**{k: coerce(cls, k, v) for k, v in own.items()}))
        object.__setattr__(self, "rewards", list(rewards or []))
        object.__setattr__(self, "trl_settings", dict(trl_given))  # TRL-only keys as given
        object.__setattr__(self, "unused_trl_settings", dict(unused))  # those grpokit does not act on
        self.validate()

    def __getattr__(self, name: str) -> Any:
        section = FIELD_SECTION.get(ALIASES.get(name, name))
        if section is None:
            if name in trl_keys.TRL_DEFAULTS and "trl_settings" in self.__dict__:
                value = self.__dict__["trl_settings"].get(name, trl_keys.TRL_DEFAULTS[name])
                return trl_forms.read_form(name, value)
            raise AttributeError(unknown_key_message(name))
        return getattr(object.__getattribute__(self, section), ALIASES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        key = ALIASES.get(name, name)
        section = FIELD_SECTION.get(key)
        if section is None and key in trl_keys.TRL_DEFAULTS:  # TRL-only: translated and validated as in the constructor
            new = self.replace(**{key: value})
            keys = (*SECTIONS, "trl_settings", "unused_trl_settings", "given_keys")
            self.__dict__.update({k: new.__dict__[k] for k in keys})
            return
        if section is None:
            raise ConfigError(unknown_key_message(name))
        values, _, _ = from_trl({key: value}, {**self._flat(), key: value})
        for (
            k,
            v,
        ) in values.items():  # a TRL form (report_to="none") becomes grpokit's value; TRL's None keeps the current one
            setattr(getattr(self, FIELD_SECTION[k]), k, coerce(SECTIONS[FIELD_SECTION[k]], k, v))
        object.__setattr__(self, "given_keys", self.__dict__.get("given_keys", frozenset()) | {key})

    def is_given(self, key: str) -> bool:
        """Whether ``key`` was set (constructor, YAML, override, ``replace``, attribute) rather than left at its
        default: where TRL's default differs from grpokit's, TRL's rule can then apply (``max_steps`` when the
        environment owns the data)."""
        return ALIASES.get(key, key) in self.__dict__.get("given_keys", frozenset())

    def _flat(self) -> dict:
        return {k: v for section in SECTIONS for k, v in dataclasses.asdict(getattr(self, section)).items()}

    def replace(self, **overrides: Any) -> GRPOConfig:
        """A copy with overrides applied (same key forms as the constructor), validated."""
        merged = self.to_dict()
        merged_flat = self._flat()
        given = flatten({k: v for k, v in overrides.items() if k != "rewards"})
        values, trl_given, unused = from_trl(given, {**merged_flat, **given})
        trl_given = {**self.trl_settings, **trl_given}
        unused = from_trl(trl_given, {**merged_flat, **values})[2] if trl_given else {}
        new = object.__new__(GRPOConfig)
        new._build(overrides.get("rewards", merged["rewards"]), {**merged_flat, **values}, trl_given, unused)
        object.__setattr__(new, "given_keys", self.__dict__.get("given_keys", frozenset()) | frozenset(given))
        before = self.unused_trl_settings
        fresh = {k: v for k, v in unused.items() if k not in before or v != before[k]}
        if fresh:
            warnings.warn(trl_forms.unused_message(fresh), UserWarning, stacklevel=2)
        return new

    def to_dict(self) -> dict:
        """The config by section; a secret (a field whose metadata says ``secret``: vllm_server_api_key) as None, so
        that no key reaches config.yaml, the trackers, ``grpokit explain`` or a repr."""
        out = {}
        for section, cls in SECTIONS.items():
            values = dataclasses.asdict(getattr(self, section))
            out[section] = {f.name: None if f.metadata.get("secret") else values[f.name] for f in section_fields(cls)}
        out["rewards"] = [r if isinstance(r, (str, dict)) else _callable_name(r) for r in self.rewards]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def __repr__(self) -> str:
        return f"GRPOConfig({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GRPOConfig) and self.to_dict() == other.to_dict()

    # ---- derived sizes -------------------------------------------------------------------
    def completions_per_step(self, world_size: int = 1) -> int:
        """Completions sampled per step (the generation batch): num_mini_batches optimizer steps' worth."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches * world_size

    def optimizer_steps_per_step(self) -> int:
        return self.num_iterations * self.num_mini_batches

    def prompts_per_step(self, world_size: int = 1) -> int:
        return self.completions_per_step(world_size) // self.num_generations

    def sampling_options(self) -> dict:
        """How completions are sampled besides their length and temperature (``SamplingParams`` fields): top_p,
        top_k, min_p, repetition_penalty, and what ``generation_kwargs`` adds or overrides (TRL's forms)."""
        from grpokit.config.validation import sampling_options

        return sampling_options(self.generation)

    def loss_spec(self) -> LossSpec:
        """The settings of ``algos.policy_loss`` for this run, built once by the learner."""
        from grpokit.algos.losses import LossSpec  # torch: only for training

        return LossSpec(
            loss_type=self.loss_type,
            epsilon=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=0.0 if self.kl_in_reward else self.beta,  # kl_in_reward: beta weighs the KL in the rewards
            use_bias_correction_kl=self.use_bias_correction_kl,
            importance_sampling_level=self.importance_sampling_level,
            max_completion_length=self.max_completion_length,
            **self._sampling_weights(),
            delta=self.delta,
            params=loss_params(self),
            off_policy_mask_threshold=self.off_policy_mask_threshold,
        )

    def _sampling_weights(self) -> dict:
        """LossSpec's shaping of the sampler's weights: decoupled PPO's (``off_policy_is_*``) when rollouts are sampled
        ahead with that correction (it covers vLLM's mismatch too), else vLLM's truncated weights."""
        if self.distributed.staleness_bound() and self.off_policy_correction == "decoupled_ppo":
            return {
                "sampling_cap": self.off_policy_is_max,
                "sampling_is_mode": self.off_policy_is_mode,
                "sampling_is_min": self.off_policy_is_min,
            }
        return {  # TRL's vllm_importance_sampling_mode, clip_min and clip_max (= vllm_importance_sampling_cap)
            "sampling_cap": self.vllm_importance_sampling_cap,
            "sampling_is_mode": self.vllm_importance_sampling_mode,
            "sampling_is_min": self.vllm_importance_sampling_clip_min,
        }

    # ---- validation ----------------------------------------------------------------------
    def validate(self, world_size: int = 1) -> None:
        """Reject impossible values with one message each; no model is touched."""
        validation.validate(self, world_size)

    def check_multi_turn(self) -> None:
        """Refuse the settings multi-turn tool rollouts cannot run with (tools from the config or from
        GRPOTrainer(tools=..., environment_factory=...))."""
        validation.check_multi_turn(self)


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
