"""transformers' logits processors that grpokit's sampler honours: TRL's ``repetition_penalty`` and the
``generation_kwargs`` keys ``no_repeat_ngram_size``, ``min_new_tokens``, ``suppress_tokens``,
``begin_suppress_tokens`` and ``bad_words_ids``, with transformers' meaning (``generation/logits_process.py``):

- repetition penalty p: each token already in the row (its prompt, left padding excluded, and what it sampled
  so far) has its logit divided by p when positive, multiplied by p when negative;
- no_repeat_ngram_size n: a token that would complete an n-gram already in the row is banned;
- min_new_tokens m: EOS is banned while the completion (a multi-turn rollout: the turn, one ``generate`` call in
  TRL) has fewer than m tokens;
- suppress_tokens: banned always; begin_suppress_tokens: banned as the completion's (turn's) first token;
- bad_words_ids: a one-token word is banned always (EOS excepted, as transformers drops ``[eos]``), a longer one
  has its last token banned where the row ends with the word's other tokens.

They act on the raw logits, before the temperature and the min-p / top-k / top-p filters, in transformers'
order (the penalty first; the bans commute). A banned token's logit is -inf. Each row keeps its tokens so far
(``reset`` for a row's whole context, ``append`` per sampled token), so the rules hold whatever rows leave or
join the batch (finished rows, multi-turn rollouts between tool calls).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpokit.rollout.types import SamplingParams


class LogitsRules:
    """The processors ``params`` turns on, for rows 0..n-1 whose contexts start as ``histories`` (token ids, no
    padding). ``vocab_size``: the logits' width; ``eos_token_ids``: what min_new_tokens holds back."""

    def __init__(
        self,
        params: SamplingParams,
        histories: Sequence[Sequence[int]],
        eos_token_ids: Sequence[int],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ):
        self.params, self.vocab_size, self.device = params, vocab_size, torch.device(device)
        eos = sorted({int(t) for t in eos_token_ids})
        words = [tuple(w) for w in params.bad_words_ids if not (len(w) == 1 and w[0] in eos)]
        for name, ids in (
            ("suppress_tokens", params.suppress_tokens),
            ("begin_suppress_tokens", params.begin_suppress_tokens),
            ("bad_words_ids", [t for w in words for t in w]),
        ):
            beyond = sorted({t for t in ids if t >= vocab_size})
            if beyond:
                raise ValueError(
                    f"generation_kwargs {name} names token ids {beyond}, beyond the model's vocabulary of "
                    f"{vocab_size}; use ids below {vocab_size}."
                )
        banned = [*params.suppress_tokens, *(w[0] for w in words if len(w) == 1)]
        self.always = self._mask(banned)  # [V] or None
        self.at_start = self._mask(params.begin_suppress_tokens)  # [V] or None
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.device)
        self.words = [w for w in words if len(w) > 1]
        n = len(histories)
        self.seen = (
            torch.zeros((n, vocab_size), dtype=torch.bool, device=self.device)
            if params.repetition_penalty != 1.0
            else None
        )  # [n, V]
        self.keep_tokens = bool(params.no_repeat_ngram_size or self.words)
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.ngrams: list[dict[tuple[int, ...], set[int]]] = [{} for _ in range(n)]
        for row, history in enumerate(histories):
            self.reset(row, history)

    def _mask(self, ids: Sequence[int]) -> torch.Tensor | None:
        if not ids:
            return None
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        mask[list(ids)] = True
        return mask

    def reset(self, row: int, history: Sequence[int]) -> None:
        """Row ``row``'s context is now ``history`` (a multi-turn rollout's whole conversation so far)."""
        history = [int(t) for t in history]
        if self.seen is not None:
            self.seen[row] = False
            if history:
                self.seen[row, history] = True
        if self.keep_tokens:
            self.tokens[row], self.ngrams[row] = [], {}
            for token in history:
                self._push(row, token)

    def append(self, rows: torch.Tensor | Sequence[int], tokens: torch.Tensor) -> None:
        """Rows ``rows`` [A] sampled ``tokens`` [A]."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        if self.seen is not None:
            self.seen[rows, tokens.to(self.device)] = True
        if self.keep_tokens:
            for row, token in zip(rows.tolist(), tokens.tolist()):
                self._push(row, token)

    def _push(self, row: int, token: int) -> None:
        tokens, n = self.tokens[row], self.params.no_repeat_ngram_size
        tokens.append(token)
        if n and len(tokens) >= n:  # the n-gram ending here: its first n-1 tokens may not be followed by token again
            self.ngrams[row].setdefault(tuple(tokens[len(tokens) - n : -1]), set()).add(token)

    def apply(
        self, logits: torch.Tensor, rows: torch.Tensor | Sequence[int], generated: torch.Tensor | Sequence[int] | int
    ) -> torch.Tensor:
        """``logits`` [A, V] of rows ``rows`` [A], after the processors (float32, a new tensor). ``generated``: the
        tokens each row has sampled in this completion (or turn) so far, one number or one per row."""
        p = self.params
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        out = logits.float()
        if self.seen is not None:
            seen = self.seen[rows].to(out.device)  # [A, V]
            penalised = torch.where(out < 0, out * p.repetition_penalty, out / p.repetition_penalty)
            out = torch.where(seen, penalised, out)
        banned = torch.zeros(out.shape, dtype=torch.bool, device=out.device)  # [A, V]
        if self.always is not None:
            banned |= self.always.to(out.device)
        counts = torch.as_tensor(generated, dtype=torch.long, device=out.device).expand(out.size(0))  # [A]
        if self.at_start is not None:
            banned |= (counts == 0)[:, None] & self.at_start.to(out.device)
        if p.min_new_tokens:
            early = (counts < p.min_new_tokens).nonzero().squeeze(-1)  # [a]
            banned[early[:, None], self.eos.to(out.device)[None, :]] = True
        if self.keep_tokens:
            for a, row in enumerate(rows.tolist()):
                for token in self._banned_by_history(row):
                    banned[a, token] = True
        return out.masked_fill(banned, float("-inf"))

    def _banned_by_history(self, row: int) -> set[int]:
        """Tokens banned in row ``row`` by what it holds: those completing a repeated n-gram or a bad word."""
        tokens, n = self.tokens[row], self.params.no_repeat_ngram_size
        found: set[int] = set()
        if n and len(tokens) >= n - 1:
            found |= self.ngrams[row].get(tuple(tokens[len(tokens) - n + 1 :]), set())
        for word in self.words:
            k = len(word) - 1
            if len(tokens) >= k and tuple(tokens[len(tokens) - k :]) == word[:-1]:
                found.add(word[-1])
        return found


def logits_rules(
    params: SamplingParams,
    histories: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int],
    vocab_size: int,
    device: torch.device | str = "cpu",
) -> LogitsRules | None:
    """:class:`LogitsRules` when ``params`` turns a processor on, else None (nothing to do per token)."""
    return LogitsRules(params, histories, eos_token_ids, vocab_size, device) if params.has_rules else None
