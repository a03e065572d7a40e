"""Environments (TRL's environment_factory contract): tools from methods, reset(**row), reuse across
batches, dispatch through the executor, and a hanging method that breaks only its own instance."""

from __future__ import annotations

import threading

import pytest

from grpokit.tools.environment import EnvironmentPool, EnvironmentSession, environment_tools, with_observation
from grpokit.tools.executor import ToolExecutor
from grpokit.tools.json_schema import ToolError
from grpokit.tools.parsing import ToolCall


class Counter:
    """A counter that starts at the row's ``start``; the reward is 1 when it reaches ``target``."""

    made = 0
    release = threading.Event()

    def __init__(self):
        Counter.made += 1
        self.value = None
        self.target = None
        self.rows = []

    def reset(self, start: int, target: int, **row) -> str:
        self.rows.append({"start": start, "target": target, **row})
        self.value, self.target = start, target
        return f" (the counter is at {start})"

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.value += by
        return f"the counter is at {self.value}"

    def hang(self) -> str:
        """Block until the test releases it."""
        Counter.release.wait(30)
        return "released"

    def get_reward(self) -> float:
        return float(self.value == self.target)

    def _helper(self) -> None:
        raise AssertionError("private methods are not tools")

    @property
    def expensive(self) -> int:
        raise AssertionError("properties are not evaluated")


def call(name, **arguments):
    return ToolCall(name, arguments, "", 0, 0)


def test_environment_tools_are_its_public_methods():
    env = Counter()
    assert sorted(m.__name__ for m in environment_tools(env)) == ["hang", "increment"]
    session = EnvironmentSession(env)
    assert [s["function"]["name"] for s in session.schemas] == ["hang", "increment"]
    assert session.tools["increment"].__self__ is env


def test_pool_resets_one_instance_per_row_and_reuses_them():
    Counter.made = 0
    pool = EnvironmentPool(Counter)
    assert Counter.made == 1 and pool.has_reward
    rows = [{"prompt": "p0", "start": 0, "target": 2}, {"prompt": "p1", "start": 5, "target": 6}]
    first = pool.sessions(rows)
    assert Counter.made == 2
    assert [s.observation for s in first] == [" (the counter is at 0)", " (the counter is at 5)"]
    assert first[0].instance.rows[-1] == {"prompt": "p0", "start": 0, "target": 2}  # reset(**row): every column
    second = pool.sessions(rows[:1])
    assert Counter.made == 2  # reused
    assert second[0].instance in [s.instance for s in first]


def test_calls_change_the_state_of_their_own_environment():
    pool = EnvironmentPool(Counter)
    a, b = pool.sessions([{"start": 0, "target": 2}, {"start": 10, "target": 0}])
    with ToolExecutor(timeout=5.0) as executor:
        assert executor.schemas_for(a) == a.schemas
        (ra, rb) = executor.run(
            [([call("increment", by=1), call("increment", by=1)], a), ([call("increment", by=5)], b)]
        )
    assert [r.content for r in ra] == ["the counter is at 1", "the counter is at 2"]
    assert [r.content for r in rb] == ["the counter is at 15"]
    assert all(r.worker is None for r in ra + rb)  # a thread of this process: the state stays here
    assert (a.get_reward(), b.get_reward()) == (1.0, 0.0)


def test_plain_tools_and_environment_tools_together():
    def double(x: int) -> int:
        """Double.

        Args:
            x: The value.
        """
        return 2 * x

    (session,) = EnvironmentPool(Counter).sessions([{"start": 1, "target": 1}])
    with ToolExecutor([double], timeout=5.0, max_workers=1) as executor:
        assert [s["function"]["name"] for s in executor.schemas_for(session)] == ["double", "hang", "increment"]
        ((doubled, incremented),) = executor.run([([call("double", x=4), call("increment", by=2)], session)])
    assert (doubled.content, doubled.worker is not None) == ("8", True)
    assert incremented.content == "the counter is at 3"


def test_a_hanging_method_breaks_only_its_environment():
    Counter.release.clear()
    pool = EnvironmentPool(Counter)
    stuck, fine = pool.sessions([{"start": 0, "target": 1}, {"start": 0, "target": 1}])
    try:
        # the fine session's call must answer within it on a loaded machine too: 3 s (hang waits for its release)
        with ToolExecutor(timeout=3.0, max_workers=2) as executor:
            ((hung, after), (ok,)) = executor.run(
                [([call("hang"), call("increment", by=1)], stuck), ([call("increment", by=1)], fine)]
            )
            assert (hung.status, hung.error) == ("timeout", "hang timed out after 3 s")
            assert after.status == "unavailable"
            assert after.error == "the environment is unusable: hang timed out after 3 s and may still be running"
            assert stuck.instance.value == 0  # the call after the timeout did not run
            assert stuck.get_reward() is None
            assert (ok.content, fine.get_reward()) == ("the counter is at 1", 1.0)
            # the broken instance is never handed out again
            again = pool.sessions([{"start": 0, "target": 1}, {"start": 0, "target": 1}])
            assert stuck.instance not in [s.instance for s in again]
            assert fine.instance in [s.instance for s in again]
    finally:
        Counter.release.set()


def test_bad_environments_are_refused():
    class NoReset:
        def act(self, x: int) -> int:
            """Act.

            Args:
                x: A value.
            """
            return x

    with pytest.raises(ToolError, match="NoReset made by environment_factory has no reset method"):
        EnvironmentPool(NoReset)
    with pytest.raises(ToolError, match="must be a callable"):
        EnvironmentPool(Counter())

    class Undocumented:
        def reset(self, **row):
            return None

        def act(self, x):
            return x

    with pytest.raises(ToolError, match=r"Undocumented\.act cannot be described"):
        EnvironmentPool(Undocumented)

    class Clash(Counter):
        def add(self, x: int) -> int:
            """Add.

            Args:
                x: A value.
            """
            return x

    def add(x: int) -> int:
        """Add.

        Args:
            x: A value.
        """
        return x

    (session,) = EnvironmentPool(Clash).sessions([{"start": 0, "target": 0}])
    with ToolExecutor([add], isolation="thread") as executor, pytest.raises(ToolError, match="named like plain tools"):
        executor.schemas_for(session)


def test_with_observation_appends_to_the_last_message():
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "Count."}]
    assert with_observation(prompt, " Now at 3.") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Count. Now at 3."},
    ]
    assert prompt[-1]["content"] == "Count."
    assert with_observation(prompt, None) == prompt


class Maze:
    def reset(self, size: int, **row) -> None:
        self.size, self.row = size, row

    def step(self, direction: str) -> str:
        """Take a step.

        Args:
            direction: Where to go.
        """
        return direction


def test_environments_by_name_in_the_rows():
    from grpokit.tools.environment import Environments

    environments = Environments({"counter": Counter, "maze": Maze, "also_counter": Counter})
    rows = [
        {"environment": "maze", "size": 3, "prompt": "p0"},
        {"environment": "counter", "start": 4, "target": 5},
        {"environment": "maze", "size": 5},
        {"environment": "also_counter", "start": 0, "target": 0},
    ]
    sessions = environments.sessions(rows)
    assert [type(s.instance).__name__ for s in sessions] == ["Maze", "Counter", "Maze", "Counter"]
    assert sessions[0].instance.row == {"prompt": "p0"}  # the 'environment' column is not passed to reset
    assert [s.instance.size for s in (sessions[0], sessions[2])] == [3, 5]
    assert list(sessions[0].tools) == ["step"]
    # a reward function per class that defines get_reward (Counter, under two names: once)
    ((name, reward),) = environments.reward_functions()
    assert name == "Counter"
    sessions[1].instance.increment(1)
    sessions[3].broken = "hang timed out"
    assert reward(environments=[s.instance for s in sessions], prompts=["x"] * 4) == [None, 1.0, None, None]
    with pytest.raises(ToolError, match=r"environment='chess'.*expected one of \['counter', 'maze', 'also_counter'\]"):
        environments.sessions([{"environment": "chess"}])
    single = Environments(Maze)
    (session,) = single.sessions([{"size": 2, "environment": "kept"}])
    assert session.instance.row == {"environment": "kept"}  # one factory: every column goes to reset
    assert single.reward_functions() == []
    with pytest.raises(ToolError, match="empty dict"):
        Environments({})
