"""Cost of the ``ssd_tiny_fpn`` fusion neck: parameters and training / inference throughput against ``ssd_tiny``.

Both models (7 classes, as Aquarium) are built in one process and timed alternately step by step (the order
flips every round), so that load from other processes on the shared machine hits both alike; figures are medians
over the rounds. ``train b16``: forward + ``MultiBoxLoss`` + backward + AdamW step at batch 16, 8 random objects
per image; ``infer b1``: the network forward (no post-processing). As ``ssd train --amp`` runs them: channels_last,
bf16 autocast where the CPU has native bf16 kernels (``ssd.device.amp_dtype``), one torch thread by default
(``--threads``). ``--size`` times other input sizes too (e.g. ``--size 256 384``).

Usage: ``.venv/bin/python benchmarks/neck.py [--rounds 20] [--size 256] [--threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ssd.detect import model_input  # noqa: E402
from ssd.device import amp_dtype, autocast  # noqa: E402
from ssd.loss import MultiBoxLoss  # noqa: E402
from ssd.models import build_model  # noqa: E402
from ssd.sizes import as_hw  # noqa: E402
from ssd.text import render_table  # noqa: E402

MODELS = ("ssd_tiny", "ssd_tiny_fpn")
NUM_CLASSES = 7
BATCH = 16


def targets(batch: int, objects: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    centres = torch.rand(batch, objects, 2, generator=g) * 0.8 + 0.1
    sides = torch.rand(batch, objects, 2, generator=g) * 0.2 + 0.02
    boxes = torch.cat((centres - sides / 2, centres + sides / 2), -1).clamp(0, 1)
    return boxes, torch.randint(0, NUM_CLASSES, (batch, objects), generator=g)


class Runner:
    """One model's timed tasks: ``train()`` and ``infer()`` return images/s of one call."""

    def __init__(self, name: str, size: int, dtype: torch.dtype | None):
        torch.manual_seed(0)
        self.model = build_model(name, NUM_CLASSES, image_size=size).to(memory_format=torch.channels_last)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss = MultiBoxLoss()
        self.dtype = dtype
        g = torch.Generator().manual_seed(1)
        self.batch = model_input(torch.randn(BATCH, 3, *as_hw(size), generator=g), True)
        self.boxes, self.labels = targets(BATCH)

    def train(self) -> float:
        self.model.train()
        start = time.perf_counter()
        with autocast(torch.device("cpu"), self.dtype):
            loc, logits = self.model(self.batch)
        loc_loss, cls_loss = self.loss(loc.float(), logits.float(), self.model.priors, self.boxes, self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        (loc_loss + cls_loss).backward()
        self.optimizer.step()
        return BATCH / (time.perf_counter() - start)

    def infer(self) -> float:
        self.model.eval()
        start = time.perf_counter()
        with torch.no_grad(), autocast(torch.device("cpu"), self.dtype):
            self.model(self.batch[:1])
        return 1 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--size", type=int, nargs="+", default=[256])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = amp_dtype(torch.device("cpu"))
    runners = {(name, size): Runner(name, size, dtype) for size in args.size for name in MODELS}
    rates: dict[tuple, dict[str, list[float]]] = {key: {"train": [], "infer": []} for key in runners}
    order = list(runners)
    for round_index in range(args.rounds + 2):  # two warm-up rounds
        for key in order if round_index % 2 == 0 else order[::-1]:
            for task in ("train", "infer"):
                rate = getattr(runners[key], task)()
                if round_index >= 2:
                    rates[key][task].append(rate)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), autocast {dtype}, {args.rounds} rounds")
    rows = []
    for (name, size), runner in runners.items():
        base = runners[(MODELS[0], size)]
        train, infer = (statistics.median(rates[(name, size)][t]) for t in ("train", "infer"))
        base_train = statistics.median(rates[(MODELS[0], size)]["train"])
        rows.append([name, str(size), f"{runner.params:,}", f"{runner.params / base.params - 1:+.1%}",
                     f"{train:.1f}", f"{train / base_train:.2f}x", f"{infer:.1f}"])
    print("\n".join(render_table(["model", "px", "params", "vs ssd_tiny", "train b16 img/s", "ratio",
                                  "infer b1 img/s"], rows)))


if __name__ == "__main__":
    main()
