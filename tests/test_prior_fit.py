"""Fitted default boxes: the fit (ssd.priors.fit), models built with them, the priors file, `ssd check --fit-priors`."""

import json
import math

import pytest
import torch

from builders import TINY_TRAIN, make_dataset
from ssd.cli import main
from ssd.cli.parsers import build_parser, parse
from ssd.models import build_model
from ssd.models.build import default_priors
from ssd.models.load import model_from_checkpoint
from ssd.priors import PRIOR_CONFIGS, PriorConfig
from ssd.priors.coverage import best_iou, coverage
from ssd.priors.fit import FitRules, fit_priors
from ssd.priors.fit_rules import Bounds, Layout
from ssd.priors.fit_search import Scorer, Search
from ssd.priors.io import load_priors, save_priors
from ssd.training.config import TrainConfig
from ssd.training.priors import resolve_priors
from ssd.weights.checkpoint import save_checkpoint

SMALL = PriorConfig(feature_maps=[8, 4], steps=[8, 16], min_sizes=[8, 32], max_sizes=[10, 48],
                    aspect_ratios=[[2], [2]])
"""A 64 px input: level 0 boxes of 8 and 8.9 px (and 2:1), level 1 of 32 and 39 px."""


def squares_at_level0(side: float, **shape) -> torch.Tensor:
    """Boxes ``side`` px wide (``shape``: w, h) centred on the inner 6x6 level-0 centres of SMALL, xyxy / 64."""
    w, h = shape.get("w", side), shape.get("h", side)
    centres = (torch.arange(1, 7) + 0.5) * 8
    cy, cx = (t.flatten() for t in torch.meshgrid(centres, centres, indexing="ij"))
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1) / 64


def random_boxes(count: int, seed: int = 0) -> torch.Tensor:
    """Boxes of log-uniform sizes (2% to 60% of the image) and aspects (1:4 to 4:1) anywhere in the image."""
    g = torch.Generator().manual_seed(seed)
    size = torch.exp(torch.empty(count).uniform_(math.log(0.02), math.log(0.6), generator=g))
    aspect = torch.exp(torch.empty(count).uniform_(math.log(0.25), math.log(4), generator=g))
    w, h = (size * aspect.sqrt()).clamp(max=1), (size / aspect.sqrt()).clamp(max=1)
    x, y = torch.rand(count, generator=g) * (1 - w), torch.rand(count, generator=g) * (1 - h)
    return torch.stack([x, y, x + w, y + h], dim=1)


@pytest.mark.parametrize("clip", [True, False])
def test_nearest_centre_scoring_equals_iou_with_every_default_box(clip):
    # the search scores one default box per shape and level (at the nearest centre); that must be the full answer,
    # also with steps whose last centres pass the image edge (clamped like default_boxes does with clip)
    boxes = random_boxes(400, seed=1)
    config = PriorConfig(feature_maps=[10, 5, 3], steps=[11, 24, 37], min_sizes=[9, 30, 70], max_sizes=[20, 60, 120],
                         aspect_ratios=[[2], [2, 3.5], []], clip=clip)
    scorer = Scorer(boxes.double(), config, 100, 0.5)
    search = Search(scorer, Bounds(FitRules(), config, 100), Layout.of(config))
    torch.testing.assert_close(search.levels.amax(dim=0), best_iou(boxes, config.boxes(100)), atol=2e-6, rtol=0)
    # the ceiling (best IoU any default box of a level could reach) bounds every level's IoU
    assert bool((scorer.ceiling + 1e-6 >= search.levels).all())


def test_known_optimum_all_boxes_covered_after_the_fit():
    boxes = squares_at_level0(20)
    result = fit_priors(boxes, 64, SMALL)
    assert result.before["covered"] == 0.0 and result.after["covered"] == 1.0 and result.changed
    assert result.priors == result.fitted and result.priors.min_sizes[0] == pytest.approx(20, abs=0.5)
    assert result.after["mean_iou"] > 0.99  # the tie-break pulls the boxes onto the objects
    # what the model will use: the same default_boxes function
    assert float(best_iou(boxes, result.priors.boxes(64)).min()) >= 0.5
    assert result.priors.feature_maps == SMALL.feature_maps and result.priors.steps == SMALL.steps
    assert "0.0% -> 100.0%" in result.format_table()


def test_same_seed_same_result():
    boxes = random_boxes(200)
    base = PRIOR_CONFIGS["ssd300"]
    first, second = fit_priors(boxes, 300, base, seed=3), fit_priors(boxes, 300, base, seed=3)
    assert first.changed and first.priors == second.priors and first.after == second.after


def test_fitted_sizes_respect_the_rules_and_keep_boxes_per_location():
    base = PRIOR_CONFIGS["ssd300"]
    result = fit_priors(random_boxes(300, seed=2), 300, base)
    p, rules = result.fitted, FitRules()
    assert result.changed and result.after["covered"] > result.before["covered"]
    assert [len(r) for r in p.aspect_ratios] == [len(r) for r in base.aspect_ratios]
    assert p.feature_maps == base.feature_maps and p.steps == base.steps and p.clip == base.clip
    tol = 1.01  # sizes are rounded to 0.1 px, ratios to 0.01
    for k, (step, low, high) in enumerate(zip(p.steps, p.min_sizes, p.max_sizes)):
        # widened to the defaults where they lie outside (ssd300's last level: 264 px at a 300 px step)
        assert min(rules.stride[0] * step, base.min_sizes[k]) <= low * tol
        assert low <= max(min(rules.stride[1] * step, 300), base.min_sizes[k]) * tol
        assert rules.max_size[0] <= high / low * tol and high / low <= rules.max_size[1] * tol
        assert all(rules.aspect[0] <= r * tol and r <= rules.aspect[1] * tol for r in p.aspect_ratios[k])
    ratios = [b / a for a, b in zip(p.min_sizes, p.min_sizes[1:])]
    assert all(rules.neighbour[0] <= r * tol and r <= rules.neighbour[1] * tol for r in ratios)
    assert list(p.min_sizes) == sorted(set(p.min_sizes))  # strictly increasing with depth


def test_defaults_already_optimal_are_returned_unchanged():
    # the objects are exactly the default boxes of level 0 (inner cells): nothing to gain
    priors = SMALL.boxes(64)[:4 * 64].reshape(8, 8, 4, 4)[1:7, 1:7].reshape(-1, 4)
    boxes = torch.cat([priors[:, :2] - priors[:, 2:] / 2, priors[:, :2] + priors[:, 2:] / 2], dim=1)
    result = fit_priors(boxes, 64, SMALL)
    assert result.before["covered"] == 1.0 and not result.changed and result.priors is SMALL
    assert "already as good" in result.format_table() and "nothing changed" in result.format_table()


def test_ceiling_says_what_no_fit_can_reach():
    # 6 px objects half way between the centres of both levels (at multiples of 16 px): the best default box of any
    # shape reaches IoU 36 / 196 on level 0 (14 px, 4 px off in x and y), less on level 1
    centres = torch.tensor([16.0, 32.0, 48.0])
    cy, cx = (t.flatten() for t in torch.meshgrid(centres, centres, indexing="ij"))
    boxes = torch.stack([cx - 3, cy - 3, cx + 3, cy + 3], dim=1) / 64
    result = fit_priors(boxes, 64, SMALL)
    assert result.ceiling == 0.0 and result.after["covered"] == 0.0 and not result.changed
    assert fit_priors(squares_at_level0(20), 64, SMALL).ceiling == 1.0
    assert "could cover at most 0.0%" in result.format_table()


def test_small_gain_under_min_gain_changes_nothing():
    result = fit_priors(squares_at_level0(20), 64, SMALL, min_gain=1.01)  # gains 100 points, asked for 101
    assert result.after["covered"] == 1.0 and not result.changed and result.priors is SMALL
    assert result.fitted != SMALL and "+100.0%, under the 101.0% needed" in result.format_table()


def test_free_adds_a_needed_ratio_and_drops_useless_ones():
    tall_and_wide = torch.cat([squares_at_level0(0, w=40, h=8), squares_at_level0(0, w=8, h=40)])
    squares_only = PriorConfig(**{**SMALL.to_dict(), "aspect_ratios": [[], []]})
    kept = fit_priors(tall_and_wide, 64, squares_only)
    free = fit_priors(tall_and_wide, 64, squares_only, free=True)
    assert [len(r) for r in kept.fitted.aspect_ratios] == [0, 0] and kept.after["covered"] < 0.5
    assert free.after["covered"] == 1.0 and len(free.priors.aspect_ratios[0]) == 1
    assert free.priors.aspect_ratios[0][0] == pytest.approx(5, rel=0.3)
    # squares need no aspect ratio: each one costs min_gain of coverage and buys nothing
    squares = fit_priors(squares_at_level0(20), 64, SMALL, free=True)
    assert squares.after["covered"] == 1.0 and [len(r) for r in squares.priors.aspect_ratios] == [0, 0]


def test_unusable_boxes_are_left_out_and_no_boxes_is_an_error():
    boxes = torch.cat([squares_at_level0(20), torch.tensor([[0.5, 0.5, 0.5, 0.6], [float("nan"), 0, 1, 1]])])
    assert fit_priors(boxes, 64, SMALL).before["boxes"] == 36
    with pytest.raises(ValueError, match="no boxes to fit"):
        fit_priors(torch.tensor([[0.2, 0.2, 0.2, 0.2]]), 64, SMALL)
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        fit_priors(torch.zeros(3, 2), 64, SMALL)


def test_coverage_buckets_and_mean():
    boxes = torch.tensor([[0.25, 0.25, 0.75, 0.75], [0.0, 0.0, 0.05, 0.05]])
    cov = coverage(boxes, torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    assert cov["covered"] == 0.5 and cov["mean_iou"] == 0.5
    assert [(b["name"], b["boxes"]) for b in cov["by_size"]] == [("small", 1), ("medium", 0), ("large", 1)]


# ------------------------------------------------------------------------------------------ models and files
def test_model_with_custom_priors_saves_reloads_and_predicts(tmp_path):
    from ssd.inference.detector import load

    base = default_priors("ssd_tiny", 128)
    custom = PriorConfig(feature_maps=base.feature_maps, steps=base.steps, min_sizes=[6, 15, 33, 60, 95],
                         max_sizes=[12, 30, 60, 100, 140], aspect_ratios=[[2, 4], [2], [], [3], [2]])
    model = build_model("ssd_tiny", num_classes=2, image_size=128, priors=custom).eval()
    assert model.config.priors == custom
    torch.testing.assert_close(model.priors, custom.boxes(128))
    loc, logits = model(torch.rand(1, 3, 128, 128))
    assert loc.shape[1] == logits.shape[1] == len(model.priors) == 16 * 16 * 6 + 8 * 8 * 4 + 4 * 4 * 2 + 2 * 2 * 4 + 4
    path = save_checkpoint(tmp_path / "custom.pt", model)
    again = model_from_checkpoint(path).eval()
    assert again.config.priors == custom
    torch.testing.assert_close(again.priors, model.priors)
    image = torch.randint(0, 255, (3, 90, 120), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    expected = model.predict([image], score_threshold=0.2, max_detections=20)[0]
    assert len(expected["boxes"]) > 0
    detector = load(path).predict(image, score_threshold=0.2, max_detections=20)[0]  # what `ssd predict` runs
    for got in (again.predict([image], score_threshold=0.2, max_detections=20)[0]["boxes"], detector.boxes):
        torch.testing.assert_close(got, expected["boxes"])


def test_built_priors_must_fit_the_network_and_finetuning_keeps_the_heads(tmp_path):
    base = default_priors("ssd_tiny")
    with pytest.raises(ValueError, match=r"feature maps \[16, 8, 4, 2, 1\] but ssd_tiny at 256 px has "
                                         r"\[32, 16, 8, 4, 2\]"):
        build_model("ssd_tiny", num_classes=1, priors=default_priors("ssd_tiny", 128))
    with pytest.raises(ValueError, match=r"must be an ssd.priors.PriorConfig \(PriorConfig.from_dict reads its "
                                         r"dict\), got dict"):
        build_model("ssd_tiny", num_classes=1, priors=base.to_dict())
    path = save_checkpoint(tmp_path / "tiny.pt", build_model("ssd_tiny", num_classes=1))
    moved = PriorConfig(**{**base.to_dict(), "min_sizes": [12, 30, 60, 100, 170]})
    tuned = model_from_checkpoint(path, priors=moved)
    assert tuned.config.priors == moved
    torch.testing.assert_close(tuned.priors, moved.boxes(256))  # the new boxes, not the saved buffer
    more = PriorConfig(**{**base.to_dict(), "aspect_ratios": [[2, 3]] * 5})
    with pytest.raises(ValueError, match=r"give \[6, 6, 6, 6, 6\] boxes per location but the heads of ssd_tiny at "
                                         r"256 px have \[4, 4, 4, 4, 4\]"):
        model_from_checkpoint(path, priors=more)


def test_priors_file_round_trip_model_check_and_rescaling(tmp_path):
    result = fit_priors(random_boxes(150), 256, default_priors("ssd_tiny"))
    path = save_priors(tmp_path / "p.yaml", result, "ssd_tiny", source="data.yaml")
    assert load_priors(path) == (result.priors, "ssd_tiny", 256)
    assert resolve_priors(None, "ssd_tiny", None, str(path)) == result.priors
    assert resolve_priors(None, "ssd_tiny", 256, None) is None
    scaled = resolve_priors(None, "ssd_tiny", 128, str(path))
    assert scaled.feature_maps == (16, 8, 4, 2, 1) and scaled.steps == default_priors("ssd_tiny", 128).steps
    assert scaled.min_sizes == pytest.approx([s / 2 for s in result.priors.min_sizes])
    assert scaled.aspect_ratios == result.priors.aspect_ratios
    build_model("ssd_tiny", num_classes=1, image_size=128, priors=scaled)
    with pytest.raises(ValueError, match="holds default boxes for ssd_tiny, not ssd300_vgg16"):
        resolve_priors(None, "ssd300_vgg16", None, str(path))
    with pytest.raises(FileNotFoundError, match="--fit-priors"):
        resolve_priors(None, "ssd_tiny", None, str(tmp_path / "missing.yaml"))
    (tmp_path / "bare.yaml").write_text(json.dumps(result.priors.to_dict()))  # only the prior fields
    assert load_priors(tmp_path / "bare.yaml") == (result.priors, None, None)
    (tmp_path / "odd.yaml").write_text("priors: {min_sizes: [1]}\nmodels: x\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['models'\]"):
        load_priors(tmp_path / "odd.yaml")


def test_priors_auto_fits_the_training_boxes(ssd_messages):
    fitted = resolve_priors(random_boxes(150, seed=5), "ssd_tiny", None, "auto")
    logged = ssd_messages()
    assert fitted == fit_priors(random_boxes(150, seed=5), 256, default_priors("ssd_tiny")).priors
    assert "fitted to 150 training boxes: coverage" in logged[0]
    with pytest.raises(ValueError, match="no data"):
        resolve_priors(None, "ssd_tiny", None, "auto")


def test_check_fit_priors_writes_the_file_train_reads(synthetic_voc, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(synthetic_voc), "--model", "ssd_tiny", "--fit-priors", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["prior_fit"]
    assert fit["file"] == "priors.yaml" and fit["before"]["boxes"] == fit["after"]["boxes"] > 0
    priors, model, size = load_priors(tmp_path / "priors.yaml")
    assert priors == PriorConfig.from_dict(fit["priors"]) and (model, size) == ("ssd_tiny", 256)
    # `ssd train --priors priors.yaml` -> TrainConfig.priors -> the same PriorConfig
    args = parse(build_parser(), ["train", "--model", "ssd_tiny", "--priors", "priors.yaml"])
    config = TrainConfig().update(priors=args.priors, model=args.model)
    assert resolve_priors(None, config.model, config.image_size, config.priors) == priors
    out = tmp_path / "sub" / "free.yaml"
    assert main(["check", str(synthetic_voc), "--model", "ssd_tiny", "--fit-priors=free", "--priors-out",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "aspect-ratio sets free" in text and f"written: {out}" in text and out.is_file()


def test_check_fit_priors_needs_a_model(synthetic_voc, capsys):
    assert main(["check", str(synthetic_voc), "--fit-priors"]) == 2
    assert "--fit-priors needs --model NAME" in capsys.readouterr().err


@pytest.mark.slow
def test_train_with_priors_auto_stores_the_fitted_boxes(tmp_path):
    """`ssd train --priors auto`: the run fits the default boxes on its training split and the checkpoint keeps
    them, so loading it needs nothing more."""
    from ssd.models.build import default_priors
    from ssd.models.load import model_from_checkpoint
    from ssd.training.trainer import train

    data = make_dataset("voc", tmp_path / "data", train=16, val=4, size=64, classes=2)
    result = train(data=str(data), epochs=1, priors="auto", project=str(tmp_path / "runs"),
                   **{**TINY_TRAIN, "augment": "ssd"})
    saved = model_from_checkpoint(result.run_dir / "weights" / "last.pt")
    assert saved.config.priors != default_priors("ssd_tiny", 64)
    assert torch.equal(saved.priors, saved.config.priors.boxes(64))


# ---------------------------------------------------------------------------------------- non-square inputs
WIDE = PriorConfig(feature_maps=[(8, 16), (4, 8)], steps=[8, 16], min_sizes=[8, 32], max_sizes=[10, 48],
                   aspect_ratios=[[2], [2]])
"""SMALL's levels on a 64 high, 128 wide input."""


@pytest.mark.parametrize("clip", [True, False])
def test_nearest_centre_scoring_equals_iou_with_every_default_box_non_square(clip):
    # 96 high, 160 wide; maps of rows x cols, steps (step_y, step_x) whose last centres pass the edges
    boxes = random_boxes(400, seed=4)
    config = PriorConfig(feature_maps=[(10, 16), (5, 7), (3, 4)], steps=[(9.6, 10), (19.2, 24.5), (36, 45)],
                         min_sizes=[9, 30, 70], max_sizes=[20, 60, 120], aspect_ratios=[[2], [2, 3.5], []], clip=clip)
    scorer = Scorer(boxes.double(), config, (96, 160), 0.5)
    search = Search(scorer, Bounds(FitRules(), config, (96, 160)), Layout.of(config))
    expected = best_iou(boxes, config.boxes((96, 160)))
    torch.testing.assert_close(search.levels.amax(dim=0), expected, atol=2e-6, rtol=0)
    assert bool((scorer.ceiling + 1e-6 >= search.levels).all())
    # height and width swapped is another set of default boxes, and the scorer sees the difference
    swapped = Search(Scorer(boxes.double(), config, (160, 96), 0.5), Bounds(FitRules(), config, (160, 96)),
                      Layout.of(config))
    assert float((swapped.levels.amax(dim=0) - expected).abs().max()) > 0.1


def test_known_optimum_at_a_non_square_size():
    # 20 x 20 px squares (in pixels of the 64 x 128 input) on the inner level-0 centres of WIDE
    cx, cy = (t.flatten() for t in torch.meshgrid((torch.arange(1, 15) + 0.5) * 8, (torch.arange(1, 7) + 0.5) * 8,
                                                  indexing="xy"))
    boxes = torch.stack([(cx - 10) / 128, (cy - 10) / 64, (cx + 10) / 128, (cy + 10) / 64], dim=1)
    result = fit_priors(boxes, (64, 128), WIDE)
    assert result.image_size == (64, 128) and result.to_dict()["image_size"] == [64, 128]
    assert result.before["covered"] == 0.0 and result.after["covered"] == 1.0 and result.changed
    assert result.priors.min_sizes[0] == pytest.approx(20, abs=0.5) and result.after["mean_iou"] > 0.99
    assert float(best_iou(boxes, result.priors.boxes((64, 128))).min()) >= 0.5
    assert result.priors.feature_maps == WIDE.feature_maps and result.priors.steps == WIDE.steps
    assert fit_priors(boxes, "64x128", WIDE).priors == result.priors
    # the same boxes read as a 128 x 64 input are 40 px wide, 10 px high: not the optimum of square boxes
    assert fit_priors(boxes, (128, 64), WIDE).after["mean_iou"] < 0.9
    assert "at 64x128 px" in result.format_table() and "8x16" in result.format_table()


def test_stride_limits_of_a_non_square_level_use_the_geometric_mean_of_its_steps():
    config = PriorConfig(feature_maps=[(8, 2)], steps=[(8, 32)], min_sizes=[16], max_sizes=[20], aspect_ratios=[[]])
    low, high = Bounds(FitRules(), config, (256, 256)).stride[0]
    assert (math.exp(low), math.exp(high)) == pytest.approx((0.75 * 16, 8 * 16))  # sqrt(8 * 32) = 16 px
    low, high = Bounds(FitRules(), config, (32, 96)).stride[0]  # capped by the longer side of the input
    assert math.exp(high) == pytest.approx(96)


def test_priors_file_round_trip_at_a_non_square_size(tmp_path, ssd_messages):
    result = fit_priors(random_boxes(150), (160, 128), default_priors("ssd_tiny", "160x128"))
    path = save_priors(tmp_path / "p.yaml", result, "ssd_tiny")
    text = path.read_text()
    assert "image_size: 160x128" in text and "ssd train --model ssd_tiny --image-size 160x128 --priors p.yaml" in text
    assert load_priors(path) == (result.priors, "ssd_tiny", (160, 128))
    assert resolve_priors(None, "ssd_tiny", "160x128", str(path)) == result.priors
    assert resolve_priors(None, "ssd_tiny", (160, 128), str(path)) == result.priors
    # read for another size: sizes scale by sqrt(h * w), maps and steps are the network's there
    scaled = resolve_priors(None, "ssd_tiny", 256, str(path))
    logged = ssd_messages()
    assert scaled.feature_maps == default_priors("ssd_tiny").feature_maps
    assert scaled.min_sizes == pytest.approx([s * 256 / math.sqrt(160 * 128) for s in result.priors.min_sizes])
    assert "fitted at 160x128 px" in logged[0] and "for 256 px" in logged[0]
    build_model("ssd_tiny", num_classes=1, image_size="160x128", priors=load_priors(path)[0])
    (tmp_path / "list.yaml").write_text(text.replace("image_size: 160x128", "image_size: [160, 128]"))
    assert load_priors(tmp_path / "list.yaml")[2] == (160, 128)
    (tmp_path / "square.yaml").write_text(text.replace("image_size: 160x128", "image_size: [256, 256]"))
    assert load_priors(tmp_path / "square.yaml")[2] == 256
    (tmp_path / "bad.yaml").write_text(text.replace("image_size: 160x128", "image_size: 160x"))
    with pytest.raises(ValueError, match=r"bad.yaml: image_size=.* is invalid: give N for a square N x N input or HxW"):
        load_priors(tmp_path / "bad.yaml")


@pytest.mark.slow
def test_check_fit_priors_and_train_priors_auto_at_a_non_square_size(synthetic_voc, tmp_path, capsys, monkeypatch):
    from ssd.data.coverage import fit_for_model
    from ssd.data.load import load_dataset
    from ssd.training.trainer import train

    monkeypatch.chdir(tmp_path)
    assert main(["check", str(synthetic_voc), "--model", "ssd_tiny", "--image-size", "160x128", "--fit-priors"]) == 0
    out = capsys.readouterr().out
    assert "default boxes fitted to" in out and "at 160x128 px" in out and "--image-size 160x128 --priors" in out
    priors, model, size = load_priors(tmp_path / "priors.yaml")
    assert (model, size) == ("ssd_tiny", (160, 128)) and priors.feature_maps[0] == (20, 16)
    result = train(data=str(synthetic_voc), epochs=1, priors="auto", project=str(tmp_path / "runs"),
                   **{**TINY_TRAIN, "image_size": "96x64", "batch_size": 16, "augment": "ssd"})
    saved = model_from_checkpoint(result.run_dir / "weights" / "last.pt")
    fitted = fit_for_model(load_dataset(synthetic_voc), "ssd_tiny", (96, 64), seed=TrainConfig().seed)
    assert saved.image_size == (96, 64) and fitted.changed and saved.config.priors == fitted.priors
    assert torch.equal(saved.priors, fitted.priors.boxes((96, 64)))
