"""The metric sinks that live in optional packages beside W&B and TensorBoard: MLflow and trackio, under TRL's
``report_to`` names (``mlflow``, ``trackio``). Each package is imported only when its sink is asked for (``pip
install 'grpokit[mlflow]'`` / ``'grpokit[trackio]'``), with one error line naming the extra when it is missing.

- MLflow: a run in ``MLFLOW_TRACKING_URI`` (unset: a local file store in RUN/mlruns, which MLflow 3 keeps in
  maintenance mode: grpokit sets ``MLFLOW_ALLOW_FILE_STORE=true`` for it; a server or ``sqlite:///...`` URI, which
  needs the full ``mlflow`` package, is used as given), experiment
  ``MLFLOW_EXPERIMENT_NAME`` (unset: grpokit), named after the run; the resolved config as its params (flattened,
  ``section.key``), each step's metrics (names made MLflow-safe: ``eval/pass@1`` -> ``eval/pass_at_1``).
- trackio: local mode (a SQLite file in ``TRACKIO_DIR``, default ~/.cache/huggingface/trackio; ``TRACKIO_SPACE_ID``
  sends it to a Space), project ``TRACKIO_PROJECT`` (unset: grpokit), the run's name, the config; each step's metrics,
  and with ``log_completions`` the completions table (train/completions_table.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_MLFLOW_UNSAFE = re.compile(r"[^\w./\- :]")  # MLflow refuses other characters in a metric or param name
MLFLOW_PARAMS_PER_CALL = 100  # MLflow's limit of params in one call
MLFLOW_VALUE_CHARS = 500  # a param value is cut to this (MLflow's limit is larger; the config file holds all)


def _missing(sink: str) -> ImportError:
    return ImportError(f"report_to includes {sink} but it is not installed: pip install 'grpokit[{sink}]'.")


def mlflow_name(name: str) -> str:
    """``name`` as MLflow accepts it: ``@`` as ``_at_``, any other character it refuses as ``_``."""
    return _MLFLOW_UNSAFE.sub("_", name.replace("@", "_at_"))


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: the config as MLflow params (values cut to MLFLOW_VALUE_CHARS)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flatten(value, f"{name}.")
        else:
            out[mlflow_name(name)] = str(value)[:MLFLOW_VALUE_CHARS]
    return out


class MLflowSink:
    """One MLflow run for a training run: started here, metrics logged by step, ended by :meth:`close`."""

    def __init__(self, run_dir: Path, config: dict, run_name: str):
        try:
            import mlflow
        except ImportError:
            raise _missing("mlflow") from None
        self._mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # the run folder's own file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses it unless told
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or "grpokit")
        self.run = mlflow.start_run(run_name=run_name)
        params = list(flatten(config).items())
        for start in range(0, len(params), MLFLOW_PARAMS_PER_CALL):
            mlflow.log_params(dict(params[start : start + MLFLOW_PARAMS_PER_CALL]))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_name(k): v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class TrackioSink:
    """One trackio run for a training run: ``trackio.init``, ``trackio.log`` by step, ``trackio.finish``."""

    def __init__(self, config: dict, run_name: str):
        try:
            import trackio
        except ImportError:
            raise _missing("trackio") from None
        self._trackio = trackio
        trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or "grpokit",
            name=run_name,
            space_id=os.environ.get("TRACKIO_SPACE_ID") or None,
            config=config,
            resume="allow",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._trackio.log(metrics, step=step)

    def log_table(self, columns: list[str], rows: list[list], step: int) -> None:
        """The completions table (train/completions_table.py), as ``trackio.Table`` with ``trackio.Image`` cells."""
        from grpokit.train.completions_table import TABLE_KEY, tracker_table

        self._trackio.log({TABLE_KEY: tracker_table(self._trackio, columns, rows)}, step=step)

    def close(self) -> None:
        self._trackio.finish()


def optional_sinks(sinks: set[str], run_dir: Path, config: dict, run_name: str) -> list:
    """The MLflow and trackio sinks named in ``sinks`` (report_to), started."""
    out: list = []
    if "mlflow" in sinks:
        out.append(MLflowSink(run_dir, config, run_name))
    if "trackio" in sinks:
        out.append(TrackioSink(config, run_name))
    return out
