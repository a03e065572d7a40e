"""The teacher scores the student's token ids, so both must mean the same thing by each id: checked once at the start.

Same ids (every token string maps to the same id), same special tokens (BOS, EOS, UNK); a teacher whose output layer is
wider than the student's (a vocabulary padded to another multiple: Qwen2.5's 151,936 vs 152,064 rows) is scored on the
ids both have (:func:`shared_width`; the rows past them are padding, never a real token). A different tokenizer is
refused in one line.
"""

from __future__ import annotations

from grpokit.errors import ConfigError

SPECIAL = ("bos_token_id", "eos_token_id", "unk_token_id")


def check_same_tokenizer(student, teacher, teacher_name: str) -> None:
    """Raise one :class:`ConfigError` line when ``teacher`` (a tokenizer) would read the student's ids otherwise."""
    for name in SPECIAL:
        mine, theirs = getattr(student, name, None), getattr(teacher, name, None)
        if mine != theirs:
            raise ConfigError(
                f"teacher {teacher_name}: its tokenizer's {name} is {theirs}, the student's {mine}; on-policy "
                "distillation scores the student's token ids, so the teacher needs the student's tokenizer."
            )
    mine, theirs = _vocab(student), _vocab(teacher)
    if mine is None or theirs is None:
        return
    differ = sum(1 for token, i in mine.items() if theirs.get(token) != i)
    if differ or len(mine) != len(theirs):
        raise ConfigError(
            f"teacher {teacher_name}: its tokenizer differs from the student's ({differ} of {len(mine)} tokens have "
            f"another id; {len(theirs)} vs {len(mine)} tokens); on-policy distillation scores the student's token "
            "ids, so the teacher needs the student's tokenizer."
        )


def _vocab(tokenizer) -> dict | None:
    """The token -> id map (None: a tokenizer without one, such as a custom model's)."""
    get = getattr(tokenizer, "get_vocab", None)
    return get() if callable(get) else None


def output_width(model) -> int:
    """How many ids ``model``'s output layer scores (its LM head's rows; else its config's vocab_size)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def shared_width(student_width: int, teacher_width: int, tokens: int, teacher_name: str) -> int:
    """The ids the teacher is scored on: those both output layers have (padding past the tokenizer's ``tokens`` may
    differ in size). A teacher scoring fewer ids than the tokenizer has is refused."""
    width = min(student_width, teacher_width)
    if width < tokens:
        raise ConfigError(
            f"teacher {teacher_name}: its output layer scores {teacher_width} ids, fewer than the tokenizer's "
            f"{tokens} tokens; the teacher needs the student's tokenizer."
        )
    return width
