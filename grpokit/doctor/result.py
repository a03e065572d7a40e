"""A doctor check's result, and how the lines and the exit status are made."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    """One check: its ``name``, ``status`` (PASS, WARN, FAIL, SKIP), what it found, and the fix (FAIL, WARN)."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"\n      fix: {self.fix}" if self.fix and self.status in (FAIL, WARN) else ""
        return f"{self.status}  {self.name}: {self.detail}{fix}"


def summary(checks: list[Check]) -> tuple[str, int]:
    """(the closing line, the exit status: 1 when a check failed, else 0)."""
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    if failed:
        return f"doctor: {failed} failed, {warned} warnings: fix the failures before training", 1
    return f"doctor: no failure ({warned} warnings, {len(checks)} checks)", 0
