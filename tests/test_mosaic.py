"""Mosaic augmentation: exact placement on the canvas, the clipping rule, labels and flags following their boxes,
the draws, reproducibility with workers and the image cache, --close-mosaic through training and resume, options."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torchvision import tv_tensors

import ssd
from builders import TINY_TRAIN
from ssd.cli import main
from ssd.data import build_dataloader, load_dataset
from ssd.data.loader import DetectionDataset
from ssd.data.mosaic import Mosaic, close_mosaic_epochs, mosaic_probability
from ssd.errors import ConfigError
from ssd.training.callbacks import Callback, MosaicSchedule
from ssd.training.config import TrainConfig
from ssd.training.trainer import train

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
FILL = [128, 102, 76]  # round(255 * MEAN), as the zoom-out fills


def _sample(value, h, w, boxes, labels, difficult):
    image = torch.full((3, h, w), value, dtype=torch.uint8)
    return image, {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                                     format="XYXY", canvas_size=(h, w)),
                   "labels": torch.tensor(labels, dtype=torch.int64),
                   "difficult": torch.tensor(difficult, dtype=torch.bool)}


# ------------------------------------------------------------------------------------------------- placement
def test_four_images_around_a_fixed_centre_give_the_hand_computed_canvas_and_boxes():
    # S = 10: canvas 20 x 20, centre (cy, cx) = (8, 12). Offsets (left, top): TL (2, -2), TR (12, -2), BL (2, 8),
    # BR (12, 8).
    samples = [_sample(10, 10, 10, [[1, 1, 5, 5]], [0], [False]),
               _sample(20, 10, 10, [[2, 4, 8, 9]], [1], [True]),
               _sample(30, 10, 10, [[0, 0, 10, 10]], [2], [False]),
               _sample(40, 10, 10, [[6, 0, 10, 2]], [3], [True])]
    samples[0][0][:, 2, 0] = 99  # row 2 of the top-left image is the canvas' row 0 (two rows cut off above)
    image, target = Mosaic(10, MEAN).canvas(samples, (8, 12))
    assert isinstance(image, tv_tensors.Image) and image.shape == (3, 20, 20) and image.dtype == torch.uint8
    assert target["boxes"].canvas_size == (20, 20)
    assert target["boxes"].tolist() == [[3, 0, 7, 3], [14, 2, 20, 7], [2, 8, 12, 18], [18, 8, 20, 10]]
    assert target["labels"].tolist() == [0, 1, 2, 3] and target["difficult"].tolist() == [False, True, False, True]
    assert image[:, 0, 0].tolist() == FILL and image[:, 19, 1].tolist() == FILL  # left of x = 2: the mean
    assert image[:, 0, 2].tolist() == [99] * 3 and image[:, 1, 2].tolist() == [10] * 3
    assert image[:, 7, 11].tolist() == [10] * 3 and image[:, 7, 12].tolist() == [20] * 3
    assert image[:, 8, 11].tolist() == [30] * 3 and image[:, 17, 19].tolist() == [40] * 3
    assert image[:, 18, 19].tolist() == FILL  # below y = 18: the mean
    assert (image == 10).all(0).sum() == 10 * 8 - 1 and (image == 40).all(0).sum() == 8 * 10


def test_the_mosaic_is_the_central_window_of_the_canvas_at_the_images_scale():
    # the canvas of the test above, window rows and columns 5..15: boxes shifted by -5, clipped to 0..10, the
    # top-left box (x 3..7, y 0..3) left out (it ends at y 3 < 5)
    samples = [_sample(10, 10, 10, [[1, 1, 5, 5]], [0], [False]),
               _sample(20, 10, 10, [[2, 4, 8, 9]], [1], [True]),
               _sample(30, 10, 10, [[0, 0, 10, 10]], [2], [False]),
               _sample(40, 10, 10, [[6, 0, 10, 2]], [3], [True])]
    mosaic = Mosaic(10, MEAN)
    image, target = mosaic(samples, (8, 12))
    canvas, _ = mosaic.canvas(samples, (8, 12))
    assert image.shape == (3, 10, 10) and target["boxes"].canvas_size == (10, 10)
    assert torch.equal(image, canvas[:, 5:15, 5:15])
    assert target["boxes"].tolist() == [[9, 0, 10, 2], [0, 3, 7, 10]]
    assert target["labels"].tolist() == [1, 2] and target["difficult"].tolist() == [True, False]


def test_boxes_cut_below_one_pixel_are_dropped_with_their_labels_and_flags():
    samples = [_sample(1, 10, 10, [[0, 0, 10, 1.5], [4, 4, 6, 6]], [5, 6], [True, False]),  # y -2..-0.5: gone
               _sample(2, 10, 10, [], [], []),
               _sample(3, 10, 10, [[9, 0, 10, 10]], [7], [True]),  # x 11..12: fully inside
               _sample(4, 10, 10, [[7.5, 0, 10, 2], [7, 0, 10, 2]], [8, 9], [False, True])]  # x 19.5..20 | 19..20
    _, target = Mosaic(10, MEAN).canvas(samples, (8, 12))
    assert target["boxes"].tolist() == [[6, 2, 8, 4], [11, 8, 12, 18], [19, 8, 20, 10]]
    assert target["labels"].tolist() == [6, 7, 9] and target["difficult"].tolist() == [False, True, True]


def test_images_are_resized_to_fit_the_input_with_their_boxes():
    # a 20 x 40 (h x w) top-left image fits S = 10 at a quarter: 5 x 10, placed at (left, top) = (0, 5) by (10, 10)
    samples = [_sample(7, 20, 40, [[4, 2, 20, 10]], [0], [False])] + [_sample(0, 10, 10, [], [], [])] * 3
    image, target = Mosaic(10, MEAN).canvas(samples, (10, 10))
    assert target["boxes"].tolist() == [[1, 5.5, 5, 7.5]]
    assert (image[:, 5:10, 0:10] == 7).all() and image[:, 4, 0].tolist() == FILL


def test_non_square_input_gives_a_2h_by_2w_canvas():
    samples = [_sample(k, 8, 16, [[0, 0, 16, 8]], [k], [False]) for k in range(4)]
    image, target = Mosaic((8, 16), MEAN).canvas(samples, (8, 16))  # centre in the middle: four whole tiles
    assert image.shape == (3, 16, 32)
    assert target["boxes"].tolist() == [[0, 0, 16, 8], [16, 0, 32, 8], [0, 8, 16, 16], [16, 8, 32, 16]]


def test_the_draws_come_from_the_seed():
    mosaic = Mosaic(300, MEAN)
    assert all(mosaic.plan(3, 10, seed, 0.0) is None for seed in range(50))
    plans = [mosaic.plan(3, 10, seed, 1.0) for seed in range(200)]
    assert plans[7] == mosaic.plan(3, 10, 7, 1.0) and plans[7] != plans[8]
    assert all(len(p.partners) == 3 and 3 not in p.partners and all(0 <= i < 10 for i in p.partners) for p in plans)
    assert {i for p in plans for i in p.partners} == set(range(10)) - {3}
    centres = torch.tensor([p.centre for p in plans])
    assert centres.min() >= 150 and centres.max() <= 450 and centres.min() < 160 and centres.max() > 440
    assert 60 < sum(mosaic.plan(0, 10, seed, 0.5) is not None for seed in range(200)) < 140
    assert mosaic.plan(0, 1, 5, 1.0).partners == [0, 0, 0]  # a one-image dataset: its only item


# ----------------------------------------------------------------------------------------------- the loader
def _first_batch(loader):
    return next(iter(loader))


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in ("images", "boxes", "labels")) and a["paths"] == b["paths"]


def test_mosaic_batches_are_the_same_with_workers_and_the_cache_and_follow_set_mosaic(shapes):
    spec = load_dataset(shapes)
    recs = spec.splits["train"]

    def loader(workers=0, mosaic=1.0, cache=False):
        return build_dataloader(recs, spec.class_names, 64, MEAN, STD, train=True, batch_size=8, workers=workers,
                                seed=3, mosaic=mosaic, cache_images=cache)

    first = _first_batch(loader())
    assert _same(first, _first_batch(loader(workers=2))) and _same(first, _first_batch(loader(cache=True)))
    plain = _first_batch(loader(mosaic=0.0))
    assert not _same(first, plain)
    assert (first["labels"] >= 0).sum() > (plain["labels"] >= 0).sum()  # four images' objects
    switched = loader(workers=2)  # persistent workers keep their dataset copy: the mode travels with the keys
    next(iter(switched))
    switched.sampler.set_epoch(0)
    switched.sampler.set_mosaic(0.0)
    assert _same(_first_batch(switched), plain)


def test_a_mosaic_key_needs_a_dataset_with_the_step(shapes):
    spec = load_dataset(shapes)
    with pytest.raises(ValueError, match=r"item \(0, 1, 0.5\): a mosaic probability 0.5 was given to a dataset"):
        DetectionDataset(spec.splits["train"], spec.class_names)[0, 1, 0.5]
    with pytest.raises(ValueError, match="mosaic=0.5: the mosaic step is a training augmentation"):
        build_dataloader(spec.splits["val"], spec.class_names, 64, MEAN, STD, train=False, batch_size=2, mosaic=0.5)


# ------------------------------------------------------------------------------------------- close-mosaic
def test_close_mosaic_rule():
    assert close_mosaic_epochs(None, 50) == 5 and close_mosaic_epochs(None, 4) == 0 and close_mosaic_epochs(3, 4) == 3
    assert [mosaic_probability(0.5, e, 20, None) for e in range(16, 20)] == [0.5, 0.5, 0.0, 0.0]
    assert [mosaic_probability(1.0, e, 3, 1) for e in range(3)] == [1.0, 1.0, 0.0]
    assert [mosaic_probability(1.0, e, 3, 5) for e in range(3)] == [0.0] * 3
    assert mosaic_probability(1.0, 2, 3, 0) == 1.0


class SeenMosaic(Callback):
    """The sampler's mosaic probability in each epoch (user callbacks run after the built-in ones)."""

    def __init__(self, die_after: int | None = None) -> None:
        self.seen: list[float] = []
        self.die_after = die_after

    def on_train_batch_end(self, trainer, step, losses):
        if step == 0:
            self.seen.append(trainer.train_loader.sampler.mosaic)

    def on_epoch_end(self, trainer, row):
        if trainer.epoch == self.die_after:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_close_mosaic_switches_at_its_epoch_also_after_resume(shapes, tmp_path, ssd_messages):
    options = dict(data=str(shapes), epochs=3, mosaic=1.0, close_mosaic=1, val_interval=3, **TINY_TRAIN)
    full = SeenMosaic()
    result = train(project=str(tmp_path / "full"), callbacks=[full], **options)
    assert full.seen == [1.0, 1.0, 0.0]
    out = ssd_messages()
    assert "mosaic 1 for epochs 1-2, off for the last 1 (--close-mosaic)" in out
    assert "mosaic off from epoch 3 of 3 (--close-mosaic 1)" in out

    with pytest.raises(KeyboardInterrupt):
        train(project=str(tmp_path / "killed"), callbacks=[SeenMosaic(die_after=0)], **options)
    resumed = SeenMosaic()
    again = train(resume=str(tmp_path / "killed" / "exp"), callbacks=[resumed], quiet=True)
    assert resumed.seen == [1.0, 0.0]
    weights = ssd.load_checkpoint(result.run_dir / "weights" / "last.pt")["model"]
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in weights.items())  # same batches



def test_the_schedule_reads_the_epochs_at_each_epoch_start(ssd_messages):
    sampler = SimpleNamespace(mosaic=None, set_mosaic=lambda p: setattr(sampler, "mosaic", p))
    run = SimpleNamespace(config=TrainConfig(epochs=4, mosaic=0.5, close_mosaic=1), epochs=4, epoch=0,
                          train_loader=SimpleNamespace(sampler=sampler))
    schedule, seen = MosaicSchedule(), []
    for epoch in range(5):
        if epoch == 2:  # e.g. a time budget extends the run
            run.epochs = 5
        run.epoch = epoch
        schedule.on_epoch_start(run)
        seen.append(sampler.mosaic)
    assert seen == [0.5, 0.5, 0.5, 0.5, 0.0]
    assert ssd_messages() == ["mosaic 0.5 for epochs 1-3, off for the last 1 (--close-mosaic)",
                             "mosaic off from epoch 5 of 5 (--close-mosaic 1)"]


@pytest.mark.parametrize(("options", "message"), [
    ({"mosaic": 1.5}, r"mosaic=1.5 is invalid: must be a probability in \[0, 1\] \(--mosaic\)"),
    ({"mosaic": -0.1}, r"mosaic=-0.1 is invalid: must be a probability in \[0, 1\] \(--mosaic\)"),
    ({"mosaic": "half"}, r"mosaic='half' is invalid: must be a finite number \(--mosaic\)"),
    ({"close_mosaic": -1}, r"close_mosaic=-1 is invalid: must be >= 0 \(--close-mosaic\)"),
    ({"close_mosaic": 2.5}, r"close_mosaic=2.5 is invalid: must be a whole number \(--close-mosaic\)"),
    ({"mosaic": 0.5, "crop_scale": "native"}, r"mosaic=0.5 is invalid: is a different recipe from --crop-scale "
                                              r"\(native-resolution crops of one image\); use one of them"),
])
def test_mosaic_options_are_checked_by_name(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**options)


@pytest.mark.slow
def test_ssd_train_with_mosaic_end_to_end(shapes, tmp_path, capsys):
    assert main(["train", "--data", str(shapes), "--model", "ssd_tiny", "--image-size", "64", "--epochs", "1",
                 "--batch-size", "8", "--workers", "0", "--device", "cpu", "--quiet", "--num-plot-images", "0",
                 "--mosaic", "1.0", "--project", str(tmp_path)]) == 0
    assert "mosaic 1 for epochs 1-1, off for the last 0 (--close-mosaic)" in capsys.readouterr().err
    config = TrainConfig.from_yaml(tmp_path / "exp" / "config.yaml")
    assert config.mosaic == 1.0 and config.close_mosaic is None
    assert (tmp_path / "exp" / "weights" / "last.pt").is_file()
