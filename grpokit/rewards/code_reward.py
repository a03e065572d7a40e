"""``code``: run the program a completion writes against its row's tests, in the sandbox.

The program is the last fenced block of the reward's language (```` ```python ```` or an untagged fence), or the
whole completion when there is none (:func:`extract_program`). Tests come from the row, in one of two forms:

- ``test_list``: assert statements (MBPP's column; ``test_setup_code`` is run first when the row has it);
- ``inputs`` / ``outputs``: stdin and the expected stdout (APPS, DeepCoder), or APPS's ``input_output`` JSON.

At most ``max_tests`` tests run, the longest first (DeepCoder runs the 15 longest). The reward is 1.0 when every
test passes and 0.0 otherwise (``mode: all``), or the fraction passed (``mode: fraction``); a row without tests
gets None. Each program runs in a fresh sandbox (:mod:`grpokit.rewards.sandbox`), every test in its own process
with ``test_seconds``, the whole program with ``total_seconds``. The per-test results (``passed``, ``failed``,
``timed_out``, ``output_limit``, ``error:<kind>``) are stored with the rollouts as the ``code_tests`` column and the
fraction passed as ``code_passed``.

Python first; another language runs by ``command`` (its arguments; ``program`` is the program's file, in the work
folder) on stdin/stdout tests, with ``readonly`` naming the folders its toolchain needs (for example
``{name: code, language: javascript, command: [node, program], readonly: [/opt/node]}``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpokit.rewards.contract import texts_of
from grpokit.rewards.registry import BUILTINS
from grpokit.rewards.sandbox import Limits, Sandbox

MODES = ("all", "fraction")
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_ALIASES = {"python": ("python", "py", "python3")}


def extract_program(text: str, language: str = "python") -> str:
    """The last fenced block tagged ``language`` (or untagged), else the whole text."""
    tags = _ALIASES.get(language, (language,))
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in (*tags, "")]
    return blocks[-1] if blocks else text


def row_tests(row: dict[str, Any]) -> list[dict[str, str]] | None:
    """The tests of one row (``{"assert": ...}`` or ``{"stdin": ..., "stdout": ...}``), or None when it has none."""
    if row.get("test_list"):
        setup = row.get("test_setup_code") or ""
        return [{"assert": f"{setup}\n{test}" if setup else str(test)} for test in row["test_list"]]
    inputs, outputs = row.get("inputs"), row.get("outputs")
    if inputs is None and row.get("input_output"):
        pairs = row["input_output"]
        pairs = json.loads(pairs) if isinstance(pairs, str) else pairs
        inputs, outputs = pairs.get("inputs"), pairs.get("outputs")
    if inputs is None or outputs is None:
        return None
    if isinstance(inputs, str):  # one test given as plain strings
        inputs, outputs = [inputs], [outputs]
    if len(inputs) != len(outputs):
        raise ValueError(f"a row has {len(inputs)} inputs but {len(outputs)} outputs")
    return [{"stdin": _text(i), "stdout": _text(o)} for i, o in zip(inputs, outputs)]


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def longest_first(tests: list[dict[str, str]], max_tests: int | None) -> list[dict[str, str]]:
    """At most ``max_tests`` tests: the longest (most text; the first of equals), kept in the row's order."""
    if max_tests is None or len(tests) <= max_tests:
        return list(tests)
    ranked = sorted(range(len(tests)), key=lambda i: -sum(len(v) for v in tests[i].values()))
    return [tests[i] for i in sorted(ranked[:max_tests])]


def program_label(program: str) -> str:
    """A label on the sandbox's command line, unique to ``program``."""
    return "grpokit-code-" + hashlib.sha256(program.encode()).hexdigest()[:16]


def score_results(results: Sequence[str], mode: str) -> float:
    """1.0 when every test passed (``all``; 0.0 otherwise), or the fraction passed (``fraction``)."""
    passed = sum(r == "passed" for r in results)
    if mode == "all":
        return float(bool(results) and passed == len(results))
    return passed / len(results) if results else 0.0


@BUILTINS.register("code")
class CodeReward:
    """The ``code`` built-in (module docstring). Limits: ``test_seconds`` per test, ``total_seconds`` per program
    (its tests together), ``memory_mb``, ``processes``, ``output_bytes`` per test; ``concurrency`` programs at once;
    ``sandbox``: auto | bwrap | unshare | none (the explicit, warned opt-out)."""

    name = "code"

    def __init__(
        self,
        mode: str = "all",
        max_tests: int | None = None,
        test_seconds: float = 5.0,
        total_seconds: float = 30.0,
        memory_mb: int = 1024,
        processes: int = 32,
        output_bytes: int = 1 << 20,
        language: str = "python",
        command: Sequence[str] | None = None,
        readonly: Sequence[str] = (),
        sandbox: str = "auto",
        concurrency: int | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"code reward: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if max_tests is not None and max_tests < 1:
            raise ValueError(f"code reward: max_tests must be >= 1 or null, got {max_tests}")
        if test_seconds <= 0 or total_seconds <= 0:
            raise ValueError("code reward: test_seconds and total_seconds must be > 0")
        if language != "python" and not command:
            raise ValueError(
                f"code reward: language {language!r} needs a command that runs its program, for example "
                "command: [node, program] (program is the program's file in the work folder)"
            )
        self.mode, self.max_tests, self.language = mode, max_tests, language
        self.command = list(command) if command else None
        self.test_seconds = float(test_seconds)
        self.limits = Limits(
            wall_seconds=float(total_seconds),
            cpu_seconds=float(test_seconds),
            memory_mb=int(memory_mb),
            processes=int(processes),
            output_bytes=int(output_bytes),
        )
        self.sandbox = Sandbox(sandbox, readonly=tuple(readonly))
        self.concurrency = concurrency or min(4, os.cpu_count() or 1)

    def run_program(self, program: str, tests: list[dict[str, str]]) -> list[str]:
        """Each test's result for ``program`` (see the module docstring), from one sandbox."""
        spec = {
            "program": program,
            "tests": tests,
            "test_seconds": self.test_seconds,
            "output_bytes": self.limits.output_bytes,
            "command": self.command,
        }
        # the label marks every process of this run (forks keep it): tests find leftovers by it
        reply, done = self.sandbox.run_harness(spec, self.limits, label=program_label(program))
        results = (reply or {}).get("results")
        if isinstance(results, list) and len(results) == len(tests) and all(isinstance(r, str) for r in results):
            return results
        why = "timed_out" if done.timed_out else "error:sandbox ended without results"
        return [why] * len(tests)

    def __call__(self, completions: Sequence[Any], log_extra=None, log_metric=None, **columns: Any) -> list:
        texts = texts_of(completions)
        rows = [
            {key: column[i] for key, column in columns.items() if isinstance(column, list)} for i in range(len(texts))
        ]
        jobs = []
        for text, row in zip(texts, rows):
            tests = row_tests(row)
            jobs.append(
                None if tests is None else (extract_program(text, self.language), longest_first(tests, self.max_tests))
            )
        with ThreadPoolExecutor(self.concurrency) as pool:
            results = list(pool.map(lambda job: None if job is None else self.run_program(*job), jobs))
        if log_extra is not None:
            log_extra("code_tests", results)
            log_extra(
                "code_passed", [None if r is None else sum(x == "passed" for x in r) / max(1, len(r)) for r in results]
            )
        if log_metric is not None:
            for r in results:
                if r:
                    log_metric("code/tests_passed", sum(x == "passed" for x in r) / len(r))
        return [None if r is None else score_results(r, self.mode) for r in results]
