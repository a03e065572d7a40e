"""Rollout engines behind one protocol, rollout sources behind one interface, and a scheduler that only dispatches."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from shared_helpers import sampling_params

from grpokit.data.prompts import DataError
from grpokit.rewards.contract import RewardState
from grpokit.rollout.engine import HFRolloutEngine, RolloutEngine
from grpokit.rollout.engines import ENGINES, EngineParts, get_engine
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.rollout_func import RolloutFuncEngine
from grpokit.rollout.transformers_engine import TransformersRolloutEngine
from grpokit.rollout.transformers_multiturn import TransformersMultiTurnEngine
from grpokit.rollout.types import Rollouts
from grpokit.rollout.vllm.engine import VLLMRolloutEngine
from grpokit.system.processes import SingleProcess
from grpokit.train.experience import rollout_scheduler as scheduler_module
from grpokit.train.experience.rollout_scheduler import RolloutScheduler
from grpokit.train.experience.sources import SAMPLERS, SOURCES, AheadRollouts, SyncRollouts


def test_every_engine_provides_the_whole_protocol():
    assert set(ENGINES) == {"hf", "vllm", "transformers", "multi-turn", "transformers-multi-turn", "rollout_func"}
    assert [name for name, entry in ENGINES.items() if entry.separate_weights] == ["vllm"]  # its own weight copy
    members = {"generate", "sync_weights", "takes_group_seeds", "takes_raw_prompts", "policy_version", "generator"}
    members.add("pad_token_id")
    assert members <= set(RolloutEngine.__annotations__) | {"generate", "sync_weights"}
    # class attributes, not duck-typed: each engine says whether it seeds groups itself
    assert (HFRolloutEngine.takes_group_seeds, VLLMRolloutEngine.takes_group_seeds) == (False, True)
    assert MultiTurnEngine.takes_group_seeds is True and TransformersRolloutEngine.takes_group_seeds is False
    # and whether it takes the prompts as the dataset holds them (only TRL's rollout_func does)
    assert TransformersMultiTurnEngine.takes_group_seeds is True
    engines = (
        HFRolloutEngine,
        VLLMRolloutEngine,
        MultiTurnEngine,
        TransformersMultiTurnEngine,
        TransformersRolloutEngine,
        RolloutFuncEngine,
    )
    assert [cls.takes_raw_prompts for cls in engines] == [False, False, False, False, False, True]
    for cls in engines:
        assert callable(cls.sync_weights) and callable(cls.generate), cls
        assert "seeds" in inspect.signature(cls.generate).parameters or not cls.takes_group_seeds, cls


def test_partial_rollouts_are_an_engine_fact_of_its_settings():
    from grpokit.rollout.vllm.settings import VLLMSettings

    vllm = ENGINES["vllm"]
    assert vllm.partial(VLLMSettings(vllm_partial_rollout_tokens=4, vllm_partial_rollout_timeout=9.0)) == (4, 9.0)
    assert vllm.partial(VLLMSettings()) is None  # off by default
    # an engine without the fact has none, whatever its settings are (an engine of algo.imports with settings of its
    # own, which once were read as a vLLM's)
    assert ENGINES["hf"].partial(None) is None and ENGINES["hf"].partial(object()) is None


def test_the_hf_engine_syncs_by_version_and_unknown_engines_are_named():
    engine = get_engine("hf").build(
        EngineParts(torch.nn.Linear(2, 2), [1], 0, torch.device("cpu"), seed=0, trust_remote_code=False), None
    )
    assert isinstance(engine, HFRolloutEngine) and engine.policy_version == 0
    engine.sync_weights()
    engine.sync_weights()
    assert engine.policy_version == 2  # shared weights: one version per update, nothing copied
    try:
        get_engine("tgi")
    except ValueError as exc:
        assert "hf, vllm, transformers, multi-turn" in str(exc)
    else:
        raise AssertionError("an unknown engine name must fail")


def _rollouts(batch: list[int], step: int) -> Rollouts:
    """One completion per prompt whose single token is 100 * step + the prompt index."""
    n = len(batch)
    return Rollouts(
        prompt_ids=[[i] for i in batch],
        completion_ids=torch.tensor([[100 * step + i] for i in batch]),
        completion_mask=torch.ones(n, 1),
        logprobs=torch.zeros(n, 1),
        finish_reasons=["stop"] * n,
        num_generations=1,
        policy_version=step,
    )


class _Workers:
    """A stand-in for the Ray sampler: submit returns a handle, collect and scatter hand the rollouts over."""

    def __init__(self):
        self.calls = []
        self.procs = SingleProcess()

    def sample(self, step, batch, first_group):
        self.calls.append(("sample", step, list(batch), first_group))
        return _rollouts(batch, step)

    def submit(self, step, batch, first_group=0):
        self.calls.append(("submit", step, list(batch)))
        return ("pending", step, list(batch))

    def collect(self, pending):
        self.calls.append(("collect", pending[1]))
        return _rollouts(pending[2], pending[1])

    def scatter(self, rollouts):
        return rollouts

    def metrics(self):
        return {"rollout_worker_restarts": 0.0}

    def share_weights(self):  # no partial rollouts: nothing waits for newer weights
        pass

    def interrupt(self):
        pass

    def close(self):
        self.calls.append(("close",))


class _Prompts:
    """Draws consecutive prompt indices."""

    drawn_by_history = False  # no curriculum: every rank draws the same

    def __init__(self):
        self.next = 0

    def next_indices(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _scheduler(source):
    engine = type("Engine", (), {"policy_version": 0})()
    return RolloutScheduler(
        source=source,
        engine=engine,
        prompts=_Prompts(),
        procs=SingleProcess(),
        prompts_per_step=2,
        sampling=sampling_params(1),
    )


class _Clock:
    def __init__(self):
        self.laps = []

    def lap(self, name):
        self.laps.append(name)


def _score(step, indices, rollouts, trainer_state=None):
    """A stand-in for the trainer's scoring: what it was given."""
    return step, list(indices), rollouts.completion_ids.flatten().tolist(), trainer_state


def _state(step):
    return RewardState(global_step=step - 1, max_steps=0, epoch=0.0)


def _submits(workers):
    return [c for c in workers.calls if c[0] == "submit"]  # the learner's thread; collects run on the producer's


def test_ahead_admits_k_steps_ahead_scores_on_the_producer_and_checkpoints_the_queue():
    workers = _Workers()
    scheduler = _scheduler(AheadRollouts(workers, last_step=4, max_staleness=2, score_ahead=True))
    clock = _Clock()
    # step 1 admits steps 1, 2, 3 (all by the weights of now), each scored with the reward state of its draw
    assert scheduler.next_scored(1, _score, _state, clock) == (1, [0, 1], [100, 101], _state(1))
    assert _submits(workers) == [("submit", 1, [0, 1]), ("submit", 2, [2, 3]), ("submit", 3, [4, 5])]
    assert clock.laps == ["generate", "reward"]
    state, pending = scheduler.state_dict()  # a checkpoint after step 1 waits for steps 2 and 3 and holds them
    assert state["pending_indices"] is None
    queue = pending["queue"]
    assert [(e["step"], e["indices"], e["reward_state"]["global_step"]) for e in queue] == [
        (2, [2, 3], 1),
        (3, [4, 5], 2),
    ]
    assert [e["rollouts"]["completion_ids"].flatten().tolist() for e in queue] == [[202, 203], [304, 305]]
    assert scheduler.next_scored(2, _score, _state, clock)[:3] == (2, [2, 3], [202, 203])
    assert _submits(workers)[-1] == ("submit", 4, [6, 7])  # step 2 admits step 4, the last
    scheduler.next_scored(3, _score, _state, clock)
    assert len(_submits(workers)) == 4  # nothing past last_step
    metrics = scheduler.metrics()
    assert {"async/learner_wait_s", "async/producer_wait_s", "rollout_worker_restarts"} <= set(metrics)
    scheduler.close()
    # a resume restores the queue: steps 2 and 3 are trained on as saved (scored again with the reward state of
    # their draw), step 4 drawn anew
    resumed_workers = _Workers()
    resumed = _scheduler(AheadRollouts(resumed_workers, last_step=4, max_staleness=2, score_ahead=True))
    resumed.load_state_dict(state, pending)
    assert resumed.next_scored(2, _score, _state, clock) == (2, [2, 3], [202, 203], _state(2))
    assert _submits(resumed_workers) == [("submit", 4, [0, 1])]  # its own prompt source draws the next batch
    assert resumed.next_scored(3, _score, _state, clock) == (3, [4, 5], [304, 305], _state(3))
    assert resumed.next_scored(4, _score, _state, clock) == (4, [0, 1], [400, 401], _state(4))
    resumed.close()


def test_ahead_raises_a_producer_failure_in_the_step():
    class Failing(_Workers):
        def collect(self, pending):
            raise OSError("worker lost")

    scheduler = _scheduler(AheadRollouts(Failing(), last_step=2, max_staleness=1, score_ahead=True))
    try:
        scheduler.next_scored(1, _score, _state, _Clock())
    except OSError as exc:
        assert "worker lost" in str(exc)
    else:
        raise AssertionError("a producer's exception must reach the learner's step")
    scheduler.close()


def test_sync_sources_sample_in_the_step_and_number_later_rounds_on():
    workers = _Workers()
    scheduler = _scheduler(SyncRollouts(workers))
    scheduler.next(1)
    scheduler.more(1, 1)  # dynamic sampling's round 1: a fresh batch, its groups after round 0's 2
    scheduler.more(1, 2)
    assert workers.calls == [("sample", 1, [0, 1], 0), ("sample", 1, [2, 3], 2), ("sample", 1, [4, 5], 4)]
    assert scheduler.state_dict() == ({"policy_version": 0, "pending_indices": None}, None)
    # a checkpoint's drawn-but-unsampled batch is sampled first on resume
    scheduler.load_state_dict({"policy_version": 4, "pending_indices": [7, 8]}, None)
    assert scheduler.next(2)[0] == [7, 8] and scheduler.engine.policy_version == 4
    scheduler.close()
    assert workers.calls[-1] == ("close",)


def test_the_registries_name_every_mode():
    assert set(SOURCES) == {"sync", "ahead"}
    assert (SOURCES["ahead"].off_policy, SOURCES["sync"].off_policy) == (True, False)
    assert set(SAMPLERS) == {"engine", "group_seeded", "tools", "raw_prompts", "ray", "server_ahead", "thread"}


def test_the_scheduler_dispatches_without_mode_branches():
    # no if / conditional expression of the scheduler tests a mode: its engine, backend, sampler or a string
    modes = {"engine", "backend", "async_rollouts", "seed_per_group", "dynamic_sampling", "remote", "tool_rollouts"}
    tree = ast.parse(inspect.getsource(scheduler_module))
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            names = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            names |= {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            strings = [n for n in ast.walk(node.test) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            assert not (names & modes) and not strings, ast.unparse(node.test)


def test_every_situation_has_exactly_one_sampler_and_an_overlap_is_refused():
    import itertools

    import pytest

    from grpokit.train.experience.sampler_entry import SamplerEntry, Situation, pick_sampler
    from grpokit.train.experience.samplers import EngineSampler

    flags = ("tool_rollouts", "ray", "raw_prompts", "seeded", "ahead", "server")
    for values in itertools.product([False, True], repeat=len(flags)):
        situation = Situation(**dict(zip(flags, values)))
        assert sum(entry.applies(situation) for entry in SAMPLERS.values()) == 1, situation
    # the precedence the flags encode: Ray over everything, tools over a seeded run, a server ahead over a thread
    assert SAMPLERS["ray"].applies(Situation(tool_rollouts=False, ray=True, seeded=True, ahead=True))
    assert SAMPLERS["tools"].applies(Situation(tool_rollouts=True, seeded=True))
    assert SAMPLERS["server_ahead"].applies(Situation(tool_rollouts=False, ahead=True, server=True))
    overlapping = {**SAMPLERS, "mine": SamplerEntry(EngineSampler, seeded=True)}  # group_seeded serves it too
    with pytest.raises(ValueError, match=r"'group_seeded' .* and 'mine' .*exactly one must"):
        pick_sampler(Situation(tool_rollouts=False, seeded=True), overlapping)


class _Ranked(SingleProcess):
    """A rank of two whose broadcast_object records what it passed and returns ``rank0`` (rank 0's object)."""

    def __init__(self, rank: int, rank0=None):
        super().__init__(rank=rank, world_size=2)
        self.rank0, self.passed = rank0, []

    def broadcast_object(self, obj):
        self.passed.append(obj)
        return obj if self.is_main else self.rank0


class _HistoryPrompts(_Prompts):
    drawn_by_history = True  # a curriculum: only rank 0 holds the history

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail = fail

    def next_indices(self, n):
        if self.fail:
            raise ValueError("curriculum 'mine' gave weights of shape (3,)")
        return super().next_indices(n)


def _ranked_scheduler(procs, prompts):
    scheduler = _scheduler(SyncRollouts(sampler=None))
    scheduler.procs, scheduler.prompts = procs, prompts
    return scheduler


def test_a_curriculum_under_torchrun_draws_on_rank_0_and_the_others_take_its_batch():
    main = _ranked_scheduler(_Ranked(0), _HistoryPrompts())
    assert main._draw() == [0, 1] and main.procs.passed == [[0, 1]]  # rank 0 draws and sends
    other_prompts = _HistoryPrompts()
    other = _ranked_scheduler(_Ranked(1, rank0=[7, 3]), other_prompts)
    assert other._draw() == [7, 3] and other_prompts.next == 0  # rank 1 takes rank 0's batch, draws nothing
    uniform = _ranked_scheduler(_Ranked(1, rank0=[7, 3]), _Prompts())
    assert uniform._draw() == [0, 1] and uniform.procs.passed == []  # the source's own order: every rank draws it


def test_a_failed_draw_on_rank_0_stops_every_rank_with_its_message():
    main = _ranked_scheduler(_Ranked(0), _HistoryPrompts(fail=True))
    with pytest.raises(ValueError, match="gave weights of shape"):
        main._draw()
    message = main.procs.passed[0]
    assert (
        message == "rank 0 could not draw the step's prompts: ValueError: curriculum 'mine' gave weights of shape (3,)"
    )
    other = _ranked_scheduler(_Ranked(1, rank0=message), _HistoryPrompts())
    with pytest.raises(DataError, match="rank 0 could not draw the step's prompts: ValueError"):
        other._draw()
