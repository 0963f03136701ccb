"""Run-directory figures are valid PNGs; drawn detections change the pixels of their boxes only; names without glyphs
in any installed font are drawn as indices with a legend, never as empty boxes."""

import contextlib
import csv
import logging
import string
import warnings

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image

import ssd.plots as plots
from ssd.evaluation.metrics import evaluate_voc
from ssd.plots import (
    RESULTS_COLUMNS,
    class_color,
    draw_detections,
    font_for,
    plot_label_stats,
    plot_pr_curves,
    plot_results,
    save_image,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()
        return im.size


def test_plot_results_draws_training_and_validation_losses(tmp_path, figures):
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS)
        writer.writeheader()
        for epoch in range(1, 4):
            validated = epoch > 1
            writer.writerow({"epoch": epoch, "train/loss": 5 / epoch, "train/loc_loss": 2 / epoch,
                             "train/cls_loss": 3 / epoch, "val/loss": 6 / epoch if validated else "",
                             "val/loc_loss": 2.5 / epoch if validated else "",
                             "val/cls_loss": 3.5 / epoch if validated else "", "lr": 0.01,
                             "val/mAP": 0.3 * epoch if validated else "",
                             "val/precision": 0.2 * epoch if validated else "",
                             "val/recall": 0.1 * epoch if validated else "", "time": 10 * epoch})
    width, height = _is_png(plot_results(path, tmp_path / "results.png"))
    assert width > 500 and height > 200
    loss_ax, _, map_ax = figures[0].axes
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    assert list(lines) == ["loss", "val loss", "loc_loss", "val loc_loss", "cls_loss", "val cls_loss"]
    assert list(lines["loss"].get_xdata()) == [1.0, 2.0, 3.0]
    assert list(lines["val loss"].get_xdata()) == [2.0, 3.0]  # the epoch without validation is skipped
    assert list(lines["val loss"].get_ydata()) == [3.0, 2.0] and lines["val loss"].get_linestyle() == "--"
    scores = {line.get_label(): line for line in map_ax.get_lines()}
    assert list(scores) == ["mAP", "precision", "recall"]
    assert list(scores["mAP"].get_ydata()) == [0.6, pytest.approx(0.9)]
    assert list(scores["precision"].get_ydata()) == [0.4, pytest.approx(0.6)]
    assert list(scores["recall"].get_xdata()) == [2.0, 3.0] and list(scores["recall"].get_ydata()) == [
        0.2, pytest.approx(0.3)]


def test_plot_pr_curves_and_label_stats(tmp_path):
    boxes = torch.tensor([[0, 0, 10, 10], [20, 20, 50, 40], [5, 5, 30, 20.0]])
    labels = torch.tensor([0, 1, 1])
    dets = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.3]), "labels": labels}]
    result = evaluate_voc(dets, [{"boxes": boxes[:2], "labels": labels[:2]}], 3, ["a", "b", "c"])
    _is_png(plot_pr_curves(result, ["a", "b", "c"], tmp_path / "pr.png"))
    _is_png(plot_label_stats(boxes, labels, ["a", "b", "c"], tmp_path / "sub" / "labels.png"))
    with pytest.raises(ValueError, match="3 boxes but 2 labels"):
        plot_label_stats(boxes, labels[:2], ["a", "b", "c"], tmp_path / "x.png")


def test_label_stats_count_every_box_and_scatter_a_seeded_sample_of_a_large_split(tmp_path, figures):
    n = plots.MAX_SCATTER_BOXES + 5_000
    sides = torch.arange(n, dtype=torch.float32) % 97 + 1
    boxes = torch.stack([torch.zeros(n), torch.zeros(n), sides, 2 * sides], 1)
    labels = torch.arange(n) % 3
    for _ in range(2):
        plot_label_stats(boxes, labels, ["a", "b", "c"], tmp_path / "labels.png")
    count_ax, size_ax = figures[0].axes
    assert [bar.get_height() for bar in count_ax.patches] == [(n + 2) // 3, (n + 1) // 3, n // 3]
    points = size_ax.collections[0].get_offsets()
    assert len(points) == plots.MAX_SCATTER_BOXES and (points[:, 1] == 2 * points[:, 0]).all()
    assert size_ax.get_title() == f"box sizes ({plots.MAX_SCATTER_BOXES:,} of {n:,} shown)"
    assert np.array_equal(points, figures[1].axes[1].collections[0].get_offsets())  # the same sample every time
    plot_label_stats(boxes[:10], labels[:10], ["a", "b", "c"], tmp_path / "labels.png")
    assert figures[2].axes[1].get_title() == "box sizes" and len(figures[2].axes[1].collections[0].get_offsets()) == 10


def test_class_named_as_broken_mathtext_is_drawn_as_plain_text(tmp_path):
    from ssd.evaluation.figures import plot_confusion

    names = ["$\\frac{a}{$", "$x$"]  # mathtext that fails to parse, and one that would render as math
    boxes = torch.tensor([[0, 0, 10, 10], [20, 20, 50, 40.0]])
    labels = torch.tensor([0, 1])
    result = evaluate_voc([{"boxes": boxes, "scores": torch.tensor([0.9, 0.8]), "labels": labels}],
                          [{"boxes": boxes, "labels": labels}], 2, names)
    _is_png(plot_pr_curves(result, names, tmp_path / "pr.png"))
    _is_png(plot_label_stats(boxes, labels, names, tmp_path / "labels.png"))
    matrix = {"counts": np.eye(3).tolist(), "normalized": np.eye(3).tolist(), "names": [*names, "background"],
              "confidence": 0.5, "match_iou_threshold": 0.5}
    _is_png(plot_confusion(matrix, tmp_path / "confusion.png"))
    assert matplotlib.rcParams["text.parse_math"]  # the caller's own settings are left as they were


def test_draw_detections_changes_pixels_inside_boxes():
    image = torch.full((3, 120, 200), 128, dtype=torch.uint8)
    boxes = torch.tensor([[20.0, 50, 80, 110], [150, 0, 230, 40]])  # the second one runs off the right edge
    out = draw_detections(image, boxes, torch.tensor([0, 1]), torch.tensor([0.9, 0.5]), ["cat", "dog"])
    assert out.dtype == torch.uint8 and out.shape == image.shape
    assert torch.equal(image, torch.full_like(image, 128))  # input untouched
    changed = (out != image).any(dim=0)
    assert changed[50, 20:81].all() and changed[50:111, 20].all()  # the first box's outline
    assert tuple(out[:, 80, 20].tolist()) == class_color(0)
    assert changed[:, 150:].any()  # the clipped box and its label are drawn
    assert not changed[115:, 100:140].any()  # far from both boxes and labels
    assert changed[30:50, 20:60].any() and not changed[:30, :140].any()  # the first label sits just above its box
    empty = draw_detections(image, torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), None, ["cat"])
    assert torch.equal(empty, image)
    with pytest.raises(ValueError, match="uint8 tensor"):
        draw_detections(image.float(), boxes, torch.tensor([0, 1]), None, ["cat", "dog"])


def test_save_image_round_trip(tmp_path):
    image = torch.randint(0, 256, (3, 16, 24), dtype=torch.uint8)
    path = save_image(image, tmp_path / "a" / "b.png")
    assert _is_png(path) == (24, 16)
    np.testing.assert_array_equal(np.asarray(Image.open(path)), image.permute(1, 2, 0).numpy())
    save_image(image, tmp_path / "c.jpg")
    assert Image.open(tmp_path / "c.jpg").size == (24, 16)
    with pytest.raises(ValueError, match="c.png: image must be a uint8 tensor"):
        save_image(image[0], tmp_path / "c.png")


# --- class names without glyphs in the default font (CJK) ------------------------------------------------------------

def _make_font(path, chars, family="SSD Test Glyphs"):
    """A tiny TrueType font whose glyphs (plain blocks) cover exactly ``chars``."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    def block():
        pen = TTGlyphPen(None)
        pen.moveTo((50, 0))
        pen.lineTo((50, 700))
        pen.lineTo((550, 700))
        pen.lineTo((550, 0))
        pen.closePath()
        return pen.glyph()

    glyphs = {f"u{ord(c):04X}": ord(c) for c in sorted(set(chars))}
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder([".notdef", *glyphs])
    builder.setupCharacterMap({code: name for name, code in glyphs.items()})
    builder.setupGlyf({name: block() for name in [".notdef", *glyphs]})
    builder.setupHorizontalMetrics(dict.fromkeys([".notdef", *glyphs], (600, 50)))
    builder.setupHorizontalHeader(ascent=800, descent=-200)
    builder.setupNameTable({"familyName": family, "styleName": "Regular"})
    builder.setupOS2(sTypoAscender=800, sTypoDescender=-200, usWinAscent=800, usWinDescent=200)
    builder.setupPost()
    builder.save(str(path))
    return path


@pytest.fixture
def fonts(monkeypatch):
    """matplotlib's installed-font list reduced to DejaVu (no CJK font, whatever this system has); returns a function
    adding a font file to it."""
    from matplotlib.font_manager import fontManager, ttfFontProperty
    from matplotlib.ft2font import FT2Font

    monkeypatch.setattr(fontManager, "ttflist", [f for f in fontManager.ttflist if "DejaVu" in f.name])

    def add(path):
        monkeypatch.setattr(fontManager, "ttflist", [*fontManager.ttflist, ttfFontProperty(FT2Font(str(path)))])
        return str(path)

    return add


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save, for reading back what they wrote."""
    saved = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out: (saved.append(fig), real(fig, out))[1])
    return saved


@contextlib.contextmanager
def no_font_warnings(caplog):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="matplotlib"):
        warnings.simplefilter("always")
        yield
    assert [str(w.message) for w in caught if "glyph" in str(w.message).lower() or "font" in str(w.message).lower()
            ] == []
    assert caplog.records == []


def _pr_inputs(names):
    boxes = torch.tensor([[0, 0, 10, 10], [20, 20, 50, 40.0]])
    labels = torch.tensor([0, 1])
    dets = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8]), "labels": labels}]
    return boxes, labels, evaluate_voc(dets, [{"boxes": boxes, "labels": labels}], 2, names)


def test_names_no_font_has_are_drawn_as_indices_with_a_legend(tmp_path, fonts, figures, caplog):
    names = ["猫", "dog"]
    assert font_for(["cat 0.90", "é"]) == str(plots._FONT) and font_for(names) is None
    boxes, labels, result = _pr_inputs(names)
    run = tmp_path / "実験"
    run.mkdir()
    with open(run / "results.csv", "w", newline="") as f:
        csv.writer(f).writerows([RESULTS_COLUMNS, [1, 3, 1, 2, 3.5, 1.5, 2, 0.01, 0.5, 0.6, 0.4, 9]])
    with no_font_warnings(caplog):
        _is_png(plot_label_stats(boxes, labels, names, tmp_path / "labels.png"))
        _is_png(plot_pr_curves(result, names, tmp_path / "pr.png"))
        _is_png(plot_results(run / "results.csv", tmp_path / "results.png"))
    stats, pr, _ = (fig.axes[0] for fig in figures)
    assert [t.get_text() for t in stats.get_xticklabels()] == ["0", "1"]
    assert [t.get_text() for t in stats.get_legend().get_texts()] == ["0 = \\u732b", "1 = dog"]
    assert [t.get_text() for t in pr.get_legend().get_texts()] == ["0 = \\u732b 1.000", "1 = dog 1.000"]
    assert figures[2].get_suptitle() == "\\u5b9f\\u9a13"

    image = torch.full((3, 120, 200), 128, dtype=torch.uint8)
    box, score = torch.tensor([[120.0, 60, 190, 110]]), torch.tensor([0.9])
    with no_font_warnings(caplog):
        drawn = draw_detections(image, box, torch.tensor([0]), score, names)
    as_index = draw_detections(image, box, torch.tensor([0]), score, ["0", "dog"])  # the tag reads "0 0.90"
    assert torch.equal(drawn[:, 30:], as_index[:, 30:])  # the same box and tag ...
    assert (drawn[:, :15, :40] != image[:, :15, :40]).any() and torch.equal(as_index[:, :30], image[:, :30])
    assert torch.equal(drawn[:, :30, 100:], image[:, :30, 100:])  # ... plus a legend in the top left corner only


def test_a_font_with_the_glyphs_is_used_when_installed(tmp_path, fonts, figures, caplog):
    names = ["猫", "狗"]
    path = fonts(_make_font(tmp_path / "test.ttf", string.printable.strip() + "".join(names)))
    assert font_for(["猫 0.90", "狗"]) == path
    assert font_for(["猫", "é"]) is None  # one font must have every glyph (the test font has no é)
    boxes, labels, result = _pr_inputs(names)
    with no_font_warnings(caplog):
        plot_label_stats(boxes, labels, names, tmp_path / "labels.png")
        plot_pr_curves(result, names, tmp_path / "pr.png")
    stats, pr = (fig.axes[0] for fig in figures)
    ticks = stats.get_xticklabels()
    assert [t.get_text() for t in ticks] == names and stats.get_legend() is None
    assert ticks[0].get_fontfamily()[0] == "SSD Test Glyphs"
    assert [t.get_text() for t in pr.get_legend().get_texts()] == ["猫 1.000", "狗 1.000"]

    image = torch.full((3, 120, 200), 128, dtype=torch.uint8)
    box, score = torch.tensor([[120.0, 60, 190, 110]]), torch.tensor([0.9])
    with no_font_warnings(caplog):
        drawn = draw_detections(image, box, torch.tensor([0]), score, names)
    assert torch.equal(drawn[:, :30], image[:, :30])  # no legend
    tag = (drawn[:, 40:60, 120:] != image[:, 40:60, 120:]).any(dim=0)
    ascii_tag = (draw_detections(image, box, torch.tensor([0]), score, ["0", "1"])[:, 40:60, 120:]
                 != image[:, 40:60, 120:]).any(dim=0)
    assert tag.any() and not torch.equal(tag, ascii_tag)  # the tag holds the name, drawn in the test font
