"""Sampling semantics of TRL's ``generation_kwargs`` (they override the generation settings, as TRL passes them to
transformers' GenerationConfig): which keys grpokit's sampler honours exactly, which are inert, which must agree with
grpokit's own settings, and the sampler's options they give (``SamplingParams`` fields)."""

from __future__ import annotations

from typing import Any


class GenerationOptionError(ValueError):
    """A generation_kwargs key or value grpokit's sampler cannot honour (raised as a ConfigError by the config)."""


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values that do not compare (arrays, odd objects) count as different
        return False


# ---- generation_kwargs (TRL passes them to transformers' GenerationConfig; they override its own keys) ----------
# The keys grpokit's sampler honours exactly, on every path (grpokit.rollout.next_token, logits_rules): the
# SamplingParams field each sets. do_sample=False samples greedily.
GENERATION_KWARGS = {
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
    "min_new_tokens": "min_new_tokens",
    "suppress_tokens": "suppress_tokens",
    "begin_suppress_tokens": "begin_suppress_tokens",
    "bad_words_ids": "bad_words_ids",
    "do_sample": "greedy",
}
# Keys that only say how transformers computes, not what is sampled: accepted, nothing to do.
INERT_GENERATION_KWARGS = (
    "use_cache",
    "cache_implementation",
    "disable_compile",
    "compile_config",
    "pad_token_id",
    "bos_token_id",
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
    "output_attentions",
    "output_hidden_states",
)
# Keys accepted with the one value that agrees with grpokit's own setting (the fix names the setting).
PINNED_GENERATION_KWARGS = {
    "temperature": "temperature",  # the learner takes log-probs at the sampling temperature
    "max_new_tokens": "max_completion_length",
    "num_beams": None,  # 1: sampling, no beam search
    "num_return_sequences": None,  # 1: TRL repeats each prompt num_generations times itself
}
# The sampler keys vLLM's SamplingParams takes with the same meaning (grpokit.rollout.vllm.engine).
VLLM_GENERATION_KWARGS = ("top_p", "top_k", "min_p", "repetition_penalty", "min_new_tokens", "do_sample")


def generation_options(
    temperature: float,
    max_completion_length: int,
    top_p: float,
    top_k: int,
    min_p: float,
    repetition_penalty: float,
    generation_kwargs: dict[str, Any] | None,
    engine: str = "hf",
) -> dict[str, Any]:
    """The sampler's options (``grpokit.rollout.types.SamplingParams`` fields but the length and temperature) from
    the generation settings and TRL's ``generation_kwargs``, whose keys override the settings as in TRL. Raises
    GenerationOptionError naming every key grpokit cannot honour exactly, and every invalid value."""
    options: dict[str, Any] = {
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "no_repeat_ngram_size": 0,
        "min_new_tokens": 0,
        "suppress_tokens": (),
        "begin_suppress_tokens": (),
        "bad_words_ids": (),
        "greedy": False,
    }
    given = dict(generation_kwargs or {})
    pinned = {"temperature": temperature, "max_new_tokens": max_completion_length, "num_return_sequences": 1}
    if engine != "transformers":
        pinned["num_beams"] = 1
    refused = [k for k in given if k not in GENERATION_KWARGS and k not in INERT_GENERATION_KWARGS and k not in pinned]
    if engine == "vllm":
        refused += [k for k in given if k in GENERATION_KWARGS and k not in VLLM_GENERATION_KWARGS]
    if engine == "transformers":  # transformers' GenerationConfig checks them when the engine builds it
        options["transformers_kwargs"] = {k: given[k] for k in refused}
    elif refused:
        where = "vLLM's sampler (engine: vllm)" if engine == "vllm" else "grpokit's sampler"
        fix = "" if engine == "vllm" else " or set generation.engine: transformers (transformers' generate honours it)"
        raise GenerationOptionError(
            f"generation_kwargs: {', '.join(map(repr, refused))} cannot be honoured exactly by {where}; remove "
            f"{'it' if len(refused) == 1 else 'them'}{fix}. Honoured: {', '.join(GENERATION_KWARGS)} (and "
            "temperature, max_new_tokens, num_beams=1 when they agree with the config); docs/from_trl.md."
        )
    for key, value in given.items():
        if key in pinned:
            if not _same(value, pinned[key]) and value is not None:
                setting = PINNED_GENERATION_KWARGS[key]
                fix = f"set {setting}={value!r} instead" if setting else f"grpokit samples; {key} must be 1"
                if key == "num_beams":
                    fix = "grpokit's sampler does not search beams: set generation.engine: transformers, or num_beams=1"
                raise GenerationOptionError(f"generation_kwargs {key}={value!r} differs from what grpokit runs: {fix}.")
        elif key in GENERATION_KWARGS:
            options[GENERATION_KWARGS[key]] = _generation_value(key, value)
    return options


def generate_only_keys(generation_kwargs: Any) -> list[str]:
    """The ``generation_kwargs`` keys only transformers' ``generate`` honours (beam search, typical_p ...): with
    them, a config that does not name its engine samples with ``generation.engine: transformers``, as TRL would."""
    if not isinstance(generation_kwargs, dict):
        return []
    own = (*GENERATION_KWARGS, *INERT_GENERATION_KWARGS, "temperature", "max_new_tokens", "num_return_sequences")
    return [k for k, v in generation_kwargs.items() if k not in own and not (k == "num_beams" and v in (1, None))]


def _generation_value(key: str, value: Any) -> Any:
    """A generation_kwargs value in the SamplingParams field's form, or GenerationOptionError naming what is wrong."""

    def bad(expected: str) -> GenerationOptionError:
        return GenerationOptionError(f"generation_kwargs {key}={value!r}: expected {expected}.")

    def token_ids(v: Any) -> tuple[int, ...]:
        if not isinstance(v, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v
        ):
            raise bad("a list of token ids (integers >= 0)")
        return tuple(v)

    if key == "do_sample":
        if not isinstance(value, bool):
            raise bad("true or false")
        return not value  # greedy
    if key in ("suppress_tokens", "begin_suppress_tokens"):
        return token_ids(value)
    if key == "bad_words_ids":
        if (
            not isinstance(value, (list, tuple))
            or not value
            or any(not isinstance(w, (list, tuple)) or not w for w in value)
        ):
            raise bad("a non-empty list of non-empty lists of token ids")
        return tuple(token_ids(w) for w in value)
    if key in ("top_k", "no_repeat_ngram_size", "min_new_tokens"):
        if value is None:
            return 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad("an integer >= 0")
        return value
    if key == "min_p" and value is None:
        return 0.0
    if key == "top_p" and value is None:
        return 1.0
    if key == "repetition_penalty" and value is None:
        return 1.0
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad("a number")
    return float(value)
