"""Fine-tuning from a detector trained on other classes versus training from scratch, at equal wall time.

On the synthetic shapes data (``ssd.data.synthetic.generate_synthetic``):

1. pretrain ``ssd_tiny`` on shapes 0..2 (circle, square, triangle);
2. on a second dataset whose classes are shapes 3..5 (star, diamond, cross) plus the shared ``circle`` (objects of
   other shapes removed from its annotations), train for the same number of epochs
   - ``fine-tune``: from the pretrained checkpoint (``weights=``: backbone, extras, box regressors and the
     background row kept, the circle rows carried over, the other class rows initialised);
   - ``scratch``: from a random initialisation;
3. print the validation VOC mAP@0.5 (area under the PR curve) after every epoch with the cumulative wall time of
   each run, and the best mAP each reached within the wall time of the shorter run.

Run: ``.venv/bin/python benchmarks/finetune.py [--epochs 5] [--pretrain-epochs 5] [--images 150]`` (about four
minutes on a 2-core CPU with the defaults).
"""

from __future__ import annotations

import argparse
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from ssd.data.synthetic import SHAPE_NAMES, generate_synthetic
from ssd.training.trainer import train

SIZE = 128
COMMON = dict(model="ssd_tiny", image_size=SIZE, batch_size=16, workers=0, device="cpu", quiet=True, seed=0,
              augment="light", metric="voc", num_plot_images=0)


def target_dataset(root: Path, images: int) -> Path:
    """Shapes 3..5 plus circle: the six-shape dataset with the objects of squares and triangles removed."""
    generate_synthetic(root, num_train=images, num_val=images // 3, image_size=SIZE, num_classes=6, seed=1)
    kept = [*SHAPE_NAMES[3:6], SHAPE_NAMES[0]]
    (root / "classes.txt").write_text("\n".join(kept) + "\n")
    for xml in (root / "Annotations").glob("*.xml"):
        tree = ET.parse(xml)
        for obj in tree.getroot().findall("object"):
            if obj.findtext("name") not in kept:
                tree.getroot().remove(obj)
        tree.write(xml)
    return root


def curve(result) -> list[tuple[float, float]]:
    """(cumulative seconds, val mAP) after each epoch."""
    return [(row["time"], row["val/mAP"]) for row in result.history]


def best_within(points: list[tuple[float, float]], seconds: float) -> float:
    return max((m for t, m in points if t <= seconds + 1e-9), default=float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each run on the target classes")
    parser.add_argument("--pretrain-epochs", type=int, default=5)
    parser.add_argument("--images", type=int, default=150,
                        help="training images of the target dataset (twice as many for pretraining)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = generate_synthetic(tmp / "source", num_train=args.images * 2, num_val=args.images // 3,
                                    image_size=SIZE, num_classes=3, seed=0)
        pretrained = train(data=str(source), epochs=args.pretrain_epochs, project=str(tmp / "runs"), name="pre",
                           **COMMON)
        print(f"pretrained on {', '.join(SHAPE_NAMES[:3])}: mAP@0.5 {pretrained.best_map:.3f} "
              f"in {pretrained.history[-1]['time']:.0f} s")
        target = target_dataset(tmp / "target", args.images)
        runs = {
            "fine-tune": train(data=str(target), epochs=args.epochs, weights=str(pretrained.run_dir / "weights"
                                                                                  / "best.pt"),
                               project=str(tmp / "runs"), name="finetune", **COMMON),
            "scratch": train(data=str(target), epochs=args.epochs, project=str(tmp / "runs"), name="scratch",
                             **COMMON),
        }
    curves = {name: curve(result) for name, result in runs.items()}
    print(f"\ntarget classes {', '.join([*SHAPE_NAMES[3:6], SHAPE_NAMES[0]])}; VOC mAP@0.5 on the val split")
    print(f"{'epoch':>5}  " + "  ".join(f"{name + ' s':>12} {name + ' mAP':>14}" for name in curves))
    for epoch in range(args.epochs):
        print(f"{epoch + 1:>5}  " + "  ".join(f"{points[epoch][0]:>12.0f} {points[epoch][1]:>14.3f}"
                                               for points in curves.values()))
    budget = min(points[-1][0] for points in curves.values())
    print(f"\nbest mAP@0.5 within {budget:.0f} s: " + ", ".join(
        f"{name} {best_within(points, budget):.3f}" for name, points in curves.items()))


if __name__ == "__main__":
    main()
