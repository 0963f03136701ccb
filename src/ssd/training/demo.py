"""``ssd demo``: generate the synthetic shapes dataset, train the small model, evaluate, draw predictions.

No download and no arguments: about 5 minutes on a 2-core CPU, reaching VOC mAP@0.5 >= 0.9 on the validation
split. The schedule is fixed in epochs (deterministic): ``ssd_tiny`` with channels_last, AdamW at 3e-3, half an
epoch of warmup, gradient clipping and a cosine decay over 8 epochs of 2000 images, images decoded once and kept in
RAM, bfloat16 autocast where the CPU has native kernels, the light augmentation (the shapes need no more) and
loading in the main process (a worker process would take a core from the training step). The metric is the
VOC2010+ area AP@0.5: the 2007 11-point variant caps a class at 10/11 as soon as one of its objects (e.g. a shape
hidden under another) is never found. The measurements behind these choices are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ssd.distributed as ddp
from ssd.data.synthetic import generate_synthetic
from ssd.device import resolve_device
from ssd.files import write_text
from ssd.training.config import TrainConfig
from ssd.training.trainer import TrainResult, train

__all__ = ["run_demo", "DEMO_DATA"]

# The synthetic dataset of the demo (6 shapes, 2000 train / 200 val images of 256 px).
DEMO_DATA = {"num_train": 2000, "num_val": 200, "image_size": 256, "num_classes": 6, "seed": 0}


def demo_dataset(root: Path, **overrides) -> Path:
    """Generate the demo dataset in ``root`` unless an identical one is already there (``demo.json`` stamp)."""
    params = {**DEMO_DATA, **overrides}
    stamp = root / "demo.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == params:
        return root
    generate_synthetic(root, **params)
    write_text(stamp, json.dumps(params))
    return root


def run_demo(project: str | Path = "runs/demo", *, device: str = "auto", quiet: bool = False, epochs: int = 8,
             batch_size: int = 16, workers: int = 0, data: dict | None = None, **overrides) -> TrainResult:
    """Run the demo into ``project`` (dataset in ``project/data``, run in ``project/exp``, ``exp2``, ...; ``name`` and
    ``exist_ok`` as for training).

    ``data`` overrides :data:`DEMO_DATA` (e.g. a smaller set for tests); other keyword ``overrides`` go to
    :class:`~ssd.training.config.TrainConfig`. Returns the :class:`~ssd.training.trainer.TrainResult` and prints where
    everything is.
    """
    project = Path(project)
    root = project / "data"
    config = TrainConfig(data=str(root), model="ssd_tiny", epochs=epochs, batch_size=batch_size, device=device,
                         quiet=quiet, workers=workers, cache_images="ram", project=str(project),
                         warmup_epochs=0.5, val_interval=max(1, epochs // 2), metric="voc", amp=True,
                         augment="light").update(**overrides)
    resolve_device(config.device)  # options and device refused before the images are generated
    start = time.perf_counter()
    demo_dataset(root, **(data or {}))
    generated = time.perf_counter() - start
    result = train(config)
    elapsed = time.perf_counter() - start
    run = result.run_dir
    if ddp.DistInfo.from_env().is_main:
        print(f"\nSSD demo done in {elapsed / 60:.1f} min (dataset {generated:.0f} s, training and evaluation "
              f"{elapsed - generated:.0f} s)")
        print(f"  validation mAP@0.5 (VOC area): {result.metrics['map']:.3f}")
        print(f"  dataset:        {root}")
        print(f"  run directory:  {run}")
        print(f"  predictions:    {run / 'val_predictions'}")
        print(f"  curves:         {run / 'results.png'}, {run / 'pr_curves.png'}")
        print(f"  weights:        {run / 'weights' / 'best.pt'}")
        print(f"  try:            ssd predict --weights {run / 'weights' / 'best.pt'} "
              f"--source {root / 'JPEGImages'}")
    return result
