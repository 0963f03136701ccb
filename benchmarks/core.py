"""Core speed against torchvision's SSD, on the same inputs, in one run.

(a) matching + loss forward + backward, B=32, P=8732 (SSD300), 21 logits, 3 boxes per image:
    ``ssd.MultiBoxLoss`` versus torchvision's per-image ``SSDMatcher`` + ``SSD.compute_loss``.
(b) post-processing, B=8, same thresholds: ``ssd.postprocess`` versus ``SSD.postprocess_detections``, on dense
    random logits (every score above the threshold: the worst case) and on confident, background-heavy logits.

Each variant runs in fresh subprocesses: one for the timings, one for the memory. Peak memory is the rise of the
process's peak RSS during one call after the setup (``/proc/self/clear_refs`` resets the high-water mark), so the
setup (imports, building torchvision's model just to call its methods) is not counted for either side; that process
runs with ``MALLOC_MMAP_THRESHOLD_`` low so that freed tensors go back to the system and RSS follows live memory.

Usage: ``.venv/bin/python benchmarks/core.py [--repeats N]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "loss-ssd": "(a) ssd.MultiBoxLoss",
    "loss-torchvision": "(a) torchvision SSDMatcher + compute_loss",
    "post-dense-ssd": "(b) ssd.postprocess, dense",
    "post-dense-torchvision": "(b) torchvision postprocess_detections, dense",
    "post-confident-ssd": "(b) ssd.postprocess, confident",
    "post-confident-torchvision": "(b) torchvision postprocess_detections, confident",
}
THRESHOLDS = dict(score_threshold=0.01, iou_threshold=0.45, top_k=200, candidates_per_class=400)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _inputs(kind: str, batch: int):
    import torch

    from ssd.priors import PRIOR_CONFIGS, default_boxes

    g = torch.Generator().manual_seed(0)
    priors = default_boxes(**PRIOR_CONFIGS["ssd300"])
    loc = torch.randn(batch, priors.shape[0], 4, generator=g) * 0.5
    logits = torch.randn(batch, priors.shape[0], 21, generator=g)
    if kind == "confident":  # like a trained model: background dominates, a few confident objects
        logits = logits * 2
        logits[..., 0] += 6
    centres = torch.rand(batch, 3, 2, generator=g) * 0.6 + 0.2
    sizes = torch.rand(batch, 3, 2, generator=g) * 0.35 + 0.05
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), dim=-1)
    labels = torch.randint(0, 20, (batch, 3), generator=g)
    return priors, loc, logits, boxes, labels


def _torchvision_ssd(**kwargs):
    from torchvision.models.detection import ssd300_vgg16

    return ssd300_vgg16(weights=None, weights_backbone=None, num_classes=21, **kwargs).eval()


def _loss_step(impl: str):
    """Return a callable doing one match + loss forward + backward, and a string of the loss values."""
    import torch
    from torchvision.models.detection._utils import SSDMatcher
    from torchvision.ops import box_iou

    from ssd.boxes import cxcywh_to_xyxy
    from ssd.loss import MultiBoxLoss

    priors, loc, logits, boxes, labels = _inputs("dense", 32)
    loc.requires_grad_()
    logits.requires_grad_()
    if impl == "ssd":
        loss_fn = MultiBoxLoss()

        def step():
            loc_loss, cls_loss = loss_fn(loc, logits, priors, boxes, labels)
            (loc_loss + cls_loss).backward()
            return loc_loss, cls_loss

    else:
        model = _torchvision_ssd()  # its box coder weights (10, 10, 5, 5) are the variances (0.1, 0.2)
        matcher = SSDMatcher(0.5)
        anchors = [cxcywh_to_xyxy(priors)] * len(boxes)
        targets = [{"boxes": b, "labels": lab + 1} for b, lab in zip(boxes, labels)]  # torchvision: 0 = background

        def step():
            matched = [matcher(box_iou(t["boxes"], a)) for t, a in zip(targets, anchors)]
            out = model.compute_loss(targets, {"bbox_regression": loc, "cls_logits": logits}, anchors, matched)
            (out["bbox_regression"] + out["classification"]).backward()
            return out["bbox_regression"], out["classification"]

    def timed():
        loc.grad = logits.grad = None
        return step()

    loc_loss, cls_loss = timed()
    loc.grad = logits.grad = None  # the memory measurement starts without gradients
    return timed, f"loc {loc_loss.item():.6f} cls {cls_loss.item():.6f}"


def _post_step(impl: str, kind: str):
    import torch

    from ssd.boxes import cxcywh_to_xyxy
    from ssd.postprocess import postprocess

    priors, loc, logits, _, _ = _inputs(kind, 8)
    if impl == "ssd":

        def step():
            return postprocess(loc, logits, priors, **THRESHOLDS)

    else:
        model = _torchvision_ssd(
            score_thresh=THRESHOLDS["score_threshold"],
            nms_thresh=THRESHOLDS["iou_threshold"],
            detections_per_img=THRESHOLDS["top_k"],
            topk_candidates=THRESHOLDS["candidates_per_class"],
        )
        anchors = [cxcywh_to_xyxy(priors)] * len(loc)

        def step():
            head = {"bbox_regression": loc, "cls_logits": logits}
            return model.postprocess_detections(head, anchors, [(1, 1)] * len(loc))

    with torch.no_grad():
        out = step()
    count = sum(len(d["scores"]) for d in out)
    score_sum = sum(float(d["scores"].sum()) for d in out)
    return step, f"{count} detections, score sum {score_sum:.4f}"


def run_variant(name: str, repeats: int, measure: str) -> dict:
    """Run one variant in this process (a fresh subprocess): its median time or its peak memory."""
    import torch

    what, _, impl = name.rpartition("-")
    step, check = _loss_step(impl) if what == "loss" else _post_step(impl, what.split("-")[1])
    grad = torch.enable_grad() if what == "loss" else torch.no_grad()
    with grad:
        if measure == "memory":
            baseline = _rss_kib("VmRSS")
            _reset_peak()
            step()
            return {"peak_mib": (_rss_kib("VmHWM") - baseline) / 1024}
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return {"median_ms": 1000 * statistics.median(times), "check": check}


def _child(name: str, repeats: int, measure: str) -> dict:
    env = dict(os.environ)
    if measure == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    command = [sys.executable, __file__, "--variant", name, "--repeats", str(repeats), "--measure", measure]
    proc = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--measure", choices=["time", "memory"], default="time", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.repeats, args.measure)))
        return

    import torch
    import torchvision

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} threads")
    print(f"median of {args.repeats} runs; peak = rise of peak RSS during one call (fresh process per variant)\n")
    results = {}
    for name, title in VARIANTS.items():
        results[name] = r = _child(name, args.repeats, "time") | _child(name, args.repeats, "memory")
        print(f"{title:<52} {r['median_ms']:9.1f} ms  peak {r['peak_mib']:7.1f} MiB  [{r['check']}]")
    print()
    for prefix, target in (("loss", 2.0), ("post-dense", 1.5), ("post-confident", 1.5)):
        ours, theirs = results[f"{prefix}-ssd"], results[f"{prefix}-torchvision"]
        ratio = theirs["median_ms"] / ours["median_ms"]
        memory = "no higher" if ours["peak_mib"] <= theirs["peak_mib"] else "HIGHER"
        print(f"{prefix:<15} speed-up {ratio:5.2f}x (target {target}x: {'met' if ratio >= target else 'MISSED'}), "
              f"peak memory {ours['peak_mib']:.1f} vs {theirs['peak_mib']:.1f} MiB ({memory})")


if __name__ == "__main__":
    main()
