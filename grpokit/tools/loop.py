"""The multi-turn tool loop of one batch of rollouts, independent of how tokens are generated.

A rollout engine drives it per sequence: :meth:`ToolLoop.start` renders the prompt (with the tools'
schemas and the environment's observation); after each generated turn :meth:`ToolLoop.turn_done`
records it, parses its tool calls and submits them (the sequence leaves the decoding batch while
they run); :meth:`ToolLoop.poll` returns the sequences whose results arrived, each with the
``suffix`` tokens to append (to its kept KV cache) before it decodes its next turn, at most
:meth:`ToolLoop.remaining` tokens. :meth:`ToolLoop.run` is the plain driver, with a ``generate``
function that re-prefills each turn: the reference the KV-cache engine must match.

When a rollout ends (TRL's ``_tool_call_loop`` rules):

- ``answered``: its turn has no tool call and ends with the end-of-turn token;
- ``max_iterations``: its turn has calls but ``max_tool_calling_iterations`` rounds of tools ran
  already (None: no limit); the calls are not run;
- ``length``: the completion (generated and added tokens after the prompt) reached
  ``max_completion_length`` (a turn cut short), or the tool results would leave no room for another token; those
  results are not shown to the model (the calls did run: they are in ``results``).

A malformed call does not end the rollout: its error is the tool message, and the model goes on.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from grpokit.tools.conversation import ConversationTokens, TokenConversation
from grpokit.tools.environment import EnvironmentSession, with_observation
from grpokit.tools.executor import ToolExecutor, ToolResult
from grpokit.tools.parsing import ToolParser, assistant_message, get_tool_parser, tool_parser_for
from grpokit.tools.tool_images import images_refused

GenerateFn = Callable[[list[list[int]], list[int]], list[list[int]]]


@dataclass
class ToolRollout:
    """One rollout's state: its tokens and loss mask (``conversation``), the chat ``messages`` (prompt,
    then assistant and tool messages: what reward functions and the store see), the environment
    ``session``, every call's ``results`` in order, ``iterations`` (rounds of tools run), ``state``
    (``generating`` | ``tools`` | ``done``), ``stop_reason`` once done, and ``suffix``: the tokens
    added after its last turn, to feed before it decodes again."""

    conversation: TokenConversation
    messages: list[dict[str, Any]]
    session: EnvironmentSession | None = None
    results: list[ToolResult] = field(default_factory=list)
    iterations: int = 0
    state: str = "generating"
    stop_reason: str | None = None
    suffix: list[int] = field(default_factory=list)
    pending: Future | None = field(default=None, repr=False)

    def _finish(self, reason: str) -> None:
        self.state, self.stop_reason, self.pending = "done", reason, None


class ToolLoop:
    """The tool rounds of rollouts: ``chat`` renders and tokenizes, ``executor`` runs the calls,
    ``parser`` reads them (a registered name or a function; default: detected from the chat template)."""

    def __init__(
        self,
        chat: ConversationTokens,
        executor: ToolExecutor,
        *,
        max_completion_length: int,
        max_tool_calling_iterations: int | None = None,
        parser: str | ToolParser | None = None,
    ):
        self.chat = chat
        self.executor = executor
        self.max_completion_length = int(max_completion_length)
        self.max_tool_calling_iterations = max_tool_calling_iterations
        if parser is None:
            parser = tool_parser_for(chat.chat_template or chat.tokenizer)
        self.parser: ToolParser = get_tool_parser(parser) if isinstance(parser, str) else parser

    def start(self, prompt: Sequence[Mapping[str, Any]], session: EnvironmentSession | None = None) -> ToolRollout:
        """A rollout of the chat ``prompt`` (the environment's reset observation appended)."""
        messages = with_observation(prompt, None if session is None else session.observation)
        conversation = self.chat.start(messages, self.executor.schemas_for(session))
        return ToolRollout(conversation, messages, session)

    def remaining(self, rollout: ToolRollout) -> int:
        """Tokens the rollout may still generate in its next turn."""
        return max(0, self.max_completion_length - len(rollout.conversation.completion_ids))

    def turn_done(self, rollout: ToolRollout, token_ids: Sequence[int]) -> None:
        """Record a generated turn (end-of-turn token included when sampled); submit its tool calls
        or end the rollout."""
        if rollout.state != "generating":
            raise RuntimeError(f"turn_done on a rollout that is {rollout.state}, not generating")
        rollout.conversation.add_generated(token_ids)
        ids = list(token_ids)
        text = self.chat.tokenizer.decode(ids, skip_special_tokens=False)
        calls = self.parser(text)
        if ids and ids[-1] == self.chat.end_of_turn:
            text = self.chat.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        rollout.messages.append(assistant_message(text, calls))
        if not calls:
            rollout._finish("answered" if ids and ids[-1] == self.chat.end_of_turn else "length")
        elif self.remaining(rollout) == 0:
            rollout._finish("length")
        elif self.max_tool_calling_iterations is not None and rollout.iterations >= self.max_tool_calling_iterations:
            rollout._finish("max_iterations")
        else:
            rollout.state = "tools"
            rollout.pending = self.executor.submit(calls, rollout.session)

    def poll(self, rollouts: Sequence[ToolRollout], wait: bool = False) -> list[ToolRollout]:
        """The rollouts whose tool results arrived since the last poll, each with its ``suffix``
        appended and ready to generate again (or ended for ``length``); ``wait``: block until at
        least one arrives when any is running."""
        running = [r for r in rollouts if r.state == "tools"]
        if wait and running and not any(r.pending.done() for r in running):
            concurrent.futures.wait([r.pending for r in running], return_when=concurrent.futures.FIRST_COMPLETED)
        arrived = [r for r in running if r.pending.done()]
        for rollout in arrived:
            results = rollout.pending.result()
            rollout.results.extend(results)
            tool_messages = [result.message() for result in results]
            shown = [r for r in results if r.images]
            if shown and self.chat.processor is None:
                raise images_refused(shown[0].call.name)
            suffix, pixels = self.chat.tool_suffix_inputs(rollout.conversation, tool_messages)
            if len(suffix) >= self.remaining(rollout):
                rollout._finish("length")
                continue
            rollout.conversation.add_environment(suffix, pixels, [i for r in results for i in r.images])
            rollout.messages.extend(tool_messages)
            rollout.suffix, rollout.iterations, rollout.pending = suffix, rollout.iterations + 1, None
            rollout.state = "generating"
        return arrived

    def run(self, rollouts: Sequence[ToolRollout], generate: GenerateFn) -> None:
        """Drive ``rollouts`` to the end: ``generate(token_ids, max_new_tokens)`` samples one turn for
        each sequence given (its whole conversation so far: a re-prefill) and returns the new tokens;
        sequences waiting on tools are left out of the call."""
        while any(r.state != "done" for r in rollouts):
            active = [r for r in rollouts if r.state == "generating"]
            if active:
                turns = generate([r.conversation.ids for r in active], [self.remaining(r) for r in active])
                for rollout, ids in zip(active, turns):
                    self.turn_done(rollout, ids)
            self.poll(rollouts, wait=not any(r.state == "generating" for r in rollouts))
