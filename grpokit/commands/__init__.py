"""The CLI's read-only commands: `grpokit env` and `grpokit explain`."""
