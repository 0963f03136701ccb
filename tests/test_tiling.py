"""Tiled prediction: tile boxes map back to exact image pixels, copies from overlapping tiles merge to one, a box cut
by a tile edge is dropped when the whole object is found elsewhere and kept when it is not, ``auto`` leaves small
images alone, and ``ssd predict`` / ``ssd val`` / ``ssd.evaluate`` take ``--tile``."""

import json

import pytest
import torch
from PIL import Image

from builders import biased_model
from ssd.card import ModelCard
from ssd.cli import main
from ssd.data.synthetic import SHAPE_NAMES
from ssd.evaluation.evaluator import evaluate
from ssd.inference.detector import Detector, load
from ssd.inference.tiling import detect_tiled, tile_shape, tile_windows
from ssd.settings import check_tile
from ssd.sizes import as_hw
from ssd.weights.checkpoint import save_checkpoint

# --- a backend that always detects one fixed box of its input -------------------------------------------------

FIXED = (0.25, 0.125, 0.5, 0.625)  # xyxy normalized to the network input; exact in binary floating point


class FixedBox:
    """A backend (see :mod:`ssd.inference.backends`) with one prior, ``FIXED``, scored as class 1 with zero offsets:
    every crop yields exactly that box in its own normalized coordinates. Records the batch sizes it ran."""

    def __init__(self, image_size):
        x0, y0, x1, y1 = FIXED
        self.priors = torch.tensor([[(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]])
        self.card = ModelCard(None, ("a", "b"), as_hw(image_size), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.1, 0.2))
        self.device = torch.device("cpu")
        self.batches: list[int] = []

    def __call__(self, batch):
        self.batches.append(len(batch))
        logits = torch.tensor([[[-9.0, -9.0, 9.0]]]).expand(len(batch), 1, 3)
        return torch.zeros(len(batch), 1, 4), logits


def rows(boxes) -> list[list[float]]:
    return sorted(boxes.tolist())


def test_windows_are_spread_evenly_and_end_on_the_image_border():
    # 100 high, 230 wide, tiles 60 x 96, overlap >= 20%: rows start at 0, 40; columns at 0, 67, 134 (134 + 96 = 230)
    assert tile_windows((100, 230), (60, 96), 0.2).tolist() == [
        [0, 0, 96, 60], [67, 0, 163, 60], [134, 0, 230, 60], [0, 40, 96, 100], [67, 40, 163, 100], [134, 40, 230, 100]]
    assert tile_windows((50, 400), (50, 100), 0.0).tolist() == [[0, 0, 100, 50], [100, 0, 200, 50], [200, 0, 300, 50],
                                                                [300, 0, 400, 50]]


def test_tile_boxes_map_back_to_exact_image_pixels():
    """Non-square image, tiles and network input; every crop's fixed box lands at its tile's origin + the box scaled
    by the tile's size, the whole image's at the box scaled by the image's; IoU 1 keeps them all apart."""
    backend = FixedBox((48, 64))
    image = torch.zeros(3, 100, 230, dtype=torch.uint8)
    (result,) = Detector(backend).detect([image], tile=(60, 96), tile_overlap=0.2, iou_threshold=1.0,
                                         score_threshold=0.5, batch_size=4)
    tiles = [[x + 24.0, y + 7.5, x + 48.0, y + 37.5] for y in (0, 40) for x in (0, 67, 134)]
    whole = [230 * 0.25, 100 * 0.125, 230 * 0.5, 100 * 0.625]
    assert rows(result.boxes) == sorted([*tiles, whole])
    assert result.names == ["b"] * 7 and (result.width, result.height) == (230, 100)
    assert backend.batches == [4, 3]  # whole image + 6 tiles, 4 crops at a time
    plain = Detector(FixedBox((48, 64))).detect([image], score_threshold=0.5)[0]
    assert plain.boxes.tolist() == [whole]


# --- an oracle that finds painted rectangles in any crop ------------------------------------------------------

# id -> (label, xyxy in a 200 x 300 image)
OBJECTS = {
    1: (0, (70, 60, 90, 80)),  # small: missed by the whole-image pass, whole in four overlapping tiles
    2: (1, (150, 40, 270, 140)),  # large: found by the whole-image pass, cut in every tile
    3: (2, (50, 10, 110, 26)),  # too flat for the whole-image pass, cut in every tile that sees it
    4: (3, (150, 170, 190, 188)),  # whole in tile x 133..233, cut in tile x 67..167, missed by the whole image
}
INPUT = (100, 100)
MIN_SIDE = 10  # network-input pixels


def painted() -> torch.Tensor:
    image = torch.zeros(3, 200, 300, dtype=torch.uint8)
    for index, (_, (x0, y0, x1, y1)) in OBJECTS.items():
        image[0, y0:y1, x0:x1] = index
    return image


def oracle(crops):
    """The box of each object's pixels in each crop when both sides reach ``MIN_SIDE`` network-input pixels once
    the crop is resized to ``INPUT``; score 0.5 + 0.4 x the share of the object visible (0.9 when whole)."""
    found = []
    for crop in crops:
        (h, w), boxes, scores, labels = crop.shape[-2:], [], [], []
        for index, (label, (x0, y0, x1, y1)) in OBJECTS.items():
            ys, xs = (crop[0] == index).nonzero(as_tuple=True)
            if len(xs) == 0:
                continue
            box = [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
            if (box[2] - box[0]) * INPUT[1] / w < MIN_SIDE or (box[3] - box[1]) * INPUT[0] / h < MIN_SIDE:
                continue
            boxes.append(box)
            scores.append(0.5 + 0.4 * len(xs) / ((x1 - x0) * (y1 - y0)))
            labels.append(label)
        found.append({"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                      "scores": torch.tensor(scores), "labels": torch.tensor(labels, dtype=torch.int64)})
    return found


def by_label(result) -> dict[int, list]:
    return {label: (box, round(score, 4)) for box, score, label in
            zip(result["boxes"].tolist(), result["scores"].tolist(), result["labels"].tolist())}


def test_copies_merge_and_cut_boxes_go_only_when_the_whole_object_is_found():
    (result,) = detect_tiled(oracle, [painted()], tile=100, input_size=INPUT, overlap=0.2, max_detections=50)
    assert len(result["labels"]) == 4
    assert by_label(result) == {
        0: ([70, 60, 90, 80], 0.9),  # four identical tile copies -> one
        1: ([150, 40, 270, 140], 0.9),  # the whole-image box; its tile parts (cut) are gone
        2: ([50, 10, 100, 26], round(0.5 + 0.4 * 50 / 60, 4)),  # only parts exist: the larger one is kept
        3: ([150, 170, 190, 188], 0.9),  # whole in the next tile: the part cut at x = 167 is dropped
    }
    assert result["scores"].tolist() == sorted(result["scores"].tolist(), reverse=True)
    (plain,) = oracle([painted()])
    assert plain["labels"].tolist() == [1]  # without tiles only the large object is found


@pytest.mark.parametrize("whole_score, kept", [(0.1, True), (0.9, False)])
def test_a_cut_box_goes_only_for_a_whole_box_with_half_its_score(whole_score, kept):
    """A weak uncut box covering a confident part (score below half of it) is no evidence of the whole object."""
    whole = [{"boxes": torch.tensor([[0.0, 0.0, 150.0, 50.0]]), "scores": torch.tensor([whole_score]),
              "labels": torch.tensor([2])}]
    (result,) = detect_tiled(oracle, [painted()], tile=100, input_size=INPUT, overlap=0.2, whole=whole)
    boxes = [box for box, label in zip(result["boxes"].tolist(), result["labels"].tolist()) if label == 2]
    assert ([50, 10, 100, 26] in boxes) is kept
    assert [0, 0, 150, 50] in boxes
    # ``whole`` replaces the whole-image pass: the large object is found only as parts (kept: nothing covers them)
    large = [box for box, label in zip(result["boxes"].tolist(), result["labels"].tolist()) if label == 1]
    assert large and [150, 40, 270, 140] not in large
    assert all(x0 >= 150 and y0 >= 40 and x1 <= 270 and y1 <= 140 for x0, y0, x1, y1 in large)


def test_max_detections_per_image_keeps_the_best():
    results = detect_tiled(oracle, [painted(), painted()], tile=100, input_size=INPUT, max_detections=3)
    assert [sorted(r["labels"].tolist()) for r in results] == [[0, 1, 3], [0, 1, 3]]  # the 0.9s, not 0.83


def test_auto_tiles_only_images_over_twice_the_input():
    assert tile_shape("auto", (512, 300), (256, 256)) is None  # 2.0x and 1.2x: left alone
    assert tile_shape("auto", (513, 300), (256, 256)) == (256, 256)
    assert tile_shape("auto", (600, 2000), (288, 512)) == (288, 512)  # non-square input: its own shape
    assert tile_shape((400, 400), (300, 380), (256, 256)) is None  # one tile covers the image
    assert tile_shape((256, 256), (300, 100), (256, 256)) == (256, 100)  # clipped to the image
    image = torch.randint(0, 256, (3, 500, 400), dtype=torch.uint8)
    backend = FixedBox(256)
    auto = Detector(backend).predict([image], tile="auto", score_threshold=0.5)
    plain = Detector(FixedBox(256)).predict([image], score_threshold=0.5)
    assert backend.batches == [1]  # the whole image only
    assert auto[0].boxes.tolist() == plain[0].boxes.tolist() == [[100.0, 62.5, 200.0, 312.5]]
    Detector(backend).predict([torch.zeros(3, 600, 400, dtype=torch.uint8)], tile="auto", score_threshold=0.5)
    assert backend.batches[1:] == [7]  # the whole image + 3 x 2 tiles of 256


@pytest.mark.parametrize("tile, overlap, message", [
    ("big", 0.2, r"tile must be 'auto', a side N or 'HxW' \(height x width\) in pixels, each at least 32, got 'big'"),
    (16, 0.2, r"each at least 32, got 16"),
    (100, 1.0, r"tile_overlap must be a number in \[0, 1\) .*got 1.0"),
])
def test_bad_tile_options_are_named(tile, overlap, message):
    with pytest.raises(ValueError, match=message):
        check_tile(tile, overlap)
    with pytest.raises(ValueError, match=message):
        Detector(FixedBox(64)).predict([torch.zeros(3, 64, 64, dtype=torch.uint8)], tile=tile, tile_overlap=overlap)


def test_check_tile_forms():
    assert check_tile(None) is None and check_tile("AUTO") == "auto"
    assert check_tile(300) == (300, 300) and check_tile("512x288") == (512, 288) and check_tile((64, 96)) == (64, 96)


# --- command line and evaluation plumbing ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    model = biased_model("ssd_tiny", class_names=list(SHAPE_NAMES[:3]))
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", model)


@pytest.mark.slow
def test_val_with_tiles(weights, synthetic_voc):
    """128 px images, a 256 px network: a tile larger than the image is plain val to the last digit; 64 px tiles
    add detections from 9 tiles per image and still give a metrics dict."""
    plain = evaluate(weights, synthetic_voc, device="cpu")
    same = evaluate(weights, synthetic_voc, device="cpu", tile=200)
    assert same["map"] == plain["map"] > 0
    for name in SHAPE_NAMES[:3]:
        assert [same["per_class"][name][k] for k in ("ap", "num_gt", "num_det")] == [
            plain["per_class"][name][k] for k in ("ap", "num_gt", "num_det")]
    for got, want in zip(same["detections"], plain["detections"], strict=True):
        assert rows(got["boxes"]) == rows(want["boxes"])
    tiled = evaluate(weights, synthetic_voc, device="cpu", tile=64, tile_overlap=0.25, metric="voc")
    assert tiled["metric"] == "voc" and 0 <= tiled["map"] <= 1 and set(tiled["per_class"]) == set(SHAPE_NAMES[:3])
    assert len(tiled["detections"]) == len(plain["detections"]) == 16
    changed = [rows(t["boxes"]) != rows(p["boxes"]) for t, p in zip(tiled["detections"], plain["detections"])]
    assert all(changed)  # 200 detections per image either way, but not the same ones


def test_cli_val_and_predict_take_tile(weights, tmp_path, capsys, monkeypatch):
    import ssd.evaluation.evaluator
    import ssd.evaluation.report

    calls = []
    per_class = {"a": {"ap": 0.5, "num_gt": 2, "num_det": 3}}
    monkeypatch.setattr(ssd.evaluation.evaluator, "evaluate", lambda *args, **kwargs: calls.append(kwargs) or {
        "map": 0.5, "per_class": per_class, "metric": "voc07", "class_names": ["a"], "report": {}})
    monkeypatch.setattr(ssd.evaluation.report, "format_report", lambda report: "")
    assert main(["val", "--weights", "w.pt", "--data", "d", "--tile", "96x128", "--tile-overlap", "0.1",
                 "--no-save"]) == 0
    assert (calls[0]["tile"], calls[0]["tile_overlap"]) == ((96, 128), 0.1)
    assert main(["val", "--weights", "w.pt", "--data", "d", "--no-save"]) == 0
    assert (calls[1]["tile"], calls[1]["tile_overlap"]) == (None, 0.2)
    assert "mAP: VOC AP@0.5, 2007 11-point" in capsys.readouterr().out
    image = tmp_path / "big.png"
    Image.fromarray(torch.randint(0, 256, (600, 700, 3), dtype=torch.uint8).numpy()).save(image)
    outputs = {}
    for tile in (None, "auto"):
        args = ["predict", "--weights", str(weights), "--source", str(image), "--device", "cpu", "--exist-ok",
                "--save-dir", str(tmp_path / str(tile)), "--no-save-images", "--conf", "0.3"]
        assert main(args + (["--tile", tile] if tile else [])) == 0
        outputs[tile] = json.loads((tmp_path / str(tile) / "predictions.json").read_text())["images"][0]
    assert outputs["auto"]["detections"] != outputs[None]["detections"]
    api = load(weights, device="cpu").predict(str(image), tile="auto", score_threshold=0.3)[0]
    torch.testing.assert_close(torch.tensor([d["box"] for d in outputs["auto"]["detections"]]), api.boxes)


@pytest.mark.parametrize("argv, message", [
    (["--tile", "10"], "ssd predict: --tile must be 'auto', a side N or 'HxW'"),
    (["--tile", "auto", "--tile-overlap", "1.5"], "--tile-overlap must be a number in [0, 1)"),
])
def test_cli_refuses_bad_tile_options(argv, message, weights, tmp_path, capsys):
    assert main(["predict", "--weights", str(weights), "--source", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_tiny_tiles_with_huge_overlap_are_refused_before_allocating():
    from ssd.inference.tiling import tile_windows

    with pytest.raises(ValueError, match=r"^--tile 32x32 with --tile-overlap 0\.999 cuts a 768x1024 image into "
                                         r"713,054,001 tiles, more than 1024 \(ssd\.limits\.MAX_TILES_PER_IMAGE\): use "
                                         r"larger tiles or less overlap$"):
        tile_windows((768, 1024), (32, 32), 0.999)
    assert tile_windows((768, 1024), (256, 256), 0.2).shape == (20, 4)  # 4 rows x 5 columns, as before
