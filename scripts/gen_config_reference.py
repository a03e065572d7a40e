"""Write docs/config.md from the config dataclasses (a test checks it is current)."""

from pathlib import Path

from grpokit.config import config_reference

HEADER = (
    "# Config reference\n\n"
    "Generated from `grpokit/config/` by `python scripts/gen_config_reference.py`; do not edit by hand.\n\n"
)

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    out.write_text(HEADER + config_reference() + "\n")
    print(f"wrote {out}")
