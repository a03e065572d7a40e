"""What tests share besides fixtures: the tiny vocabulary, the chat template, the reward file the runs score with.

A module with a name of its own (not ``conftest``), so that ``from shared_helpers import ...`` finds this file
whichever subset of the tree pytest collects (tests/real_vllm has a conftest.py of its own).
"""

from __future__ import annotations

import os

WORDS = [f"w{i}" for i in range(40)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
REWARD_FILE = os.path.join(os.path.dirname(__file__), "integration", "rewards_for_tests.py")
TARGET_REWARD = f"{REWARD_FILE}:target_fraction"
