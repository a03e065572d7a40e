"""mixed_precision auto on a CPU, chosen by measuring: the rule on hand-written rates (no test times anything or
asserts which path is faster here), the cache (atomic, a corrupt file measured again), and the fallbacks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from grpokit.errors import ConfigError
from grpokit.kernels import cpu_precision
from grpokit.kernels.cpu_precision import cache_key, cache_path, choose, cpu_choice, run_compute
from grpokit.kernels.cpu_probe import LEARN_ROWS, MAX_SHAPES, Shape, candidates, effective_rate, matmul_shapes
from grpokit.machine.cpu_caps import CpuCaps

AVX512 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
SHAPES = [Shape(512, 1408, 16), Shape(512, 32_000)]


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The load average the probe sees: below the cores (results kept), whatever this machine's load is; and no
    forced choice or instruction-set cap from the environment (the learning tests are run with each forced)."""
    monkeypatch.setattr(cpu_precision, "_load", lambda: 0.5)
    for env in ("GRPOKIT_CPU_PRECISION", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(env, raising=False)


def caps(flags=AVX512, onednn_bf16=True, forced=None):
    return CpuCaps("x86_64", "Test CPU", frozenset(flags), True, onednn_bf16, "AVX512", forced)


class Rates:
    """A measure_fn returning fixed rates and counting its calls."""

    def __init__(self, learning, sampling):
        self.rates = {"learning": learning, "sampling": sampling}
        self.calls = 0

    def __call__(self, shapes, caps, learn_rows, sample_rows):
        self.calls += 1
        return self.rates


def test_choose_on_hand_written_rates():
    slow_bf16 = choose({"float32": 120.0, "bf16": 77.0})  # the Intel VM: bf16 1.55x slower
    assert slow_bf16.compute == "float32" and slow_bf16.dtype is None
    assert slow_bf16.reason == "bf16 77 GFLOP/s < float32 120: float32"
    fast_bf16 = choose({"float32": 120.0, "bf16": 862.0})  # an EPYC with AVX512-BF16
    assert fast_bf16.compute == "bf16" and fast_bf16.dtype == torch.bfloat16
    assert fast_bf16.reason == "float32 120 GFLOP/s < bf16 862: bf16"
    tie = choose({"float32": 120.0, "bf16": 125.0})  # 125 < 1.05 x 120 = 126: float32 keeps its precision
    assert tie.compute == "float32" and "within 5%" in tie.reason
    assert choose({"float32": 120.0, "bf16": 127.0}).compute == "bf16"  # 127 > 126
    three = choose({"float32": 100.0, "bf16": 290.0, "fp16": 128.0})
    assert three.compute == "bf16" and three.reason == "fp16 128, float32 100 GFLOP/s < bf16 290: bf16"
    assert choose({"float32": 100.0, "fp16": 130.0}).dtype == torch.float16
    assert choose({"float32": 50.0}).compute == "float32"
    with pytest.raises(ValueError, match="lack float32"):
        choose({"bf16": 1.0})


def test_effective_rate_weights_each_shape_by_its_work():
    # work per row: 2x3x1 = 6 and 4x5x2 = 40; times 6 x 0.1 + 40 x 0.02 = 1.4 for 46 -> 46 / 1.4
    assert effective_rate([Shape(2, 3, 1), Shape(4, 5, 2)], [0.1, 0.02]) == pytest.approx(46 / 1.4)
    assert effective_rate([Shape(8, 8, 3)], [0.01]) == pytest.approx(100.0)  # one shape: its own rate


def test_the_models_own_linear_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4), torch.nn.Linear(4, 8))
    assert matmul_shapes(model) == [Shape(4, 8, 2), Shape(8, 4, 1)]  # costliest first
    many = torch.nn.Sequential(*[torch.nn.Linear(i + 1, 2) for i in range(MAX_SHAPES + 3)])
    assert [s.in_features for s in matmul_shapes(many)] == list(range(MAX_SHAPES + 3, 3, -1))
    assert Shape(896, 151_936).timed == (896, 1024)  # the head is timed on a slice of its columns


def test_candidates_follow_the_cpu():
    assert candidates(caps()) == (["float32", "bf16"], ["float32", "bf16"])
    assert candidates(caps(AVX512 | {"avx512_fp16"})) == (["float32", "bf16"], ["float32", "bf16", "fp16"])
    assert candidates(caps({"avx2"}, onednn_bf16=False)) == (["float32"], ["float32"])  # no fp16 learning: no scaler


def test_the_real_probe_times_every_candidate_and_leaves_the_rng_alone():
    """Structure only (which path is faster here is not asserted): a rate per candidate and phase, all positive, and
    the global RNG as it was, so a seeded run samples alike whether the probe ran or read its cache."""
    from grpokit.kernels.cpu_probe import measure
    from grpokit.machine.cpu_caps import cpu_caps

    torch.manual_seed(3)
    before, threads = torch.get_rng_state(), torch.get_num_threads()
    rates = measure([Shape(16, 32, 2), Shape(32, 16)], cpu_caps(), learn_rows=8, sample_rows=4)
    assert torch.equal(torch.get_rng_state(), before) and torch.get_num_threads() == threads  # timed on one, restored
    learning, sampling = candidates(cpu_caps())
    assert list(rates["learning"]) == learning and list(rates["sampling"]) == sampling
    assert all(rate > 0 for phase in rates.values() for rate in phase.values())


def test_measured_once_then_cached_and_reprobed(tmp_path):
    measure = Rates({"float32": 120.0, "bf16": 77.0}, {"float32": 100.0, "bf16": 290.0})
    first = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 1 and first.source.startswith("measured now")
    assert (first.learning.compute, first.sampling.compute) == ("float32", "bf16")  # chosen per phase
    again = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 1 and "cached in" in again.source and again.learning == first.learning
    cpu_choice(SHAPES[:1], caps=caps(), measure_fn=measure, root=tmp_path)  # other shapes: another entry
    assert measure.calls == 2
    measure.rates = {"learning": {"float32": 120.0, "bf16": 862.0}, "sampling": {"float32": 100.0, "bf16": 90.0}}
    reprobed = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path, probe=True)
    assert measure.calls == 3 and (reprobed.learning.compute, reprobed.sampling.compute) == ("bf16", "float32")
    assert cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path).learning.compute == "bf16"


def test_rates_measured_on_a_busy_machine_are_used_but_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_precision, "_load", lambda: 9.0)  # more than any CI machine's cores: busy
    measure = Rates({"float32": 120.0, "bf16": 862.0}, {"float32": 100.0, "bf16": 290.0})
    busy = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert busy.learning.compute == "bf16" and "at a load average of 9.0" in busy.source
    assert "not saved (busier than its cores" in busy.source and not list(tmp_path.rglob("*.json"))
    cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 2  # measured again
    monkeypatch.setattr(cpu_precision, "_load", lambda: 0.5)
    quiet = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 3 and "saved in" in quiet.source and len(list(tmp_path.rglob("*.json"))) == 1


def test_forced_flags_leave_float32_unmeasured(tmp_path, monkeypatch):
    def must_not_run(*args):
        raise AssertionError("measured on a CPU with one path")

    monkeypatch.setenv("GRPOKIT_CPU_CAPS", "avx2")  # as the other capability tests force an AVX2-only CPU
    choice = cpu_choice(SHAPES, measure_fn=must_not_run, root=tmp_path)
    assert choice.learning.compute == choice.sampling.compute == "float32"
    assert choice.source == "not measured" and "no oneDNN bf16 kernels" in choice.learning.reason


def test_a_failing_probe_falls_back_to_the_flags(tmp_path):
    def broken(*args):
        raise RuntimeError("bf16 path needs the cpu support")

    choice = cpu_choice(SHAPES, caps=caps(), measure_fn=broken, root=tmp_path)
    assert choice.learning.compute == "bf16"  # AVX512-BF16 through oneDNN: the flag rule says bf16
    assert choice.learning.reason.startswith("the probe failed (RuntimeError: bf16 path needs the cpu support)")
    no_bf16 = caps(AVX512 - {"avx512_bf16"})  # AVX-512 without bf16 instructions: emulated, float32 by the flags
    assert cpu_choice(SHAPES, caps=no_bf16, measure_fn=broken, root=tmp_path).learning.dtype is None
    assert not list(tmp_path.rglob("*.json"))  # nothing cached from a failed probe


def test_a_corrupt_cache_file_is_named_in_one_line_and_measured_again(tmp_path, capsys):
    path = cache_path(cache_key(SHAPES, caps(), LEARN_ROWS, 32), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"key": {"probe": 1}, "rates": {"learn')  # cut off mid-write by an older, non-atomic writer
    measure = Rates({"float32": 120.0, "bf16": 77.0}, {"float32": 100.0, "bf16": 290.0})
    choice = cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"grpokit: ignoring {path}, not a CPU probe result")
    assert measure.calls == 1 and choice.learning.compute == "float32"
    assert json.loads(path.read_text())["rates"] == measure.rates  # replaced by a whole file
    path.write_text(json.dumps({"key": cache_key(SHAPES, caps(), LEARN_ROWS, 32), "rates": {"learning": {}}}))
    cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 2 and "not a CPU probe result" in capsys.readouterr().err


def test_a_run_killed_while_writing_leaves_the_old_cache(tmp_path):
    old = Rates({"float32": 120.0, "bf16": 77.0}, {"float32": 100.0, "bf16": 290.0})
    cpu_choice(SHAPES, caps=caps(), measure_fn=old, root=tmp_path)
    path = cache_path(cache_key(SHAPES, caps(), LEARN_ROWS, 32), tmp_path)
    before = path.read_text()
    # a process that measures again and is killed (SIGKILL) between writing the new file and renaming it in
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_cpu_precision import SHAPES, Rates, caps
        from grpokit.kernels import cpu_precision
        from grpokit.kernels.cpu_precision import cpu_choice
        cpu_precision._load = lambda: 0.5  # a quiet machine: the result is written (and the writer killed)
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        new = Rates({{"float32": 1.0, "bf16": 2.0}}, {{"float32": 1.0, "bf16": 2.0}})
        cpu_choice(SHAPES, caps=caps(), measure_fn=new, root={str(tmp_path)!r}, probe=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == -9, result.stderr  # killed, as planned
    assert path.read_text() == before  # the old result, whole
    assert len(list(path.parent.iterdir())) == 2  # and the dead writer's temporary file beside it, never read
    again = cpu_choice(SHAPES, caps=caps(), measure_fn=old, root=tmp_path)
    assert old.calls == 1 and "cached in" in again.source


def big_model():
    """A 16.8M-parameter model on the meta device (only its shapes are read)."""
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(4096, 4096))


def test_run_compute_uses_the_measured_choice_only_where_auto_applies(tmp_path):
    cpu = torch.device("cpu")
    measure = Rates({"float32": 120.0, "bf16": 862.0}, {"float32": 100.0, "bf16": 80.0})
    kw = dict(caps=caps(), measure_fn=measure, root=tmp_path)
    auto = run_compute("auto", cpu, big_model(), "auto", **kw)
    assert (auto.learning, auto.sampling) == (torch.bfloat16, None)
    assert "learning: bf16 (float32 120 GFLOP/s < bf16 862: bf16)" in "\n".join(auto.notes)
    vllm = run_compute("auto", cpu, big_model(), "auto", own_sampler=False, **kw)
    assert vllm.sampling == torch.bfloat16  # another engine samples in the learning dtype
    assert measure.calls == 1  # the second read the cache
    small = run_compute("auto", cpu, torch.nn.Linear(8, 8), "auto", **kw)
    assert small.learning is small.sampling is None and "not measured" in small.notes[0]
    for mixed, expected in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("no", None)):
        explicit = run_compute("auto", cpu, big_model(), mixed, **kw)  # obeyed as set
        assert explicit.learning == explicit.sampling == expected
    ranks = run_compute("auto", cpu, big_model(), "auto", world_size=2, **kw)
    assert ranks.learning == ranks.sampling and "2 processes" in ranks.notes[0]
    assert measure.calls == 1


def must_not_measure(*args):
    raise AssertionError("measured although GRPOKIT_CPU_PRECISION forces the choice")


def test_a_forced_choice_replaces_the_probe_at_every_size_and_process_count(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    kw = dict(caps=caps(), measure_fn=must_not_measure, root=tmp_path)
    monkeypatch.setenv("GRPOKIT_CPU_PRECISION", "bf16")
    for model, world_size in ((torch.nn.Linear(8, 8), 1), (big_model(), 1), (big_model(), 2)):
        forced = run_compute("auto", cpu, model, "auto", world_size=world_size, **kw)  # even under the 10M floor
        assert forced.learning == forced.sampling == torch.bfloat16
        assert "learning: bf16 (forced by GRPOKIT_CPU_PRECISION=bf16, not measured)" in "\n".join(forced.notes)
    assert run_compute("auto", cpu, big_model(), "no", **kw).learning is None  # an explicit setting is obeyed
    assert run_compute("float32", cpu, big_model(), "auto", **kw).learning is None  # so is an explicit dtype
    choice = cpu_choice(SHAPES, **kw)  # what `grpokit env` shows
    assert (choice.learning.compute, choice.source) == ("bf16", "not measured (GRPOKIT_CPU_PRECISION is set)")
    monkeypatch.setenv("GRPOKIT_CPU_PRECISION", " Float32/FP16 ")  # learning / sampling
    split = run_compute("auto", cpu, big_model(), "auto", **kw)
    assert (split.learning, split.sampling) == (None, torch.float16)
    vllm = run_compute("auto", cpu, big_model(), "auto", own_sampler=False, **kw)
    assert vllm.learning is vllm.sampling is None  # another engine samples in the learning dtype
    monkeypatch.setenv("GRPOKIT_CPU_PRECISION", "float32")
    assert run_compute("auto", cpu, torch.nn.Linear(8, 8), "auto", **kw).learning is None
    assert not list(tmp_path.rglob("*.json"))  # nothing measured, nothing cached


@pytest.mark.parametrize("value", ["fp16", "bf16/int8", "yes", "bf16/fp16/x"])
def test_a_bad_forced_choice_is_one_line_naming_the_values(tmp_path, monkeypatch, value):
    monkeypatch.setenv("GRPOKIT_CPU_PRECISION", value)  # fp16 learning: a CPU learner has no loss scale
    with pytest.raises(ConfigError) as error:
        run_compute("auto", torch.device("cpu"), big_model(), "auto", caps=caps(), root=tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"GRPOKIT_CPU_PRECISION={value!r} is not a compute choice")
    assert "use float32, bf16, or LEARNING/SAMPLING such as float32/bf16" in message


def test_a_kernel_isa_cap_is_cached_apart(tmp_path, monkeypatch):
    """ONEDNN_MAX_CPU_ISA (e.g. AVX512_CORE_BF16: AVX512-BF16 without AMX) changes the rates: its own cache entry."""
    plain = cache_key(SHAPES, caps(), LEARN_ROWS, 32)
    assert "ONEDNN_MAX_CPU_ISA" not in plain  # unset: the key of a run that never set it
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    capped = cache_key(SHAPES, caps(), LEARN_ROWS, 32)
    assert capped["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16" and cache_path(capped) != cache_path(plain)
    measure = Rates({"float32": 120.0, "bf16": 60.0}, {"float32": 100.0, "bf16": 90.0})
    assert cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path).learning.compute == "float32"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    cpu_choice(SHAPES, caps=caps(), measure_fn=measure, root=tmp_path)
    assert measure.calls == 2  # the uncapped kernels are measured for themselves
