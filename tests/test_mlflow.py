"""``--mlflow``: a training run logged to a real local MLflow file store and read back with MLflow's own client
(every option as a parameter, each epoch's metrics at its step, the model card and the run's files)."""

import json
from pathlib import Path

import pytest

from builders import TINY_TRAIN
from ssd.cli.parsers import build_parser, parse
from ssd.training.config import TrainConfig
from ssd.training.mlflow_log import EXPERIMENT, tracking_uri
from ssd.training.trainer import train


def test_the_option_alone_is_the_local_mlruns_folder_and_a_uri_is_kept():
    assert parse(build_parser(), ["train", "--mlflow"]).mlflow == "mlruns"
    assert parse(build_parser(), ["tune", "--data", "d", "--time", "5", "--mlflow", "http://127.0.0.1:5000"]
                 ).mlflow == "http://127.0.0.1:5000"
    assert tracking_uri("mlruns") == (Path.cwd() / "mlruns").as_uri()
    assert tracking_uri("file:///tmp/store") == "file:///tmp/store"


@pytest.mark.slow
def test_a_run_is_logged_and_read_back_with_mlflows_client(shapes, tmp_path, monkeypatch):
    mlflow_tracking = pytest.importorskip("mlflow.tracking")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the logger sets for a file store, undone after
    uri = (tmp_path / "store").as_uri()
    result = train(TrainConfig(data=str(shapes), epochs=2, project=str(tmp_path), name="run", mlflow=uri,
                               **TINY_TRAIN))
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.tags["ssd.run_dir"] == str(result.run_dir.absolute())
    config = TrainConfig.from_yaml(result.run_dir / "config.yaml").to_dict()
    assert run.data.params == {key: "" if value is None else str(value) for key, value in config.items()}
    assert run.data.params["lr"] == "0.003" and run.data.params["mlflow"] == uri
    history = client.get_metric_history(run.info.run_id, "val/mAP")
    assert [(m.step, m.value) for m in history] == [(row["epoch"], pytest.approx(row["val/mAP"]))
                                                    for row in result.history]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2]
    files = {f.path for f in client.list_artifacts(run.info.run_id)} | {
        f.path for f in client.list_artifacts(run.info.run_id, "weights")}
    assert {"model_card.json", "config.yaml", "results.csv", "results.png", "weights/best.pt"} <= files
    card = json.loads(Path(client.download_artifacts(run.info.run_id, "model_card.json", str(tmp_path))).read_text())
    assert card["model_name"] == "ssd_tiny" and card["image_size"] == 64 and len(card["class_names"]) == 2
