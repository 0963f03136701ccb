"""The last weak cases of the hostile audit: a folder that cannot be listed, links in a loop, YOLO lines glued by a
missing final newline, COCO boxes written as xyxy, and folder sources with subfolders."""

import json

from PIL import Image

from conftest import biased_model
from ssd.inference.pipeline import load
from ssd.inference.sources import predict_source
from ssd.weights.checkpoint import save_checkpoint


def save_image(path, size=(64, 48)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path


def test_folder_source_reads_its_subfolders_sorted_and_mirrors_them(tmp_path):
    source = tmp_path / "photos"
    for name in ["b.png", "a/x.png", "a/deeper/y.jpg", "c/z.png"]:
        save_image(source / name)
    (source / "notes.txt").write_text("not an image")
    (source / "a" / "loop1.png").symlink_to("loop2.png")
    (source / "a" / "loop2.png").symlink_to("loop1.png")
    weights = save_checkpoint(tmp_path / "best.pt", biased_model("ssd_tiny"))
    summary = predict_source(load(weights), source, tmp_path / "out", progress=False)
    assert summary.images == 4
    files = [entry["file"] for entry in json.loads(summary.results_file.read_text())["images"]]
    assert files == [str(source / name) for name in ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]]
    drawn = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*g"))
    assert drawn == ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]
    assert [name for name, _ in summary.skipped] == [str(source / "a" / "loop1.png"), str(source / "a" / "loop2.png")]
    assert all("symbolic links" in reason for _, reason in summary.skipped)
