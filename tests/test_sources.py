"""``ssd predict``'s front end against hostile but realistic use: outputs never overwrite inputs, out-of-range options
are named, output folders are incremented, equal file names from different folders stay apart, unreadable inputs are
skipped (exit 1 when none is readable), a run directory is accepted as weights, and COCO output carries the dataset's
category ids."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from builders import biased_model, random_images
from ssd.cli import main
from ssd.data.images import read_image
from ssd.errors import CheckpointError, GlobLimitError
from ssd.export.onnx import export_onnx
from ssd.inference.detector import load
from ssd.inference.sources import output_paths, predict_source, resolve_source
from ssd.schemas import PredictConfig
from ssd.weights.checkpoint import save_checkpoint
from ssd.weights.resolve import resolve_weights

OPTS = dict(score_threshold=0.3, iou_threshold=0.45, max_detections=20)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", biased_model("ssd_tiny"))


def make_images(folder: Path, names: list[str], seed: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, image in zip(names, random_images(len(names), seed=seed)):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / name)
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_save_dir_equal_to_the_source_never_overwrites_inputs(weights, tmp_path, capsys):
    source = make_images(tmp_path / "images", ["a.png", "b.png"])
    before = snapshot(source)
    detector = load(weights)
    with pytest.raises(ValueError, match=r"--save-dir output .*images/a\.png is the input .*images/a\.png \(the same "
                                         r"file\); choose another --save-dir output so the input is kept"):
        predict_source(PredictConfig(source=source, save_dir=source, exist_ok=True), detector, progress=False)
    assert snapshot(source) == before

    summary = predict_source(PredictConfig(source=source, save_dir=source),
                             detector, progress=False)  # without exist_ok: a fresh folder
    assert summary.save_dir == tmp_path / "images2" and (tmp_path / "images2" / "a.png").is_file()
    assert snapshot(source) == before

    previous = snapshot(summary.save_dir)  # a re-run on the previous output folder: its files are never inputs
    with pytest.raises(FileNotFoundError, match=r"no inputs in .*images2 outside save folders of ssd predict"):
        predict_source(PredictConfig(source=summary.save_dir, save_dir=summary.save_dir, exist_ok=True),
                       detector, progress=False)
    assert snapshot(summary.save_dir) == previous

    args = ["predict", "--weights", str(weights), "--source", str(source), "--save-dir", str(source), "--exist-ok"]
    assert main(args) == 1
    assert "(the same file)" in capsys.readouterr().err
    assert snapshot(source) == before


def test_save_dir_is_incremented_like_training_runs(weights, tmp_path):
    source = make_images(tmp_path / "images", ["a.png"])
    detector = load(weights)
    runs = [predict_source(PredictConfig(source=source, save_dir=tmp_path / "predict", **OPTS),
                           detector, progress=False) for _ in range(2)]
    again = predict_source(PredictConfig(source=source, save_dir=tmp_path / "predict", exist_ok=True, **OPTS),
                           detector, progress=False)
    assert [r.save_dir for r in (*runs, again)] == [tmp_path / "predict", tmp_path / "predict2", tmp_path / "predict"]
    assert sorted(p.name for p in (tmp_path / "predict2").iterdir()) == [".ssd-predict", "a.png", "predictions.json",
                                                                          "predictions.jsonl"]


def test_glob_over_folders_with_equal_names_keeps_sub_paths(weights, tmp_path):
    make_images(tmp_path / "src" / "a", ["x.png"], seed=1)
    make_images(tmp_path / "src" / "b", ["x.png"], seed=2)
    summary = predict_source(PredictConfig(weights=weights, source=str(tmp_path / "src" / "*" / "x.png"),
                                           save_dir=tmp_path / "out", **OPTS), progress=False)
    assert summary.images == 2
    first, second = tmp_path / "out" / "a" / "x.png", tmp_path / "out" / "b" / "x.png"
    assert first.is_file() and second.is_file() and first.read_bytes() != second.read_bytes()
    files = [entry["file"] for entry in json.loads(summary.results_file.read_text())["images"]]
    assert files == [str(tmp_path / "src" / "a" / "x.png"), str(tmp_path / "src" / "b" / "x.png")]


def test_recursive_glob_over_a_folder_with_two_self_links_follows_each_once(tmp_path):
    make_images(tmp_path / "src", ["x.png"])
    make_images(tmp_path / "src" / "sub", ["y.png"])
    (tmp_path / "src" / "self1").symlink_to(".")  # glob.glob would list about 2**40 paths here
    (tmp_path / "src" / "self2").symlink_to(".")
    (tmp_path / "src" / "sub" / "up").symlink_to("..")
    assert resolve_source(str(tmp_path / "src" / "**" / "*.png")) == [tmp_path / "src" / "sub" / "y.png",
                                                                      tmp_path / "src" / "x.png"]


def test_glob_matching_more_paths_than_the_bound_is_one_error(weights, tmp_path, monkeypatch, capsys):
    from ssd.inference import globs

    make_images(tmp_path / "src", ["a.png", "b.png", "c.png"])
    assert sorted(globs.expand_glob(str(tmp_path / "src" / "*.png"), limit=3)) == sorted(
        (tmp_path / "src").glob("*.png"))
    with pytest.raises(GlobLimitError, match=r"glob .*\*\.png matches more than 2 paths "
                                                   r"\(ssd.limits.MAX_GLOB_PATHS\): give a narrower pattern, or a "
                                                   r"folder"):
        globs.expand_glob(str(tmp_path / "src" / "*.png"), limit=2)
    monkeypatch.setattr(globs.expand_glob, "__defaults__", (2,))  # limit=MAX_GLOB_PATHS
    assert main(["predict", "--weights", str(weights), "--source", str(tmp_path / "src" / "*.png"), "--save-dir",
                 str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith(f"error: glob {tmp_path / 'src' / '*.png'} matches more than 2 paths")
    assert not (tmp_path / "out").exists()


def test_output_paths_keep_every_input_apart():
    files = [Path("/d/clip.avi"), Path("/d/clip.mkv"), Path("/d/clip.mp4"), Path("/d/x/img.png"), Path("/d/y/img.png")]
    plan = output_paths(files, Path("/out"))
    assert [str(plan[f]) for f in files] == ["/out/clip.avi", "/out/clip_2.avi", "/out/clip_3.avi", "/out/x/img.png",
                                             "/out/y/img.png"]
    assert output_paths([Path("/d/one.jpg")], Path("/out")) == {Path("/d/one.jpg"): Path("/out/one.jpg")}


@pytest.mark.parametrize("option, value, message", [
    ("--conf", "2", "--conf must be a number in [0, 1], got 2.0"),
    ("--conf", "nan", "--conf must be a number in [0, 1], got nan"),
    ("--iou", "-1", "--iou must be a number in [0, 1], got -1.0"),
    ("--iou", "2", "--iou must be a number in [0, 1], got 2.0"),
    ("--max-det", "0", "--max-det must be a positive integer, got 0"),
    ("--batch-size", "0", "--batch-size must be a positive integer, got 0"),
    ("--batch-size", "-1", "--batch-size must be a positive integer, got -1"),
])
def test_out_of_range_options_are_named(option, value, message, tmp_path, capsys):
    assert main(["predict", "--weights", str(tmp_path / "w.pt"), "--source", str(tmp_path), option, value]) == 2
    assert f"error: ssd predict: {message}" in capsys.readouterr().err


def test_library_names_its_own_options(weights, tmp_path):
    """Detector's keywords are named as written; predict_source's options are PredictConfig's, named by their flag
    as the schema names them, before any folder is made."""
    source = make_images(tmp_path / "images", ["a.png"])
    detector = load(weights)
    with pytest.raises(ValueError, match=r"^--batch-size must be a positive integer, got -1$"):
        PredictConfig(source=source, save_dir=tmp_path / "out", batch_size=-1)
    with pytest.raises(ValueError, match=r"^max_detections must be a positive integer, got 0$"):
        detector.predict(source / "a.png", max_detections=0)
    with pytest.raises(ValueError, match=r"^score_threshold must be a number in \[0, 1\], got nan$"):
        detector.predict(source / "a.png", score_threshold=float("nan"))
    assert not (tmp_path / "out").exists()


def test_every_input_unreadable_exits_non_zero(weights, tmp_path, capsys):
    source = tmp_path / "bad"
    source.mkdir()
    (source / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (source / "b.png").write_bytes(b"")
    args = ["predict", "--weights", str(weights), "--source", str(source), "--save-dir", str(tmp_path / "out")]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "error: none of the 2 inputs could be read" in captured.err
    assert f"skipped {source / 'a.jpg'}: cannot read image (OSError: Truncated" in captured.err  # as it happens
    assert "b.png" in captured.out

    make_images(source, ["c.png"])  # one readable input: the run succeeds and lists the others
    assert main([*args[:-1], str(tmp_path / "out2")]) == 0
    assert "skipped 2 unreadable files" in capsys.readouterr().out


def test_run_directory_as_weights(weights, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"cannot load weights from .*run: a folder without weights/best.pt"):
        load(run)
    shutil.copy(weights, run / "weights" / "last.pt")
    assert resolve_weights(run) == run / "weights" / "last.pt"
    shutil.copy(weights, run / "weights" / "best.pt")
    assert resolve_weights(run) == run / "weights" / "best.pt"
    source = make_images(tmp_path / "images", ["a.png"])
    assert main(["predict", "--weights", str(run), "--source", str(source), "--save-dir", str(tmp_path / "o")]) == 0
    assert "1 image," in capsys.readouterr().out


@pytest.mark.slow
def test_coco_output_uses_the_checkpoints_category_ids(tmp_path):
    model = biased_model("ssd_tiny")
    with torch.no_grad():  # box shape a of every location favours class a % 3: every class is detected
        for head in model.heads:
            bias = [m for m in head.cls.modules() if isinstance(m, torch.nn.Conv2d)][-1].bias.view(-1, 4)
            bias[:, 1:] = 0
            bias[torch.arange(len(bias)), 1 + torch.arange(len(bias)) % 3] = 2.0
    with_ids = save_checkpoint(tmp_path / "ids.pt", model, category_ids=[1, 5, 90])
    source = make_images(tmp_path / "images", ["a.png", "b.png", "c.png"])
    options = dict(save_images=False, score_threshold=0.3, iou_threshold=0.45, max_detections=100)
    detector = load(with_ids)
    coco = predict_source(PredictConfig(source=source, save_dir=tmp_path / "coco", fmt="coco", **options), detector,
                          progress=False)
    plain = predict_source(PredictConfig(source=source, save_dir=tmp_path / "json", **options), detector,
                           progress=False)
    labels = [d["label"] for e in json.loads(plain.results_file.read_text())["images"] for d in e["detections"]]
    assert sorted(set(labels)) == [0, 1, 2]
    results = json.loads(coco.results_file.read_text())
    assert [r["category_id"] for r in results] == [[1, 5, 90][label] for label in labels]

    no_ids = load(save_checkpoint(tmp_path / "plain.pt", model))  # without ids: the labels 0..K-1
    summary = predict_source(PredictConfig(source=source, save_dir=tmp_path / "c2", fmt="coco", **options), no_ids,
                             progress=False)
    results = json.loads(summary.results_file.read_text())
    assert [r["category_id"] for r in results] == labels

    onnx_path = export_onnx(with_ids, tmp_path / "ids.onnx", check=False)  # the export carries them
    assert load(onnx_path).card.category_ids == (1, 5, 90)
    with pytest.raises(ValueError, match=r"save_checkpoint: category_ids must be 3 integers \(one per class\), got "
                                         r"\[1, 2\]"):  # refused before anything is written
        save_checkpoint(tmp_path / "bad.pt", model, category_ids=[1, 2])
    assert not (tmp_path / "bad.pt").exists()


def test_folder_source_reads_its_subfolders_sorted_and_mirrors_them(tmp_path):
    source = tmp_path / "photos"
    for name in ["b.png", "a/x.png", "a/deeper/y.jpg", "c/z.png"]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64, 48), (90, 120, 150)).save(source / name)
    (source / "notes.txt").write_text("not an image")
    (source / "a" / "loop1.png").symlink_to("loop2.png")
    (source / "a" / "loop2.png").symlink_to("loop1.png")
    weights = save_checkpoint(tmp_path / "best.pt", biased_model("ssd_tiny"))
    summary = predict_source(PredictConfig(weights=weights, source=source, save_dir=tmp_path / "out"), progress=False)
    assert summary.images == 4
    files = [entry["file"] for entry in json.loads(summary.results_file.read_text())["images"]]
    assert files == [str(source / name) for name in ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]]
    drawn = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*g"))
    assert drawn == ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]
    assert [name for name, _ in summary.skipped] == [str(source / "a" / "loop1.png"), str(source / "a" / "loop2.png")]
    assert all("symbolic links" in reason for _, reason in summary.skipped)


def test_show_draws_images_as_it_draws_video_frames(weights, tmp_path, monkeypatch):
    """Images go through the frame loop of videos and streams: --show shows each drawn image, the one saved."""
    shown = []

    class Window:
        def show(self, name, image):
            shown.append((name, image.clone()))

        def close(self):
            shown.append("closed")

    monkeypatch.setattr("ssd.inference.sources.open_window", Window)
    source = make_images(tmp_path / "images", ["a.png", "b.png", "c.png"])
    summary = predict_source(PredictConfig(weights=weights, source=source, save_dir=tmp_path / "out", show=True,
                                           **OPTS), progress=False)
    assert summary.images == 3 and shown[-1] == "closed"
    assert [name for name, _ in shown[:-1]] == ["images"] * 3
    for (_, image), name in zip(shown[:-1], ["a.png", "b.png", "c.png"]):  # what was shown is what was saved
        assert torch.equal(image, read_image(summary.save_dir / name))
        assert not torch.equal(image, read_image(source / name))  # with its boxes drawn


@pytest.mark.parametrize("source, message", [
    ("99999999999999999999", "error: camera 99999999999999999999 cannot be opened: no such camera"),
    ("²", "error: source ² does not exist (give an image, a folder, a glob or a video file)"),
])
def test_a_camera_index_too_large_or_a_unicode_digit_is_one_error_line(weights, source, message, tmp_path, capsys):
    """OpenCV's camera index is a C int (a larger one raised cv2.error), and "²" is a digit to str.isdigit that int()
    refuses ("invalid literal for int()"): both are one line, and no save folder is left."""
    pytest.importorskip("cv2")
    assert main(["predict", "--weights", str(weights), "--source", source, "--project", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(message) and "Traceback" not in err
    assert not (tmp_path / "p").exists()


def test_dev_stdin_and_a_fifo_named_x_jpg_are_one_line_errors(weights, tmp_path, capsys):
    """/dev/stdin ran the detection and then failed with "unknown image suffix ''"; a FIFO named x.jpg "did not
    exist". Both are refused before any work, saying what they are."""
    import os

    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    stdin_like = tmp_path / "stdin"
    make_images(tmp_path / "img", ["a.png"])
    stdin_like.write_bytes((tmp_path / "img" / "a.png").read_bytes())
    for source, message in ((fifo, f"error: source {fifo} is not a regular file (a FIFO, a device or a socket"),
                            (stdin_like, f"error: source {stdin_like}: no suffix is not an image or video suffix "
                                         "(images: jpg, jpeg, png")):
        assert main(["predict", "--weights", str(weights), "--source", str(source), "--project",
                     str(tmp_path / "p")]) == 1
        assert capsys.readouterr().err.splitlines()[-1].startswith(message)
    assert not (tmp_path / "p").exists()
