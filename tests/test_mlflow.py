"""logger=mlflow with the installed mlflow: a sqlite store in the run folder holding the run's metrics.
Skipped when mlflow is not installed (it is not a dependency: pip install mlflow)."""

import sys

import pytest

from tests.conftest import only_run_dir, run_rlx

mlflow = pytest.importorskip("mlflow")


def test_mlflow_logger_writes_a_sqlite_store_in_the_run_folder(tmp_path):
    result = run_rlx(["train", "logger=mlflow", "steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2",
                      "eval.size=4", "eval.every=2", "rollout.max_new_tokens=8", "save.final=false", "save.plot=false",
                      "hardware.num_threads=1"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    store = run / "mlflow.db"
    assert store.is_file()
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()  # nothing outside the run
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "rlx"]
    (logged,) = client.search_runs([experiment.experiment_id])
    assert logged.info.run_name == run.name
    history = client.get_metric_history(logged.info.run_id, "eval/accuracy")
    assert [m.step for m in history] == [0, 2]
    assert logged.data.params["optim/lr"] == "0.0001"
    print(f"mlflow {mlflow.__version__} on python {sys.version.split()[0]}")
