"""Doctor checks of a built run's inputs, before anything is sampled: the data and its prompt lengths, EOS and pad,
and the chat template."""

from __future__ import annotations

from grpokit.doctor.result import FAIL, PASS, SKIP, WARN, Check


def data_check(run) -> Check:
    """The datasets loaded, with the columns the rewards and templates name (build_run checked them)."""
    evals = ", ".join(f"{len(rows)} {name or 'eval'}" for name, (_, rows) in run.eval_sets.items()) or "no eval set"
    columns = sorted({k for row in run.train_rows[:1] for k in row})
    return Check("data", PASS, f"{len(run.train_rows)} train prompts ({evals}); columns: {', '.join(columns)}")


def prompt_length_check(run) -> Check:
    """The prompts' token lengths against max_prompt_length, with the fraction truncated or dropped."""
    source, cfg = run.train_source, run.config
    lengths = sorted(len(ids) for ids in source.ids)
    if not lengths:
        return Check("prompt length", FAIL, "no training prompt", "give train_dataset rows with a prompt")
    n = len(lengths)
    p50, p95 = lengths[n // 2], lengths[min(n - 1, (95 * n) // 100)]
    limit = cfg.max_prompt_length
    detail = (
        f"p50 {p50}, p95 {p95}, max {lengths[-1]} tokens (as kept); max_prompt_length {limit}: "
        f"{source.num_truncated} truncated ({source.num_truncated / n:.1%}), "
        f"{source.num_dropped} dropped ({source.num_dropped / n:.1%})"
    )
    if source.num_dropped == n:
        return Check("prompt length", FAIL, detail, "every prompt is dropped: raise max_prompt_length")
    if source.num_truncated or source.num_dropped:
        return Check(
            "prompt length",
            WARN,
            detail,
            "raise max_prompt_length (a truncated prompt loses its start; prompt_overflow: drop leaves it out)",
        )
    return Check("prompt length", PASS, detail)


def eos_pad_check(run) -> Check:
    """EOS is set (else a completion never ends before max_completion_length) and pad is set."""
    tok = run.tokenizer
    eos, pad = getattr(tok, "eos_token_id", None), getattr(tok, "pad_token_id", None)
    if eos is None:
        return Check(
            "eos and pad",
            FAIL,
            "the tokenizer has no eos_token: every completion runs to max_completion_length",
            "set tokenizer.eos_token (the token the model ends its answers with) before training",
        )
    if pad is None:
        return Check("eos and pad", FAIL, f"eos {eos}, no pad token", "set tokenizer.pad_token (e.g. to the EOS)")
    same = " (pad is EOS: completions are masked by their lengths, so EOS is still learned)" if pad == eos else ""
    return Check("eos and pad", PASS, f"eos {eos}, pad {pad}{same}")


def template_check(run, rows: list[dict]) -> Check:
    """The chat template renders the chat prompts, with the generation prompt (its text differs from the rendering
    without it)."""
    column = run.evaluator.prompt_column
    chats = [row[column] for row in rows if isinstance(row[column], list)]
    if not chats:
        return Check("chat template", SKIP, "plain-text prompts: no chat template is applied")
    tok = run.tokenizer
    try:
        with_prompt = tok.apply_chat_template(chats[0], tokenize=False, add_generation_prompt=True)
        without = tok.apply_chat_template(chats[0], tokenize=False, add_generation_prompt=False)
    except Exception as exc:  # a template's own error (jinja, a missing role)
        return Check("chat template", FAIL, f"rendering a prompt failed: {type(exc).__name__}: {exc}", _TEMPLATE_FIX)
    if with_prompt == without:
        return Check(
            "chat template",
            WARN,
            "add_generation_prompt changes nothing: the model is not told that its turn starts",
            "use a chat template that renders the assistant header with add_generation_prompt",
        )
    return Check("chat template", PASS, f"renders; the generation prompt adds {with_prompt[len(without) :]!r}")


_TEMPLATE_FIX = "fix the tokenizer's chat_template (or give plain-text prompts: data.use_chat_template: false)"


def prefix_check(run, chats: list[list[dict]]) -> Check:
    """Rendering a conversation turn by turn gives prefixes of rendering it whole (``chats``: prompt messages plus
    the sampled reply), so the tokens a multi-turn rollout holds are those the learner scores."""
    if not chats:
        return Check("template prefixes", SKIP, "plain-text prompts: no chat template is applied")
    tok = run.tokenizer
    for chat in chats:
        whole = tok.apply_chat_template(chat, tokenize=False)
        for k in range(1, len(chat)):
            part = tok.apply_chat_template(
                chat[:k], tokenize=False, add_generation_prompt=chat[k]["role"] == "assistant"
            )
            if not whole.startswith(part):
                at = next((i for i, (a, b) in enumerate(zip(part, whole)) if a != b), min(len(part), len(whole)))
                return Check(
                    "template prefixes",
                    FAIL,
                    f"the first {k} messages render to text that is not a prefix of the whole conversation "
                    f"(they differ at character {at}: {part[at : at + 30]!r} vs {whole[at : at + 30]!r})",
                    "use a prefix-preserving chat template (one that does not rewrite earlier turns, e.g. drop "
                    "reasoning of past turns), or train single-turn",
                )
    return Check("template prefixes", PASS, f"{len(chats)} conversations: every turn-by-turn rendering is a prefix")
