"""``ssd predict``'s outputs: the JSONL written as results come and the files assembled from it (JSON, COCO, CSV,
Label Studio), Ctrl-C, save folders never read back, ``--save-txt`` read back as a YOLO dataset, bounded
``--save-crop``, ``--classes``, ``Result.to_supervision``, and files decoded ahead in order."""

import csv
import json
import sys

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from builders import biased_model, random_images
from ssd.cli import main
from ssd.data.images import read_image
from ssd.data.yolo import read_yolo_yaml
from ssd.errors import ConfigError, MissingDependencyError
from ssd.inference.coco_results import to_coco_detections
from ssd.inference.crop_files import class_folders
from ssd.inference.detector import Detector
from ssd.inference.frames import decode_files
from ssd.inference.result_files import write_results
from ssd.inference.results import Result
from ssd.inference.sources import predict_source
from ssd.inference.writers import SAVE_DIR_MARKER, PredictionWriter, read_jsonl
from ssd.schemas import PredictConfig
from ssd.weights.checkpoint import save_checkpoint

OPTS = dict(score_threshold=0.3, iou_threshold=0.45, max_detections=20)


@pytest.fixture(scope="module")
def detector():
    return Detector(biased_model("ssd_tiny"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Four JPEG images (one in a subfolder) and a corrupt one."""
    root = tmp_path_factory.mktemp("images")
    (root / "sub").mkdir()
    for i, image in enumerate(random_images(4)):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(root / ("sub" if i == 3 else ".") / f"img{i}.jpg")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


def image_files(folder):
    return [folder / "img0.jpg", folder / "img1.jpg", folder / "img2.jpg", folder / "sub" / "img3.jpg"]


def test_jsonl_is_written_as_results_come_and_every_format_is_assembled_from_it(detector, folder, tmp_path):
    summary = predict_source(PredictConfig(source=folder, save_dir=tmp_path / "out", **OPTS, batch_size=3,
                                           save_images=False), detector, progress=False)
    out = summary.save_dir
    records = list(read_jsonl(out / "predictions.jsonl"))
    assert [r["file"] for r in records] == [str(f) for f in image_files(folder)]
    expected = detector.predict(image_files(folder), score_threshold=0.3, iou_threshold=0.45, max_detections=20)
    assert records == [json.loads(json.dumps(r.to_dict())) for r in expected]
    assert json.loads((out / "predictions.json").read_text()) == {"class_names": detector.class_names,
                                                                   "images": records}
    assert (out / SAVE_DIR_MARKER).is_file()
    detections = sum(len(r["detections"]) for r in records)
    assert summary.detections == detections > 0

    coco = write_results("coco", read_jsonl(out / "predictions.jsonl"), tmp_path / "coco.json",
                         class_names=detector.class_names, category_ids=[7, 8, 9])
    assert json.loads(coco.read_text()) == to_coco_detections(
        [{"boxes": r.boxes, "scores": r.scores, "labels": r.labels} for r in expected], category_ids=[7, 8, 9])

    table = write_results("csv", iter(records + [{**records[0], "detections": [], "frame": 4}]),
                          tmp_path / "p.csv", class_names=detector.class_names)
    rows = list(csv.DictReader(table.open(newline="")))
    assert len(rows) == detections + 1
    first = records[0]["detections"][0]
    assert rows[0] == {"file": records[0]["file"], "frame": "", "width": "160", "height": "120",
                       "label": str(first["label"]), "name": first["name"], "score": str(first["score"]),
                       **{k: str(v) for k, v in zip(("x1", "y1", "x2", "y2"), first["box"])}}
    assert rows[-1] == {**dict.fromkeys(rows[0], ""), "file": records[0]["file"], "frame": "4", "width": "160",
                        "height": "120"}  # an image without detections keeps its row

    tasks = json.loads(write_results("labelstudio", iter(records), tmp_path / "ls.json",
                                     class_names=detector.class_names, model_version="v1").read_text())
    assert [t["data"] for t in tasks] == [{"image": r["file"]} for r in records]
    [prediction] = tasks[0]["predictions"]
    assert prediction["model_version"] == "v1" and len(prediction["result"]) == len(records[0]["detections"])
    box = prediction["result"][0]
    x1, y1, x2, y2 = first["box"]
    assert box["type"] == "rectanglelabels" and box["score"] == first["score"]
    assert box["value"].pop("rectanglelabels") == [first["name"]]
    assert box["value"] == pytest.approx({"x": x1 / 1.6, "y": y1 / 1.2, "width": (x2 - x1) / 1.6,
                                          "height": (y2 - y1) / 1.2, "rotation": 0}, rel=1e-9)


def test_read_jsonl_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"file": "a"}\n{"file": "b"}\n{"file": "c", "detec')
    assert [r["file"] for r in read_jsonl(path)] == ["a", "b"]


class Interrupted(Detector):
    """Ctrl-C during the second batch."""

    calls = 0

    def detect(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return super().detect(*args, **kwargs)


def test_ctrl_c_leaves_valid_outputs(detector, folder, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        predict_source(PredictConfig(source=folder, save_dir=tmp_path / "out", **OPTS, batch_size=3, save_images=False,
                                     fmt="csv"), Interrupted(detector.backend), progress=False)
    records = list(read_jsonl(tmp_path / "out" / "predictions.jsonl"))  # the first batch: broken.jpg, img0, img1
    assert [r["file"] for r in records] == [str(f) for f in image_files(folder)[:2]]
    rows = list(csv.DictReader((tmp_path / "out" / "predictions.csv").open(newline="")))
    assert len(rows) == sum(len(r["detections"]) for r in records) > 0


def test_a_save_folder_inside_the_source_is_not_read_back(detector, folder, tmp_path, ssd_messages):
    source = tmp_path / "source"
    source.mkdir()
    for file in image_files(folder)[:2]:
        (source / file.name).write_bytes(file.read_bytes())
    first = predict_source(PredictConfig(source=source, save_dir=source / "runs", **OPTS, save_txt=True),
                           detector, progress=False)
    second = predict_source(PredictConfig(source=source, save_dir=source / "runs", **OPTS), detector, progress=False)
    assert first.images == second.images == 2
    assert second.save_dir == source / "runs2"
    assert any(m.startswith(f"not read: {source / 'runs'}, a save folder of ssd predict") for m in ssd_messages())
    with pytest.raises(FileNotFoundError, match="outside save folders of ssd predict"):
        predict_source(PredictConfig(source=source / "runs", save_dir=tmp_path / "elsewhere", **OPTS),
                       detector, progress=False)


def test_save_txt_reads_back_as_the_same_boxes(detector, folder, tmp_path):
    summary = predict_source(PredictConfig(source=folder, save_dir=tmp_path / "out", **OPTS, save_images=False,
                                           save_txt=True), detector, progress=False)
    assert any("read them as a dataset: ssd check" in line for line in summary.notes)
    spec = read_yolo_yaml(summary.save_dir / "yolo" / "data.yaml")
    assert spec.class_names == detector.class_names and not spec.issues
    records = list(read_jsonl(summary.save_dir / "predictions.jsonl"))
    read = spec.records("train")
    assert [r.path.relative_to(summary.save_dir / "yolo" / "images").as_posix() for r in read] == [
        "img0.jpg", "img1.jpg", "img2.jpg", "sub/img3.jpg"]
    assert [r.path.resolve() for r in read] == [f.resolve() for f in image_files(folder)]
    for record, image in zip(records, read):
        assert [o.label for o in image.objects] == [d["label"] for d in record["detections"]]
        np.testing.assert_allclose([o.box for o in image.objects], [d["box"] for d in record["detections"]],
                                   atol=2e-4)  # 6 decimals of a 160 px side

    conf = predict_source(PredictConfig(source=folder, save_dir=tmp_path / "conf", **OPTS, save_images=False,
                                        save_txt=True, save_conf=True), detector, progress=False)
    lines = (conf.save_dir / "yolo" / "labels" / "img0.txt").read_text().splitlines()
    assert [float(line.split()[5]) for line in lines] == pytest.approx(
        [d["score"] for d in records[0]["detections"]], abs=1e-5)
    assert not (conf.save_dir / "yolo" / "data.yaml").exists()
    with pytest.raises(ConfigError, match="--save-conf adds confidences to the labels of --save-txt"):
        PredictConfig(source=folder, save_dir=tmp_path / "bad", **OPTS, save_conf=True)  # before the model runs


def test_video_frames_become_images_of_the_dataset(detector, tmp_path):
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (96, 64))
    for frame in np.random.default_rng(0).integers(0, 256, (3, 64, 96, 3), dtype=np.uint8):
        writer.write(frame)
    writer.release()
    summary = predict_source(PredictConfig(source=video, save_dir=tmp_path / "out", **OPTS, save_images=False,
                                           save_txt=True), detector, progress=False)
    spec = read_yolo_yaml(summary.save_dir / "yolo" / "data.yaml")
    assert [r.path.name for r in spec.records("train")] == [f"clip_{i:06d}.jpg" for i in range(3)]
    assert [r["frame"] for r in read_jsonl(summary.save_dir / "predictions.jsonl")] == [0, 1, 2]


def test_save_crop_is_bounded_and_reports_the_rest(detector, folder, tmp_path, monkeypatch):
    monkeypatch.setattr("ssd.inference.crop_files.MAX_SAVED_CROPS", 12)
    summary = predict_source(PredictConfig(source=image_files(folder)[0], save_dir=tmp_path / "out", **OPTS,
                                           save_images=False, save_crop=True), detector, progress=False)
    [record] = read_jsonl(summary.save_dir / "predictions.jsonl")
    crops = sorted((summary.save_dir / "crops").rglob("*.jpg"))
    assert len(crops) == 12 < len(record["detections"])
    assert f"crops: {len(record['detections']) - 12} more detections not cropped" in str(summary)
    first = record["detections"][0]
    crop = summary.save_dir / "crops" / first["name"] / "img0_0_0.jpg"
    x1, y1, x2, y2 = first["box"]
    assert Image.open(crop).size == (int(np.ceil(x2)) - int(x1), int(np.ceil(y2)) - int(y1))


def test_class_folders_are_safe_and_distinct():
    assert class_folders(["cat", "a/b", "..", "", "Cat", "x\ud800", "é t"]) == [
        "cat", "a_b", "class2", "class3", "Cat_4", "x", "é t"]
    assert class_folders(["A", "a", "a_1", "a/1"]) == ["A", "a_1", "a_1_2", "a_1_3"]  # a suffixed name is taken too
    long = class_folders(["é" * 300, "é" * 300])
    assert long[0] != long[1] and all(len(name.encode()) <= 255 for name in long)


def test_classes_filter_by_name_or_label(detector, folder, tmp_path):
    assert detector.class_indices(["class2", 0, "1"]) == [2, 0, 1] and detector.class_indices(None) is None
    with pytest.raises(ConfigError, match=r"no class 'clas1'; did you mean 'class1'"):
        detector.class_indices(["clas1"])
    with pytest.raises(ConfigError, match=r"label 3 is out of range for the model's 3 classes"):
        detector.class_indices([3])
    options = {**OPTS, "max_detections": 1000}  # the biased model's top 20 are all class0
    [every] = detector.predict(image_files(folder)[0], score_threshold=0.3, iou_threshold=0.45, max_detections=1000)
    summary = predict_source(PredictConfig(source=image_files(folder)[0], save_dir=tmp_path, **options, exist_ok=True,
                                           save_images=False, classes=["class1", 2]), detector, progress=False)
    [record] = read_jsonl(summary.results_file.with_suffix(".jsonl"))
    kept = [box for box, label in zip(every.boxes.tolist(), every.labels.tolist()) if label in (1, 2)]
    assert [d["box"] for d in record["detections"]] == kept and 0 < len(kept) < len(every.labels)


def test_cli_names_unknown_classes(detector, folder, tmp_path, capsys):
    weights = save_checkpoint(tmp_path / "best.pt", detector.backend.model)
    code = main(["predict", "--weights", str(weights), "--source", str(folder), "--save-dir", str(tmp_path / "o"),
                 "--classes", "clas0"])
    assert code == 1 and "no class 'clas0'; did you mean 'class0'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_track_ids_reach_every_format(tmp_path):
    result = Result(torch.tensor([[10.0, 20.0, 30.0, 60.0]]), torch.tensor([0.5]), torch.tensor([1]), ["b"], 100, 80,
                    "a.jpg", track_ids=torch.tensor([7]))
    with PredictionWriter(tmp_path, {}, ["a", "b"], fmt="csv") as writer:
        writer.write(result, torch.zeros(3, 80, 100, dtype=torch.uint8), frame=3)
    [row] = csv.DictReader((tmp_path / "predictions.csv").open(newline=""))
    assert (row["track_id"], row["frame"]) == ("7", "3")
    [task] = json.loads(write_results("labelstudio", read_jsonl(tmp_path / "predictions.jsonl"),
                                      tmp_path / "ls.json", class_names=["a", "b"]).read_text())
    assert task["predictions"][0]["result"][0]["meta"] == {"track_id": 7}


def test_to_supervision(monkeypatch):
    result = Result(torch.tensor([[10.0, 20.0, 30.0, 60.0], [0, 0, 5, 5]]), torch.tensor([0.5, 0.25]),
                    torch.tensor([1, 0]), ["b", "a"], 100, 80, track_ids=torch.tensor([3, -1]))
    detections = result.to_supervision()
    np.testing.assert_array_equal(detections.xyxy, result.boxes.numpy())
    np.testing.assert_array_equal(detections.confidence, [0.5, 0.25])
    assert detections.class_id.tolist() == [1, 0] and detections.tracker_id.tolist() == [3, -1]
    assert detections.data["class_name"].tolist() == ["b", "a"] and len(detections) == 2
    monkeypatch.setitem(sys.modules, "supervision", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'ssd-detect\[supervision\]'"):
        result.to_supervision()


def test_decode_files_keeps_order_and_errors_in_place(folder):
    files = [*image_files(folder)[:2], folder / "broken.jpg", *image_files(folder)[2:]]
    for workers in (0, 2):
        out = list(decode_files(files, workers=workers, ahead=2))
        assert [path for path, _ in out] == files
        assert isinstance(out[2][1], ValueError)
        for (path, image) in out[:2] + out[3:]:
            assert torch.equal(image, read_image(path))
