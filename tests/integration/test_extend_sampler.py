"""Adding a sampler touches the files docs/architecture.md names, and no others: in a copy of the package, a new
module of grpokit/train/experience/ (the class, with ``from_inputs``) and its registration in ``SAMPLERS``
(grpokit/train/experience/sources.py) with the situations it serves. It takes the plain run (one process, no seeds
per group, no server) from the ``engine`` entry, whose flags narrow to the server's in the same file, so that no two
entries serve one situation. Then every situation still has exactly one sampler, and ``grpokit train`` on the copy
samples a step with the new one."""

from __future__ import annotations

import pytest
from package_copy import assert_changes_are_the_pages
from shared_helpers import logged_steps, tiny_run_config

SAMPLER = "train/experience/counting_sampler.py"
SAMPLER_MODULE = '''"""CountingSampler: the run's engine in this process, as EngineSampler, counting the groups it
samples (a test's sampler)."""

from __future__ import annotations

from grpokit.train.experience.samplers import EngineSampler


class CountingSampler(EngineSampler):
    """EngineSampler, reporting the groups sampled so far as ``counting/groups``."""

    def __init__(self, **parts) -> None:
        super().__init__(**parts)
        self.groups = 0

    def _generate(self, step, indices, first):
        self.groups += len(indices)
        return super()._generate(step, indices, first)

    def metrics(self) -> dict[str, float]:
        return {"counting/groups": float(self.groups)}
'''
ENGINE_ENTRY = 'SAMPLERS.register("engine", seeded=False, **NOT_SPECIAL)(EngineSampler)'
NARROWED = """SAMPLERS.register("engine", seeded=False, server=True, **NOT_SPECIAL)(EngineSampler)  # a server's
SAMPLERS.register("counting", seeded=False, server=False, **NOT_SPECIAL)(CountingSampler)"""
EXPECTED = {SAMPLER, "train/experience/sources.py"}

# In the copy: the sampler each of the 64 situations gets (pick_sampler refuses none or two), by name.
PICKS = """
import itertools
from collections import Counter
from dataclasses import fields
from grpokit.train.experience.sampler_entry import Situation
from grpokit.train.experience.sources import SAMPLERS, pick_sampler

names = {entry.cls: name for name, entry in SAMPLERS.items()}
flags = [f.name for f in fields(Situation)]
picks = [pick_sampler(Situation(**dict(zip(flags, v)))) for v in itertools.product((False, True), repeat=len(flags))]
print(sorted(Counter(names[entry.cls] for entry in picks).items()))
print(names[pick_sampler(Situation(tool_rollouts=False)).cls], names[pick_sampler(Situation(False, server=True)).cls])
"""


@pytest.fixture(scope="module")
def extended(package_copy):
    package_copy.add(SAMPLER, SAMPLER_MODULE)
    server_ahead = "from grpokit.train.experience.server_ahead import ServerAheadSampler"
    package_copy.edit(
        "train/experience/sources.py",
        (server_ahead, f"from grpokit.train.experience.counting_sampler import CountingSampler\n{server_ahead}"),
        (ENGINE_ENTRY, NARROWED),
    )
    return package_copy


def test_a_sampler_touches_the_files_the_page_names(extended):
    assert_changes_are_the_pages(extended, "A sampler", EXPECTED)


@pytest.mark.usefixtures("one_thread")
def test_the_sampler_samples_a_step_from_the_command_line(extended, tmp_path, tiny_model_dir):
    out = extended.python("-c", PICKS)
    assert out.returncode == 0, out.stderr[-3000:]
    # 64 situations: ray 32; not ray, ahead: 8 server, 8 not; not ahead: tools 8, raw prompts 4, seeded 2, then the
    # plain run's 1 each for counting (no server) and engine (a server)
    assert out.stdout.splitlines() == [
        "[('counting', 1), ('engine', 1), ('group_seeded', 2), ('raw_prompts', 4), ('ray', 32), "
        "('server_ahead', 8), ('thread', 8), ('tools', 8)]",
        "counting engine",
    ]
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=2, prompts_per_step=2)
    codes, stderr = extended.cli_runs(["train", config])
    assert codes == [0], stderr[-3000:]
    steps = logged_steps(tmp_path / "run")
    assert [step["counting/groups"] for step in steps] == [2.0, 4.0]  # two prompts' groups a step, counted
