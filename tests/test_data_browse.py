"""`ssd data browse`: one self-contained page with thumbnails and boxes, the flagged images first, class counts and
box histograms; --augmented shows the trainer's own batches; rendered in headless Chromium when installed."""

import shutil
import subprocess

import pytest

from builders import TINY_TRAIN
from ssd.cli import main
from ssd.data.commands.browse import browse_dataset
from ssd.data.commands.browse_page import histogram
from ssd.errors import OutputError
from ssd.training.config import TrainConfig
from ssd.training.preview import training_batches
from test_data_convert import _voc


def test_histogram_bins_by_hand():
    assert histogram([0.0, 0.05, 0.1, 0.55, 1.0, 7.0, -1.0], 0, 1, 4) == [4, 0, 1, 2]


@pytest.fixture
def page(tmp_path):
    voc = _voc(tmp_path / "src")
    (voc / "JPEGImages" / "c.jpg").write_bytes(b"not a jpeg")  # flagged by the check: shown first
    return voc, browse_dataset(voc, tmp_path / "page.html")


def test_page_lists_flagged_images_first_with_boxes_and_counts(page):
    voc, path = page
    html = path.read_text(encoding="utf-8")
    assert "src=\"http" not in html and "src=\"file" not in html  # self-contained
    assert html.count('<figure class="thumb') == 4 and html.count('<rect class="box"') == 3
    first = html.index('<figure class="thumb')
    assert html.startswith('<figure class="thumb flagged"', first) and "c.jpg" in html[first:first + 4000]
    # c.jpg's object is on no image that reads
    assert "<tr><td>élan</td><td>1</td><td>1</td>" in html and "<tr><td>zebra</td><td>2</td><td>2</td>" in html
    assert "2 image(s) flagged by ssd check" in html and 'id="augmented"' not in html
    with pytest.raises(OutputError):
        browse_dataset(voc, voc / "JPEGImages" / "a.jpg")


def test_augmented_batches_are_the_trainers(tmp_path):
    voc = _voc(tmp_path / "src")
    config = TrainConfig(data=str(voc), **{**TINY_TRAIN, "batch_size": 2, "augment": "ssd"})
    batches, names, _, _ = training_batches(config, voc, 1)
    assert names == ["élan", "zebra"] and list(batches[0]["images"].shape) == [2, 3, 64, 64]
    config.to_yaml(tmp_path / "train.yaml")
    assert main(["data", "browse", str(voc), "--output", str(tmp_path / "aug.html"), "--augmented", "--config",
                 str(tmp_path / "train.yaml"), "--batches", "1"]) == 0
    html = (tmp_path / "aug.html").read_text(encoding="utf-8")
    assert html.count('<figure class="batch') == 2


def test_page_renders_in_headless_chromium(page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}/c",
                          "--dump-dom", page[1].as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert '<p id="browse-ready">4 thumbnails, 2 flagged, 3 boxes, 0 augmented images</p>' in dom
