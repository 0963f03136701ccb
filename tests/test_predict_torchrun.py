"""ssd predict and ssd val sharded under torchrun: two CPU processes (gloo) write exactly the outputs of one process
(every file, byte for byte, the JSONL in input order) and score the split once, with one process's metrics; the pieces
of the merge (the slices, the crops moved into place under the run's cap) on their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from builders import make_dataset, random_images
from ssd.errors import ConfigError
from ssd.evaluation.evaluator import evaluate
from ssd.inference.crop_files import CropWriter
from ssd.inference.results import PredictSummary, Result
from ssd.inference.shards import Shard
from ssd.inference.sources import predict_source
from ssd.schemas import PredictConfig

OPTIONS = dict(save_txt=True, save_crop=True, fmt="csv", score_threshold=0.3, max_detections=5)

SCRIPT = """
import sys, torch
from pathlib import Path
from ssd.evaluation.evaluator import evaluate
from ssd.inference.sources import predict_source
from ssd.schemas import PredictConfig
weights, source, data, out = sys.argv[1:5]
summary = predict_source(PredictConfig(weights=weights, source=source, save_dir=Path(out) / "predict", **{options}),
                         progress=False)
result = evaluate(weights, data, metric="voc", device="cpu", batch_size=2)
torch.save({{"summary": str(summary), "main": summary.main, "map": result["map"], "per_class": result["per_class"],
            "detections": result["detections"], "ground_truths": result["ground_truths"]}},
           Path(out) / f"rank{{summary.main}}.pt")
"""


def _inputs(root: Path) -> Path:
    """Five images in two folders (two share a name), a corrupt one and a video of four frames."""
    for i, image in enumerate(random_images(5)):
        folder = root / ("a" if i < 3 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"img{i % 3}.png")
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    writer = cv2.VideoWriter(str(root / "b" / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (96, 64))
    for frame in np.random.default_rng(0).integers(0, 256, (4, 64, 96, 3), dtype=np.uint8):
        writer.write(frame)
    writer.release()
    return root


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every file under ``root`` by its relative path: its bytes, or where it links to."""
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.mark.slow
def test_two_ranks_write_and_score_what_one_process_does(tiny_checkpoint, tmp_path):
    source = _inputs(tmp_path / "inputs")
    data = make_dataset("voc", tmp_path / "data", train=1, val=5, size=64, classes=3)
    script = tmp_path / "sharded.py"
    script.write_text(textwrap.dedent(SCRIPT.format(options=OPTIONS)))
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tiny_checkpoint), str(source), str(data), str(out)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    one = predict_source(PredictConfig(weights=tiny_checkpoint, source=source, save_dir=tmp_path / "one" / "predict",
                                       **OPTIONS), progress=False)
    sharded = out / "predict"
    assert _tree(sharded) == _tree(one.save_dir)  # JSONL, CSV, drawn copies, video, YOLO labels, crops
    assert (sharded / "predictions.jsonl").read_text().count("\n") == 4 + 5  # no part left behind, none lost
    main, other = (torch.load(out / f"rank{main}.pt", weights_only=False) for main in (True, False))
    assert main["summary"] == str(one).replace(str(one.save_dir), str(sharded))
    assert "5 images, 1 video (4 frames)" in main["summary"] and "broken.jpg" in main["summary"]

    single = evaluate(tiny_checkpoint, data, metric="voc", device="cpu", batch_size=2)
    assert main["map"] == other["map"] == single["map"]
    assert [c["ap"] for c in main["per_class"].values()] == [c["ap"] for c in other["per_class"].values()] == [
        c["ap"] for c in single["per_class"].values()]
    assert [d["path"] for d in main["detections"]] == [d["path"] for d in single["detections"]]
    for got, want in zip(main["detections"], single["detections"]):  # other batches, other threads: float noise
        torch.testing.assert_close({k: got[k] for k in ("boxes", "scores", "labels")},
                                   {k: want[k] for k in ("boxes", "scores", "labels")}, atol=1e-4, rtol=0)
    assert len(main["ground_truths"]) == 5
    assert other["detections"] == other["ground_truths"] == []  # only rank 0 holds the whole split


def test_shard_slices_are_contiguous_and_cover_the_inputs():
    units = list(range(7))
    slices = [Shard(rank, 3).take(units) for rank in range(3)]
    assert slices == [[0, 1], [2, 3], [4, 5, 6]]
    assert Shard().take(units) == units and Shard().part_dir(Path("run")) is None
    assert Shard(2, 3).part_dir(Path("run")) == Path("run/.rank2")


def test_rank_0_summary_adds_every_count_of_the_other_ranks_in_rank_order():
    def summary(images, videos, frames, detections, skipped):
        return PredictSummary(Path("run"), Path("run/predictions.json"), images=images, videos=videos, frames=frames,
                              detections=detections, skipped=skipped, streams=9, live_frames=9, dropped=9)

    main = summary(2, 1, 30, 7, [("a.jpg", "truncated")])
    main.add_counts([summary(3, 0, 0, 4, []).counts(), summary(0, 2, 11, 5, [("b.mp4", "no frames")]).counts()])
    assert (main.images, main.videos, main.frames, main.detections) == (5, 3, 41, 16)
    assert main.skipped == [("a.jpg", "truncated"), ("b.mp4", "no frames")]
    assert (main.streams, main.live_frames, main.dropped) == (9, 9, 9)  # live runs are never sharded


def test_live_sources_are_not_sharded(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match=r"live sources \(cameras, streams\) are not sharded: under torchrun each "
                                          r"of the 2 processes would read the same frames"):
        Shard.join(live=True)


def test_staged_crops_take_their_run_wide_names_and_the_rest_of_the_cap(tmp_path):
    image = torch.zeros(3, 20, 20, dtype=torch.uint8)
    result = Result(boxes=torch.tensor([[0.0, 0, 10, 10], [5, 5, 15, 15]]), scores=torch.tensor([0.9, 0.8]),
                    labels=torch.tensor([0, 1]), names=["a", "b"], width=20, height=20, path="x.png")
    crops = CropWriter(tmp_path, ["a", "b"], max_crops=10, stage=tmp_path / ".rank1")
    crops.write(result, Path("x.png"), image, 0)
    crops.write(result, Path("y.png"), image, 1)
    assert sorted(p.name for p in (tmp_path / ".rank1").rglob("*.jpg")) == ["x_0_0.jpg", "x_0_1.jpg", "y_1_0.jpg",
                                                                            "y_1_1.jpg"]
    crops.place(offset=7, room=3)  # the ranks before wrote 7 lines and 7 crops: 3 left under the cap of 10
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jpg")) == [
        "crops/a/x_7_0.jpg", "crops/a/y_8_0.jpg", "crops/b/x_7_1.jpg"]
    assert (crops.saved, crops.over) == (3, 1)
