"""``ssd predict``'s run folders and output names against a hostile audit: one name per input for every per-image
output, nothing written through a symbolic link, ``--exist-ok`` never mixing two runs, CSV cells no spreadsheet
runs as formulas."""

import csv
import os
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from builders import biased_model, random_images
from ssd.cli import main
from ssd.data.check import check_dataset
from ssd.data.load import load_dataset
from ssd.errors import ConfigError, InputError, OutputError
from ssd.inference.detector import Detector
from ssd.inference.sources import output_paths, predict_source
from ssd.schemas import PredictConfig

OPTS = dict(score_threshold=0.3, iou_threshold=0.45, max_detections=5)


@pytest.fixture(scope="module")
def detector():
    return Detector(biased_model("ssd_tiny"))


def save(folder, names, seed=1):
    folder.mkdir(parents=True, exist_ok=True)
    for name, image in zip(names, random_images(len(names), seed=seed)):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / name)
    return folder


def write_video(path, frames=2, size=64):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 5.0, (size, size))
    for i in range(frames):
        writer.write(np.full((size, size, 3), 40 * i, np.uint8))
    writer.release()


def test_x_jpg_and_x_png_get_a_label_file_each_and_clip_frames_overwrite_no_image(detector, tmp_path):
    """One name rule for every per-image output: x.jpg and x.png shared labels/x.txt, and frame 0 of clip.avi
    overwrote clip_000000.jpg; the summary counted label files that did not exist."""
    source = save(tmp_path / "in", ["x.jpg", "x.png", "clip_000000.jpg"])
    write_video(source / "clip.avi")
    summary = predict_source(PredictConfig(source=source, save_dir=tmp_path / "out", **OPTS, save_txt=True),
                             detector, progress=False)
    labels = tmp_path / "out" / "yolo" / "labels"
    assert sorted(p.name for p in labels.iterdir()) == ["clip_000000.txt", "clip_000000_2.txt", "clip_000001.txt",
                                                       "x.txt", "x_2.txt"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix in (".jpg", ".png", ".avi")) == [
        "clip.avi", "clip_000000_2.jpg", "x.jpg", "x_2.png"]
    assert f"YOLO labels: 5 files in {labels}" in str(summary)


def test_file_names_with_newline_tab_and_cr_give_a_dataset_ssd_check_accepts(detector, tmp_path):
    source = save(tmp_path / "in", ["a\nb.png", "c\td.png", "e\rf.png", "a_b.png"])
    predict_source(PredictConfig(source=source, save_dir=tmp_path / "out", **OPTS, save_txt=True, save_images=False),
                   detector, progress=False)
    images = tmp_path / "out" / "yolo" / "images"
    assert sorted(p.name for p in images.iterdir()) == ["a_b.png", "a_b_2.png", "c_d.png", "e_f.png"]
    spec = load_dataset(tmp_path / "out" / "yolo" / "data.yaml")
    problems = {issue.code for issue in check_dataset(spec).issues if issue.severity == "error"}
    assert problems <= {"class_without_objects"}  # the biased model finds class0 only: no problem with a name


def test_output_names_are_unique_by_stem_whatever_the_order():
    folder = Path("d")
    plan = output_paths([folder / "clip_000007.png", folder / "clip.mkv", folder / "clip.avi"], folder)
    assert [p.name for p in plan.values()] == ["clip_000007_2.png", "clip.avi", "clip_2.avi"]


@pytest.mark.parametrize("link", ["predictions.jsonl", "crops", "yolo"])
def test_a_link_inside_an_earlier_run_folder_is_never_written_through(detector, tmp_path, link, capsys):
    """With --exist-ok, a predictions.jsonl, crops/ or yolo/ link to an outside file or folder was written through
    (and an outside file replaced by a link)."""
    source = save(tmp_path / "in", ["a.png"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside / "keep.txt" if link.endswith(".jsonl") else outside, run / link)
    with pytest.raises(OutputError, match="symbolic link in the save folder|outputs of an earlier run"):
        predict_source(PredictConfig(source=source, save_dir=run, **OPTS, exist_ok=True, save_txt=True, save_crop=True),
                       detector, progress=False)
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"] and (outside / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in run.iterdir()) == [link]  # nothing written


def test_exist_ok_into_an_earlier_run_refuses_to_mix_its_crops_and_copies(detector, tmp_path):
    source = save(tmp_path / "in", ["a.png"])
    first = predict_source(PredictConfig(source=source, save_dir=tmp_path / "run", **OPTS, save_crop=True),
                           detector, progress=False)
    with pytest.raises(OutputError, match=r"run holds outputs of an earlier run that this one would not replace "
                                          r"\(a.png, crops/class0/a_0_0.jpg, crops/class0/a_0_1.jpg, ...\): they "
                                          r"would mix; delete them, or give a new --name \(without --exist-ok\)"):
        predict_source(PredictConfig(source=save(tmp_path / "other", ["b.png"]), save_dir=first.save_dir, **OPTS,
                                     exist_ok=True), detector, progress=False)
    assert sorted(p.name for p in (first.save_dir / "crops").rglob("*.jpg")) == ["a_0_0.jpg", "a_0_1.jpg",
                                                                                 "a_0_2.jpg", "a_0_3.jpg",
                                                                                 "a_0_4.jpg"]
    lean = predict_source(PredictConfig(source=source, save_dir=tmp_path / "lean", **OPTS, save_txt=True),
                          detector, progress=False)
    again = predict_source(PredictConfig(source=source, save_dir=lean.save_dir, **OPTS, exist_ok=True, save_txt=True),
                           detector, progress=False)
    assert again.save_dir == lean.save_dir  # the same inputs again: each of its files replaced, none left over
    with pytest.raises(OutputError, match=r"would not replace \(a.png\)"):  # a drawn copy this run does not write
        predict_source(PredictConfig(source=source, save_dir=lean.save_dir, **OPTS, exist_ok=True, save_txt=True,
                                     save_images=False), detector, progress=False)


def test_csv_cells_a_spreadsheet_would_run_are_escaped(tmp_path, monkeypatch):
    """OWASP: a cell starting with =, +, -, @ (a file or class name) is prefixed with a quote."""
    monkeypatch.chdir(save(tmp_path / "in", ["=cmd.png", "@x.png", "-y.png", "+z.png", "plain.png"]))
    detector = Detector(biased_model("ssd_tiny", class_names=["=HYPERLINK(1)", "-b", "c"]))
    summary = predict_source(PredictConfig(source=".", save_dir=tmp_path / "out", **OPTS, fmt="csv", save_images=False),
                             detector, progress=False)
    with open(summary.results_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({r["file"] for r in rows}) == ["'+z.png", "'-y.png", "'=cmd.png", "'@x.png", "plain.png"]
    assert {r["name"] for r in rows} == {"'=HYPERLINK(1)"}  # the biased model's top class


def test_classes_are_filtered_before_the_max_det_cut_so_a_kept_class_is_never_crowded_out(detector, tmp_path):
    """The biased model's top detections are all class0: --classes class1 --max-det 5 gave no box at all."""
    [image] = random_images(1)
    [every] = detector.predict(image, score_threshold=0.3, iou_threshold=0.45, max_detections=10_000)
    wanted = every.labels == 1
    assert every.labels[:5].tolist() == [0] * 5 and int(wanted.sum()) > 5
    [kept] = detector.detect([image], score_threshold=0.3, iou_threshold=0.45, max_detections=5, classes=[1])
    assert kept.labels.tolist() == [1] * 5
    assert kept.boxes.tolist() == every.boxes[wanted][:5].tolist()
    assert kept.scores.tolist() == every.scores[wanted][:5].tolist()


@pytest.mark.parametrize("value, message", [
    (2**63, "max_detections 9223372036854775808 is above 10000 (limits.MAX_DETECTIONS)"),
    (100_000_000, "max_detections 100000000 is above 10000 (limits.MAX_DETECTIONS)"),
])
def test_a_max_det_of_2_63_or_1e8_is_one_error_in_predict_and_the_api(detector, tmp_path, value, message, capsys):
    """2**63 gave a traceback and a half-made save folder; 10**8 was accepted by predict although export refuses it."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        detector.predict(random_images(1)[0], max_detections=value)
    source = save(tmp_path / "in", ["a.png"])
    code = main(["predict", "--weights", str(tmp_path / "w.pt"), "--source", str(source), "--max-det", str(value),
                 "--project", str(tmp_path / "runs")])
    assert code == 2 and capsys.readouterr().err.endswith(f"--max-det {value} is above 10000 "
                                                          "(limits.MAX_DETECTIONS), the most detections per image "
                                                          "ssd keeps (an exported NMS graph allocates its output "
                                                          "[B, max_det, 6] whatever the image holds)\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("box", [[float("nan"), 0, 4, 4], [5, 0, 4, 4], [0, 0, float("inf"), 4]])
def test_a_nan_box_through_the_api_is_refused_by_the_crop_and_label_writers(box, tmp_path):
    """A NaN box made through the API crashed the crop writer (math.floor of NaN)."""
    import torch

    from ssd.inference.crop_files import CropWriter
    from ssd.inference.results import Result
    from ssd.inference.yolo_labels import YoloLabelWriter

    result = Result(torch.tensor([[0.0, 0, 2, 2], box]), torch.tensor([0.9, 0.8]), torch.tensor([0, 1]),
                    ["a", "b"], 8, 8, "x.png")
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    message = re.escape(f"result of x.png: detection 1, box {[float(v) for v in box]} label 1: a box must be finite")
    with pytest.raises(InputError, match=message):
        CropWriter(tmp_path, ["a", "b"]).write(result, Path("x.png"), image, 0)
    with pytest.raises(InputError, match=message):
        YoloLabelWriter(tmp_path, ["a", "b"]).write(result, Path("x.png"), image, 0)
    assert list(tmp_path.iterdir()) == []


def test_library_use_prints_nothing_on_stdout_or_stderr(detector, tmp_path, capfd):
    """The docs say library use prints nothing but the progress bars asked for: an unreadable input was printed (on
    every rank under torchrun)."""
    source = save(tmp_path / "in", ["a.png"])
    (source / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    earlier = predict_source(PredictConfig(source=source, save_dir=source / "out", **OPTS),
                             detector, progress=False)  # a save folder inside: "not read" is logged
    summary = predict_source(PredictConfig(source=source, save_dir=tmp_path / "out", **OPTS, save_txt=True,
                                           save_crop=True), detector, progress=False)
    assert [name for name, _ in summary.skipped] == [str(source / "broken.jpg")] and earlier.images == 1
    assert capfd.readouterr() == ("", "")


def test_a_torchrun_rank_killed_before_the_merge_leaves_no_part_unmerged(tmp_path, ssd_messages):
    """A killed rank left .rank1/ parts, unmerged lines and no --format file: rank 0, stopped before the merge,
    appends the whole lines of every part that exists and says what is missing."""
    import json

    from ssd.inference.shards import Shard
    from ssd.inference.writers import PredictionWriter, read_jsonl

    record = {"file": "a.png", "width": 8, "height": 8, "detections": []}
    writer = PredictionWriter(tmp_path, {}, ["a"], fmt="json")
    with pytest.raises(KeyboardInterrupt), writer:
        writer._jsonl.write(json.dumps(record) + "\n")
        (tmp_path / ".rank1" / "crops").mkdir(parents=True)
        (tmp_path / ".rank1" / "predictions.jsonl").write_text(
            json.dumps({**record, "file": "b.png"}) + "\n" + json.dumps({**record, "file": "c.png"}) + "\n{\"fi")
        try:
            raise KeyboardInterrupt
        except BaseException:
            Shard(0, 3, 0).salvage(writer)
            raise
    assert [r["file"] for r in read_jsonl(tmp_path / "predictions.jsonl")] == ["a.png", "b.png", "c.png"]
    assert [r["file"] for r in json.loads((tmp_path / "predictions.json").read_text())["images"]] == [
        "a.png", "b.png", "c.png"]
    assert ssd_messages()[-1] == (f"the sharded run stopped before its ranks merged: rank 1's 2 results appended; "
                                  f"rank 1's crops left in {tmp_path / '.rank1' / 'crops'} (never placed); rank 2 "
                                  "wrote no results (its share is missing); the results of a rank that was still "
                                  "predicting end where it stopped")


def test_label_studio_tasks_point_at_files_its_local_storage_serves_and_frames_that_exist(detector, tmp_path):
    """data.image was a local path Label Studio cannot open, and video frames pointed at the .avi."""
    import json
    from urllib.parse import unquote

    source = save(tmp_path / "in", ["a b.png"])
    write_video(source / "clip.avi", frames=2)
    summary = predict_source(PredictConfig(source=source, save_dir=tmp_path / "out", **OPTS, fmt="labelstudio",
                                           ls_root=str(tmp_path)), detector, progress=False)
    images = [task["data"]["image"] for task in json.loads(summary.results_file.read_text())]
    assert images == ["/data/local-files/?d=in/a%20b.png", "/data/local-files/?d=out/frames/clip_000000.jpg",
                      "/data/local-files/?d=out/frames/clip_000001.jpg"]
    assert all((tmp_path / unquote(image.split("?d=")[1])).is_file() for image in images)
    with pytest.raises(ConfigError, match=rf"^--ls-root {source}: {tmp_path / 'out2'} is outside {source}, where "
                                          "Label Studio cannot read it"):
        predict_source(PredictConfig(source=source, save_dir=tmp_path / "out2", **OPTS, fmt="labelstudio",
                                     ls_root=str(source)), detector, progress=False)
    assert not (tmp_path / "out2").exists()


def test_label_studio_tasks_under_a_url_prefix_that_serves_the_current_directory(detector, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    save(tmp_path / "in", ["a.png"])
    summary = predict_source(PredictConfig(source="in", save_dir="out", **OPTS, fmt="labelstudio",
                                           ls_root="http://127.0.0.1:8081/"), detector, progress=False)
    assert [task["data"]["image"] for task in json.loads(summary.results_file.read_text())] == [
        "http://127.0.0.1:8081/in/a.png"]


def test_save_txt_and_label_studio_frames_on_a_live_source_are_capped_as_crops_are(detector, tmp_path, monkeypatch):
    """--save-txt on a live stream wrote forever while crops were capped: frame files stop at the cap, counted."""
    import json

    import ssd.inference.writers as writers

    monkeypatch.setattr(writers, "MAX_SAVED_FRAMES", 2)
    source = tmp_path / "in"
    source.mkdir()
    write_video(source / "clip.avi", frames=3)
    summary = predict_source(PredictConfig(source=source, save_dir=tmp_path / "out", **OPTS, save_txt=True,
                                           fmt="labelstudio", ls_root=str(tmp_path)), detector, progress=False)
    assert sorted(p.name for p in (tmp_path / "out" / "yolo" / "labels").iterdir()) == ["clip_000000.txt",
                                                                                       "clip_000001.txt"]
    assert sorted(p.name for p in (tmp_path / "out" / "frames").iterdir()) == ["clip_000000.jpg", "clip_000001.jpg"]
    assert len(json.loads(summary.results_file.read_text())) == 2 and summary.frames == 3
    assert ("frames: 1 more video or stream frames have no label file or Label Studio image: a run saves at most 2 "
            "(limits.MAX_SAVED_FRAMES; their boxes are in predictions.jsonl)") in str(summary)
