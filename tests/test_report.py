"""`ssd val`'s report: the run directory, metrics.json, the figures, the worst images and report.html in a browser."""

import json
import re
import shutil
import subprocess

import pytest
import torch

from builders import jittered_detections
from ssd.cli import main
from ssd.data import load_dataset
from ssd.evaluation.report import build_report, format_report, worst_images, write_report
from ssd.evaluation.results import ground_truths_from_records
from ssd.inference.coco_results import to_coco_detections
from ssd.models import build_model
from ssd.weights.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def synthetic_report(synthetic_voc, tmp_path_factory):
    spec = load_dataset(synthetic_voc)
    records = spec.splits["val"]
    truths = ground_truths_from_records(records)
    detections = jittered_detections(truths, len(spec.class_names), seed=1)
    for found, record in zip(detections, records):
        found.update(path=str(record.path), image_id=record.image_id)
    report = build_report(detections, truths, spec.class_names, data=str(synthetic_voc), split="val")
    run_dir = tmp_path_factory.mktemp("report")
    page = write_report(report, run_dir, detections, truths, category_ids=[10, 20, 30], worst=4)
    return report, run_dir, page, detections


def test_run_directory_holds_every_number_and_figure(synthetic_report):
    report, run_dir, page, detections = synthetic_report
    assert page == run_dir / "report.html"
    for name in ("metrics.json", "detections.json", "pr_curves.png", "confidence_curves.png", "confusion.png",
                 "confusion_normalized.png"):
        assert (run_dir / name).stat().st_size > 0, name
    metrics = json.loads((run_dir / "metrics.json").read_text(), parse_constant=pytest.fail)  # no NaN
    assert set(metrics["coco"]["stats"]) == {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100",
                                             "ARs", "ARm", "ARl"}
    assert metrics["num_images"] == 16 and metrics["voc"]["map"] == pytest.approx(report["voc"]["map"], abs=1e-6)
    assert set(metrics["errors"]["errors"]) == {"classification", "localization", "both", "duplicate",
                                                "background", "missed"}
    errors = metrics["errors"]["errors"]
    hits = sum(int((types < 2).sum()) for types in report["_per_image"]["detection_type"])  # TP or ignored
    assert hits + sum(v["count"] for k, v in errors.items() if k != "missed") == metrics["num_detections"]
    assert errors["background"]["count"] >= 8  # most random boxes, one per image, hit nothing
    assert len(metrics["confusion"]["counts"]) == 4 and "_per_image" not in metrics
    results = json.loads((run_dir / "detections.json").read_text())
    assert len(results) == sum(len(d["labels"]) for d in detections)
    assert {r["category_id"] for r in results} <= {10, 20, 30}
    assert {r["image_id"] for r in results} == {d["image_id"] for d in detections}
    drawn = sorted(p.name for p in (run_dir / "worst").iterdir())
    assert len(drawn) == len(worst_images(report, 4)) == 4 and drawn[0].startswith("001_")


def test_printed_summary_names_the_best_confidence_and_every_error(synthetic_report):
    report = synthetic_report[0]
    text = format_report(report)
    best = report["operating_point"]["overall"]["best"]
    assert f"best F1 {best['f1']:.3f} at confidence {best['confidence']:.3f}" in text
    for name in ("classification", "localization", "both", "duplicate", "background", "missed", "AR100"):
        assert name in text


def test_an_empty_split_is_refused():
    with pytest.raises(ValueError, match="split val of data.yaml has no images: nothing to evaluate"):
        build_report([], [], ["a"], data="data.yaml", split="val")


def test_a_class_without_objects_is_reported_absent(synthetic_report):
    report = synthetic_report[0]
    truths = [{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "labels": torch.tensor([0]),
               "difficult": torch.tensor([False]), "image_size": (20, 20)}]
    found = [{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "labels": torch.tensor([0]), "scores": torch.tensor([0.9])}]
    small = build_report(found, truths, ["cat", "dog"])
    assert small["absent_classes"] == ["dog"]
    assert small["advice"][0] == ("1 class(es) have no objects in this split and are left out of every mean: dog")
    assert small["operating_point"]["per_class"]["dog"]["absent"] and report["absent_classes"] == []


def test_report_page_renders_in_headless_chromium(synthetic_report, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    page = synthetic_report[2]
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
                          "--allow-file-access-from-files", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'id="report-ready"' in dom  # the page's script ran to its end without an error
    images = 4 + len(list((page.parent / "worst").iterdir()))
    assert f"6 tables, {images} images" in dom
    assert dom.count('<figure data-classes=') == 4 and '<select id="error-filter">' in dom


@pytest.mark.slow
def test_ssd_val_writes_a_new_run_directory_each_time_unless_no_save(synthetic_voc, tmp_path, capsys):
    names = load_dataset(synthetic_voc).class_names
    weights = save_checkpoint(tmp_path / "tiny.pt", build_model("ssd_tiny", class_names=names, image_size=128))
    args = ["val", "--weights", str(weights), "--data", str(synthetic_voc), "--device", "cpu",
            "--project", str(tmp_path / "val")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'val' / 'exp' / 'report.html'}" in out and "best F1" in out
    assert main(args) == 0 and (tmp_path / "val" / "exp2" / "metrics.json").is_file()
    capsys.readouterr()
    assert main([*args, "--name", "quiet", "--no-save"]) == 0
    assert "dAP" in capsys.readouterr().out and not (tmp_path / "val" / "quiet").exists()


def test_ssd_val_scores_a_results_file_and_names_foreign_image_ids(synthetic_voc, synthetic_report, tmp_path,
                                                                   capsys):
    detections = synthetic_report[3]
    results = to_coco_detections(detections)
    path = tmp_path / "detections.json"
    path.write_text(json.dumps(results))
    assert main(["val", "--detections", str(path), "--data", str(synthetic_voc), "--metric", "voc", "--no-save"]) == 0
    out = capsys.readouterr().out
    voc = synthetic_report[0]["voc"]["map"]
    assert re.search(rf"^all +{voc:.4f} ", out, re.MULTILINE)  # the same VOC mAP as scoring the list directly
    path.write_text(json.dumps([{**results[0], "image_id": "not_an_image"}, *results[1:]]))
    assert main(["val", "--detections", str(path), "--data", str(synthetic_voc), "--no-save"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: 1 image id(s) are not images of the split: not_an_image") and \
        "\n" not in err


@pytest.mark.slow
def test_ssd_val_on_an_image_with_a_249_character_name_writes_the_report(synthetic_voc, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(synthetic_voc, data)
    val = (data / "ImageSets" / "Main" / "val.txt").read_text().split()
    for stem in val:  # 249-character stems: legal names, too long for "worst/NNN_<stem>.jpg" as they are
        (data / "JPEGImages" / f"{stem}.jpg").rename(data / "JPEGImages" / f"{'x' * 237}{stem}.jpg")
        (data / "Annotations" / f"{stem}.xml").rename(data / "Annotations" / f"{'x' * 237}{stem}.xml")
    (data / "ImageSets" / "Main" / "val.txt").write_text("".join(f"{'x' * 237}{stem}\n" for stem in val))
    names = load_dataset(data).class_names
    weights = save_checkpoint(tmp_path / "tiny.pt", build_model("ssd_tiny", class_names=names, image_size=128))
    assert main(["val", "--weights", str(weights), "--data", str(data), "--device", "cpu", "--project",
                 str(tmp_path / "val")]) == 0
    run = tmp_path / "val" / "exp"
    cut = [p.name for p in (run / "worst").iterdir()]
    assert cut and all(len(n) == 255 and re.fullmatch(r"\d{3}_x+~[0-9a-f]{12}\.jpg", n) for n in cut)
    assert all(f"worst/{name}" in (run / "report.html").read_text() for name in cut)
