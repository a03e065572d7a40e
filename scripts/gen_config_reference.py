"""Write docs/config.md, grpokit/config/typed_keys.py and grpokit/config/typed_trl_keys.py from the config dataclasses
(a test checks all three are current)."""

from pathlib import Path

from grpokit.config import config_reference
from grpokit.config.reference import trl_typed_keys_source, typed_keys_source

HEADER = (
    "# Config reference\n\n"
    "Generated from `grpokit/config/` by `python scripts/gen_config_reference.py`; do not edit by hand.\n\n"
)

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    out.write_text(HEADER + config_reference() + "\n")
    print(f"wrote {out}")
    config = Path(__file__).resolve().parents[1] / "grpokit" / "config"
    for name, source in (("typed_keys.py", typed_keys_source()), ("typed_trl_keys.py", trl_typed_keys_source())):
        (config / name).write_text(source)
        print(f"wrote {config / name}")
