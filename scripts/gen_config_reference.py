"""Write docs/config.md and grpokit/config/typed_keys.py from the config dataclasses (a test checks both are
current)."""

from pathlib import Path

from grpokit.config import config_reference
from grpokit.config.reference import typed_keys_source

HEADER = (
    "# Config reference\n\n"
    "Generated from `grpokit/config/` by `python scripts/gen_config_reference.py`; do not edit by hand.\n\n"
)

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    out.write_text(HEADER + config_reference() + "\n")
    print(f"wrote {out}")
    typed = Path(__file__).resolve().parents[1] / "grpokit" / "config" / "typed_keys.py"
    typed.write_text(typed_keys_source())
    print(f"wrote {typed}")
