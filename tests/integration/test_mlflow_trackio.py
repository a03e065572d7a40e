"""report_to: mlflow and trackio through the CLI on the tiny model.

With the real packages (the mlflow and trackio extras), offline: MLflow's local file store (RUN/mlruns) read back
with MlflowClient, trackio's local mode (a SQLite file in TRACKIO_DIR) read back with its own storage; each is
skipped, naming the extra, where the package is not installed. Always: the same runs against fake modules that
record the real API's calls (mlflow.set_tracking_uri / set_experiment / start_run / log_params / log_metrics /
end_run; trackio.init / log / finish), and the one error line when a package is missing."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
from shared_helpers import tiny_run_config

from grpokit.cli import main


def train(tmp_path, model_dir, sinks: list[str]) -> list[dict]:
    config = tiny_run_config(tmp_path, model_dir, max_steps=2, run={"report_to": ["jsonl", *sinks]})
    assert main(["train", str(config)]) == 0
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def fake_mlflow(calls: list) -> types.ModuleType:
    module = types.ModuleType("mlflow")
    module.set_tracking_uri = lambda uri: calls.append(("set_tracking_uri", uri))
    module.set_experiment = lambda name: calls.append(("set_experiment", name))
    module.start_run = lambda run_name=None: calls.append(("start_run", run_name)) or object()
    module.log_params = lambda params: calls.append(("log_params", dict(params)))
    module.log_metrics = lambda metrics, step=None: calls.append(("log_metrics", dict(metrics), step))
    module.end_run = lambda: calls.append(("end_run",))
    return module


def fake_trackio(calls: list) -> types.ModuleType:
    module = types.ModuleType("trackio")
    module.init = lambda **kwargs: calls.append(("init", kwargs))
    module.log = lambda metrics, step=None: calls.append(("log", dict(metrics), step))
    module.finish = lambda: calls.append(("finish",))
    return module


def test_mlflow_calls_against_its_api(tmp_path, tiny_model_dir, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "mlflow", fake_mlflow(calls))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # set for the run folder's file store: undone after
    lines = train(tmp_path, tiny_model_dir, ["mlflow"])
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    names = [c[0] for c in calls]
    assert names[:3] == ["set_tracking_uri", "set_experiment", "start_run"] and names[-1] == "end_run"
    assert calls[0][1] == (tmp_path / "run" / "mlruns").resolve().as_uri() and calls[1][1] == "grpokit"
    params = {k: v for c in calls if c[0] == "log_params" for k, v in c[1].items()}
    assert params["algo.num_generations"] == "4" and params["optim.max_steps"] == "2"
    logged = {c[2]: c[1] for c in calls if c[0] == "log_metrics"}
    step_lines = {line["step"]: line for line in lines if "loss" in line}
    assert set(step_lines) <= set(logged)
    for step, line in step_lines.items():
        assert logged[step]["loss"] == line["loss"] and logged[step]["reward"] == line["reward"]


def test_trackio_calls_against_its_api(tmp_path, tiny_model_dir, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "trackio", fake_trackio(calls))
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    lines = train(tmp_path, tiny_model_dir, ["trackio"])
    assert calls[0][0] == "init" and calls[-1] == ("finish",)
    init = calls[0][1]
    assert init["project"] == "grpokit" and init["name"] == "run" and init["space_id"] is None
    assert init["config"]["algo"]["num_generations"] == 4
    logged = {c[2]: c[1] for c in calls if c[0] == "log"}
    for line in lines:
        if "loss" in line:
            assert logged[line["step"]]["loss"] == line["loss"]


@pytest.mark.parametrize("sink", ["mlflow", "trackio"])
def test_a_missing_package_is_one_line_naming_the_extra(tmp_path, tiny_model_dir, monkeypatch, capsys, sink):
    monkeypatch.setitem(sys.modules, sink, None)  # import fails as if not installed
    config = tiny_run_config(tmp_path, tiny_model_dir, max_steps=1, run={"report_to": ["jsonl", sink]})
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"report_to includes {sink} but it is not installed: pip install 'grpokit[{sink}]'." in err


def test_real_mlflow_file_store(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the mlflow extra: pip install 'grpokit[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tiny")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    lines = train(tmp_path, tiny_model_dir, ["mlflow"])
    client = MlflowClient(tracking_uri=(tmp_path / "run" / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["algo.num_generations"] == "4"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert history == {line["step"]: line["loss"] for line in lines if "loss" in line}


def test_real_trackio_local_mode(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is imported
    monkeypatch.setenv("TRACKIO_PROJECT", "tiny")
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    if "trackio" in sys.modules and not os.environ.get("GRPOKIT_TEST_FRESH_PROCESS"):
        # trackio reads TRACKIO_DIR when imported, and this process imported it already ("all" sinks): the same
        # test in a fresh process
        import subprocess

        test = f"{__file__}::test_real_trackio_local_mode"
        env = {**os.environ, "GRPOKIT_TEST_FRESH_PROCESS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        return
    pytest.importorskip("trackio", reason="needs the trackio extra: pip install 'grpokit[trackio]'")
    from trackio.sqlite_storage import SQLiteStorage

    lines = train(tmp_path, tiny_model_dir, ["trackio"])
    logs = SQLiteStorage.get_logs(project="tiny", run="run")
    by_step = {row["step"]: row for row in logs if "loss" in row}
    expected = {line["step"]: line["loss"] for line in lines if "loss" in line}
    assert {s: r["loss"] for s, r in by_step.items()} == expected
    assert (tmp_path / "trackio" / "tiny.db").is_file()
