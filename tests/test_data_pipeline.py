"""Augmentation invariants, collate padding (straight into the core's match), loader reproducibility, synthetic data."""

import hashlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision import tv_tensors

from ssd import match
from ssd.data import build_dataloader, collate, load_dataset
from ssd.data.loader import DetectionDataset
from ssd.data.records import ImageRecord, ObjectRecord
from ssd.data.synthetic import generate_synthetic
from ssd.data.transforms import build_transform
from ssd.preprocess import preprocess
from ssd.priors import PRIOR_CONFIGS

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _target(boxes, labels, canvas):
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    labels = torch.tensor(labels, dtype=torch.int64)
    return {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=canvas), "labels": labels,
            "difficult": labels % 2 == 1}


@st.composite
def _samples(draw):
    h, w = draw(st.integers(16, 96)), draw(st.integers(16, 96))
    n = draw(st.integers(0, 6))
    boxes = []
    for _ in range(n):
        x1, y1 = draw(st.integers(0, w - 4)), draw(st.integers(0, h - 4))
        boxes.append([x1, y1, draw(st.integers(x1 + 2, w)), draw(st.integers(y1 + 2, h))])
    return h, w, boxes, draw(st.integers(0, 2**31))


@settings(max_examples=40, deadline=None)
@given(_samples(), st.sampled_from(["ssd", "light"]))
def test_train_transform_keeps_boxes_inside_and_labels_attached(sample, augment):
    h, w, boxes, seed = sample
    labels = list(range(len(boxes)))  # unique labels identify each box
    torch.manual_seed(seed)
    image = tv_tensors.Image(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
    out_image, out = build_transform(64, MEAN, STD, train=True, augment=augment)(image, _target(boxes, labels, (h, w)))
    assert out_image.shape == (3, 64, 64) and out_image.dtype == torch.float32
    b = out["boxes"]
    assert b.canvas_size == (64, 64) and len(b) == len(out["labels"]) == len(out["difficult"])
    assert ((b >= 0) & (b <= 64)).all() and (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
    assert len(set(out["labels"].tolist())) == len(out["labels"]) and set(out["labels"].tolist()) <= set(labels)
    assert torch.equal(out["difficult"], out["labels"] % 2 == 1)  # flags travel with their boxes


def test_eval_transform_is_resize_and_normalize():
    image = tv_tensors.Image(torch.full((3, 20, 40), 255, dtype=torch.uint8))
    target = _target([[0, 0, 20, 10], [20, 10, 40, 20]], [0, 1], (20, 40))
    out_image, out = build_transform(10, MEAN, STD)(image, target)
    assert torch.allclose(out["boxes"], torch.tensor([[0.0, 0, 5, 5], [5, 5, 10, 10]]))
    assert torch.allclose(out_image[:, 0, 0], (1 - torch.tensor(MEAN)) / torch.tensor(STD))
    with pytest.raises(ValueError, match="augment must be one of"):
        build_transform(10, MEAN, STD, train=True, augment="heavy")


def test_prediction_sees_the_pixels_evaluation_sees():
    # preprocess (predict, export checks, benchmarks) and the evaluation transform (ssd val) resize each photo to the
    # same bits, channels-last fast path or not; the batch comes out contiguous for every runtime
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in
              ((480, 640), (37, 91), (480, 640), (300, 200))]
    batch, sizes = preprocess(images, (96, 128), MEAN, STD)
    assert batch.is_contiguous() and sizes.tolist() == [[480, 640], [37, 91], [480, 640], [300, 200]]
    for image, row in zip(images, batch):
        target = _target([], [], tuple(image.shape[-2:]))
        expected, _ = build_transform((96, 128), MEAN, STD)(tv_tensors.Image(image), target)
        assert torch.equal(row, expected)


def test_collate_pads_for_match():
    def item(boxes, labels):
        t = _target(boxes, labels, (50, 100))
        t.update(image_id="i", path="p", orig_size=torch.tensor([5, 10]))
        return torch.zeros(3, 50, 100), t

    batch = collate([item([[10, 5, 60, 25]], [2]), item([], []), item([[0, 0, 100, 50], [50, 25, 100, 50]], [0, 1])])
    assert batch["images"].shape == (3, 3, 50, 100)
    assert batch["labels"].tolist() == [[2, -1], [-1, -1], [0, 1]] and batch["labels"].dtype == torch.int64
    assert torch.allclose(batch["boxes"][0], torch.tensor([[0.1, 0.1, 0.6, 0.5], [0, 0, 0, 0]]))
    assert torch.allclose(batch["boxes"][2], torch.tensor([[0.0, 0, 1, 1], [0.5, 0.5, 1, 1]]))
    assert batch["difficult"].tolist() == [[False, False], [False, False], [False, True]]
    assert batch["orig_sizes"].tolist() == [[5, 10]] * 3 and batch["paths"] == ["p"] * 3
    priors = PRIOR_CONFIGS["ssd300"].boxes(300)
    loc_t, cls_t = match(batch["boxes"], batch["labels"], priors)
    assert loc_t.shape == (3, len(priors), 4) and (cls_t[1] == 0).all() and set(cls_t[2].unique().tolist()) >= {1, 2}

    empty = collate([item([], []), item([], [])])
    assert empty["boxes"].shape == (2, 1, 4) and empty["labels"].tolist() == [[-1], [-1]]


def _batches(loader, n=2):
    out = []
    for i, b in enumerate(loader):
        out.append((b["images"], b["boxes"], b["labels"], b["paths"]))
        if i + 1 == n:
            break
    return out


def _same(a, b):
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and torch.equal(x[2], y[2]) and x[3] == y[3]
               for x, y in zip(a, b))


@pytest.mark.slow
def test_loader_same_seed_same_batches_any_workers(synthetic_voc):
    spec = load_dataset(synthetic_voc)
    recs = spec.splits["train"][:16]

    def loader(workers, seed=3):
        return build_dataloader(recs, spec.class_names, 64, MEAN, STD, train=True, batch_size=4, workers=workers,
                                seed=seed)

    first = _batches(loader(0))
    assert _same(first, _batches(loader(0)))
    assert _same(first, _batches(loader(2)))
    assert not _same(first, _batches(loader(0, seed=4)))
    epochs = loader(0)
    assert not _same(_batches(epochs), _batches(epochs))  # the next epoch differs
    resumed = loader(0)
    resumed.sampler.set_epoch(1)
    epochs.sampler.set_epoch(1)
    assert _same(_batches(resumed), _batches(epochs))


def test_a_readers_table_is_read_with_float32_boxes_like_indexed_records(tmp_path):
    from builders import make_dataset

    table = load_dataset(make_dataset("coco", tmp_path, train=2, val=1)).splits["train"]
    assert table.boxes.dtype.name == "float64"  # as written in the JSON, for exact messages
    dataset = DetectionDataset(table, list("abcdef"))
    assert dataset.records.boxes.dtype.name == "float32" and dataset[0][1]["boxes"].dtype == torch.float32


def test_difficult_left_out_of_training_kept_for_eval(tmp_path):
    from PIL import Image

    Image.new("RGB", (40, 20)).save(tmp_path / "a.jpg")
    objs = [ObjectRecord((0, 0, 20, 10), 0, "a"), ObjectRecord((20, 10, 40, 20), 1, "b", difficult=True),
            ObjectRecord((5, 5, 15, 15), 1, "b", iscrowd=True)]
    rec = ImageRecord(Path(tmp_path / "a.jpg"), None, objs, 40, 20)
    train = build_dataloader([rec], ["a", "b"], 32, MEAN, STD, train=True, batch_size=1, augment="none")
    evaluation = build_dataloader([rec], ["a", "b"], 32, MEAN, STD, train=False, batch_size=1, cache_images=True)
    assert next(iter(train))["labels"].tolist() == [[0]]
    batch = next(iter(evaluation))
    assert batch["labels"].tolist() == [[0, 1, 1]] and batch["difficult"].tolist() == [[False, True, True]]
    assert torch.allclose(batch["boxes"][0, :2], torch.tensor([[0, 0, 0.5, 0.5], [0.5, 0.5, 1, 1]]))
    assert batch["orig_sizes"].tolist() == [[20, 40]]
    ds = DetectionDataset([rec], ["a", "b"], image_size=8)
    assert ds[0][0].shape == (3, 8, 8) and torch.allclose(ds[0][1]["boxes"][0], torch.tensor([0.0, 0, 4, 4]))


def _digest(root: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())).hexdigest()


def test_synthetic_is_deterministic(tmp_path):
    a = generate_synthetic(tmp_path / "a", num_train=3, num_val=1, image_size=64, num_classes=4, seed=1)
    b = generate_synthetic(tmp_path / "b", num_train=3, num_val=1, image_size=64, num_classes=4, seed=1)
    c = generate_synthetic(tmp_path / "c", num_train=3, num_val=1, image_size=64, num_classes=4, seed=2)
    assert _digest(a) == _digest(b) != _digest(c)
    assert (a / "ImageSets/Main/val.txt").read_text() == "synth_000003\n"
    with pytest.raises(ValueError, match="num_classes must be 1..10"):
        generate_synthetic(tmp_path / "d", num_train=1, num_val=1, image_size=64, num_classes=11, seed=0)


def test_vectorized_iou_crop_follows_the_rule():
    from torchvision.ops import box_iou

    from ssd.data.transforms import IoUCropWithBoxes

    torch.manual_seed(0)
    image = tv_tensors.Image(torch.zeros(3, 100, 200, dtype=torch.uint8))
    boxes = _target([[10, 10, 60, 50], [120, 40, 190, 95]], [0, 1], (100, 200))["boxes"]
    for min_iou in (0.1, 0.5, 0.7):
        crop = IoUCropWithBoxes(sampler_options=[min_iou])
        for _ in range(20):
            p = crop.make_params([image, boxes])
            x2, y2 = p["left"] + p["width"], p["top"] + p["height"]
            rect = torch.tensor([[p["left"], p["top"], x2, y2]], dtype=torch.float)
            assert 0.5 <= p["width"] / p["height"] <= 2 and x2 <= 200 and y2 <= 100
            inside = p["is_within_crop_area"]
            assert inside.any() and box_iou(boxes[inside].float(), rect).max() >= min_iou
    assert IoUCropWithBoxes(sampler_options=[2.0]).make_params([image, boxes]) == {}  # "leave as is"
