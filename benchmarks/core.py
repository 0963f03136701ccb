"""Core speed against torchvision's SSD, on the same inputs, in one run.

(a) matching + loss forward + backward, B=32, P=8732 (SSD300), 21 logits, 3 boxes per image:
    ``ssd.MultiBoxLoss`` versus torchvision's per-image ``SSDMatcher`` + ``SSD.compute_loss``.
(b) post-processing, B=8, same thresholds: ``ssd.postprocess_detections`` versus torchvision's
    ``SSD.postprocess_detections``, on three kinds of logits: dense random logits (almost every score above the
    threshold: the worst case); background-heavy logits (background +6, doubled spread: still about 38k class
    scores per image above the threshold); confident logits, like a trained model on a typical image (background
    +12, about 60 confident priors per image).

Timings: both implementations of a task run in one fresh subprocess, alternating call by call, so that load from
other processes on this shared machine hits both alike; medians are printed. Memory: each implementation runs once
in its own fresh subprocess; peak memory is the rise of the process's peak RSS during one call after the setup
(``/proc/self/clear_refs`` resets the high-water mark), so the setup (imports, building torchvision's model just to
call its methods) is not counted for either side; that process runs with ``MALLOC_MMAP_THRESHOLD_`` low so that
freed tensors go back to the system and RSS follows live memory.

Usage: ``.venv/bin/python benchmarks/core.py [--repeats N] [--tasks TASK ...]``
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

TASKS = {
    "loss": ("(a) match + loss fwd/bwd", "ssd.MultiBoxLoss", "torchvision SSDMatcher + compute_loss", 2.0),
    "post-dense": ("(b) postprocess, dense", "ssd", "torchvision postprocess_detections", 3.0),
    "post-background": ("(b) postprocess, background", "ssd", "torchvision postprocess_detections", 3.0),
    "post-confident": ("(b) postprocess, confident", "ssd", "torchvision postprocess_detections", 3.0),
}
IMPLS = ("ssd", "torchvision")
THRESHOLDS = dict(score_threshold=0.01, iou_threshold=0.45, max_detections=200, candidates_per_class=400)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _inputs(kind: str, batch: int):
    import torch

    from ssd.priors import PRIOR_CONFIGS

    g = torch.Generator().manual_seed(0)
    priors = PRIOR_CONFIGS["ssd300"].boxes(300)
    loc = torch.randn(batch, priors.shape[0], 4, generator=g) * 0.5
    logits = torch.randn(batch, priors.shape[0], 21, generator=g)
    if kind == "background":  # background dominates, but many class scores still pass the threshold
        logits = logits * 2
        logits[..., 0] += 6
    if kind == "confident":  # like a trained model on a typical image: no class score passes but ~60 confident ones
        logits[..., 0] += 12
        image = torch.arange(batch).unsqueeze(1)
        prior = torch.randint(0, priors.shape[0], (batch, 60), generator=g)
        label = torch.randint(1, logits.shape[-1], (batch, 60), generator=g)
        logits[image, prior, label] += 16
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
    from ssd.postprocess import postprocess_detections

    priors, loc, logits, _, _ = _inputs(kind, 8)
    if impl == "ssd":

        def step():
            return postprocess_detections(loc, logits, priors, **THRESHOLDS)

    else:
        model = _torchvision_ssd(
            score_thresh=THRESHOLDS["score_threshold"],
            nms_thresh=THRESHOLDS["iou_threshold"],
            detections_per_img=THRESHOLDS["max_detections"],
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


def _setup(task: str, impl: str):
    return _loss_step(impl) if task == "loss" else _post_step(impl, task.split("-")[1])


def _grad_mode(task: str):
    import torch

    return torch.enable_grad() if task == "loss" else torch.no_grad()


def time_task(task: str, repeats: int) -> dict:
    """Median time of both implementations, alternating call by call (in a fresh subprocess)."""
    steps = {impl: _setup(task, impl) for impl in IMPLS}
    times = {impl: [] for impl in IMPLS}
    with _grad_mode(task):
        for _ in range(repeats):
            for impl, (step, _) in steps.items():
                start = time.perf_counter()
                step()
                times[impl].append(time.perf_counter() - start)
    return {impl: {"median_ms": 1000 * statistics.median(times[impl]), "check": steps[impl][1]} for impl in IMPLS}


def peak_memory(task: str, impl: str) -> dict:
    """Rise of the peak RSS during one call after the setup (in a fresh subprocess)."""
    step, _ = _setup(task, impl)
    with _grad_mode(task):
        baseline = _rss_kib("VmRSS")
        _reset_peak()
        step()
        return {"peak_mib": (_rss_kib("VmHWM") - baseline) / 1024}


def _child(*args: str, low_mmap_threshold: bool = False) -> dict:
    env = dict(os.environ)
    if low_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS), help="default: all")
    parser.add_argument("--time", choices=sorted(TASKS), help=argparse.SUPPRESS)
    parser.add_argument("--memory", nargs=2, metavar=("TASK", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time:
        print(json.dumps(time_task(args.time, args.repeats)))
        return
    if args.memory:
        print(json.dumps(peak_memory(*args.memory)))
        return

    import torch
    import torchvision

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} threads")
    print(f"median of {args.repeats} alternating runs; peak = rise of peak RSS during one call, fresh process each\n")
    for task in args.tasks:
        title, ours_name, theirs_name, target = TASKS[task]
        timed = _child("--time", task, "--repeats", str(args.repeats))
        memory = {impl: _child("--memory", task, impl, low_mmap_threshold=True)["peak_mib"] for impl in IMPLS}
        print(title)
        for impl, name in zip(IMPLS, (ours_name, theirs_name)):
            r = timed[impl]
            print(f"  {name:<40} {r['median_ms']:8.1f} ms  peak {memory[impl]:6.1f} MiB  [{r['check']}]")
        ratio = timed["torchvision"]["median_ms"] / timed["ssd"]["median_ms"]
        verdict = "met" if ratio >= target else "MISSED"
        extra = memory["ssd"] - memory["torchvision"]
        noise = "within RSS noise" if extra < 0.35 else "HIGHER"
        lower = "no higher" if extra <= 0 else f"+{extra:.2f} MiB, {noise}"
        print(f"  speed-up {ratio:.2f}x (target {target}x: {verdict}); peak memory {lower}\n")


if __name__ == "__main__":
    main()
