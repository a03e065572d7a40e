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
        self.always = self._ids(banned)  # token ids banned at every step, or None
        self.at_start = self._ids(params.begin_suppress_tokens)  # banned at a completion's (turn's) first step
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.device)
        self.words = [w for w in words if len(w) > 1]
        n = len(histories)
        self.penalise = params.repetition_penalty != 1.0
        # each row's tokens for the penalty, as transformers gathers and scatters them: [n, capacity] ids (-1 after
        # a row's length), so a step costs rows x context, not rows x vocabulary
        self.context = torch.full((n, max([len(h) for h in histories] + [1]) + 16), -1, dtype=torch.long)
        self.length = torch.zeros(n, dtype=torch.long)
        self.keep_tokens = bool(params.no_repeat_ngram_size or self.words)
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.ngrams: list[dict[tuple[int, ...], set[int]]] = [{} for _ in range(n)]
        for row, history in enumerate(histories):
            self.reset(row, history)

    def _ids(self, ids: Sequence[int]) -> torch.Tensor | None:
        return torch.tensor(sorted(set(ids)), dtype=torch.long, device=self.device) if ids else None

    def reset(self, row: int, history: Sequence[int]) -> None:
        """Row ``row``'s context is now ``history`` (a multi-turn rollout's whole conversation so far)."""
        history = [int(t) for t in history]
        if self.penalise:
            self._room(len(history))
            self.context[row] = -1
            self.context[row, : len(history)] = torch.tensor(history, dtype=torch.long)
            self.length[row] = len(history)
        if self.keep_tokens:
            self.tokens[row], self.ngrams[row] = [], {}
            for token in history:
                self._push(row, token)

    def append(self, rows: torch.Tensor | Sequence[int], tokens: torch.Tensor) -> None:
        """Rows ``rows`` [A] sampled ``tokens`` [A]."""
        if self.penalise:
            at = torch.as_tensor(rows, dtype=torch.long)
            self._room(int(self.length[at].max()) + 1 if at.numel() else 0)
            self.context[at, self.length[at]] = tokens.cpu().long()
            self.length[at] += 1
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        if self.keep_tokens:
            for row, token in zip(rows.tolist(), tokens.tolist()):
                self._push(row, token)

    def _room(self, length: int) -> None:
        """Grow the context tensor to hold ``length`` tokens per row (doubling: appends stay O(1) on average)."""
        if length > self.context.size(1):
            grown = torch.full((self.context.size(0), 2 * length), -1, dtype=torch.long)
            grown[:, : self.context.size(1)] = self.context
            self.context = grown

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
        out = logits.float().clone()  # [A, V]
        if self.penalise:
            self._penalise(out, rows.cpu())
        # the bans, written into their columns only (never a pass over the vocabulary)
        ban = float("-inf")
        if self.always is not None:
            out[:, self.always.to(out.device)] = ban
        counts = torch.as_tensor(generated, dtype=torch.long, device=out.device).expand(out.size(0))  # [A]
        if self.at_start is not None:
            first = (counts == 0).nonzero().squeeze(-1)  # [a] rows at their first token
            out[first[:, None], self.at_start.to(out.device)[None, :]] = ban
        if p.min_new_tokens:
            early = (counts < p.min_new_tokens).nonzero().squeeze(-1)  # [a]
            out[early[:, None], self.eos.to(out.device)[None, :]] = ban
        if self.keep_tokens:
            for a, row in enumerate(rows.tolist()):
                found = self._banned_by_history(row)
                if found:
                    out[a, sorted(found)] = ban
        return out

    def _penalise(self, out: torch.Tensor, rows: torch.Tensor) -> None:
        """Repetition penalty in place on ``out`` [A, V] of rows ``rows`` [A]: each token of a row's context has its
        score divided by p when positive, multiplied when negative (repeats in the context count once: transformers
        gathers the scores, penalises them and scatters them back, so a repeated id gets the same value)."""
        width = int(self.length[rows].max()) if rows.numel() else 0
        if width == 0:
            return
        ids = self.context[rows, :width]  # [A, L], -1 after each row's length
        known = ids >= 0
        # a padding slot repeats the row's first token (same value written twice); a row with no token writes its
        # column 0 back unchanged
        ids = torch.where(known, ids, ids[:, :1].clamp(min=0)).to(out.device)
        scores = out.gather(1, ids)  # [A, L]
        penalty = self.params.repetition_penalty
        penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
        has_tokens = (self.length[rows] > 0).to(out.device)[:, None]  # [A, 1]
        out.scatter_(1, ids, torch.where(has_tokens, penalised, scores))

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
