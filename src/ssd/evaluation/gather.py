"""The per-image results of an evaluation split, gathered from every torchrun rank on rank 0: :func:`gather_on_main`.

Rank ``r`` of ``W`` evaluates images ``r, r + W, r + 2W, ...`` of the split
(:func:`ssd.evaluation.evaluator.split_loader`); rank 0 receives every rank's detections and ground truths as
tensors (:func:`ssd.distributed.gather_tensors`, not pickled dicts) and puts them back in the split's order
(:func:`merge_results`), so that the metrics are those of one process. The other ranks keep only their own share.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest
from typing import Any

import torch
from torch import Tensor

import ssd.distributed as ddp

__all__ = ["gather_on_main", "merge_results", "pack_results", "unpack_results"]

_GAP = object()


def merge_results(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """Per-rank lists of per-image results back in the split's order: rank ``r`` of ``W`` holds images ``r, r + W,
    r + 2W, ...`` (:func:`ssd.evaluation.evaluator.split_loader`), so the merged list takes one of each rank in turn."""
    return [item for row in zip_longest(*parts, fillvalue=_GAP) for item in row if item is not _GAP]


def gather_on_main(detections: list[dict[str, Any]], ground_truths: list[dict[str, Tensor]]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Tensor]]] | None:
    """Every rank's per-image results (those of :func:`ssd.evaluation.evaluator.predict_dataset`) on rank 0, in the
    split's order (see :func:`merge_results`): boxes, scores, labels and objects as tensors
    (:func:`pack_results`), the image ids and paths as objects; ``None`` on the other ranks. Without a process group,
    the same lists, as they are."""
    if not ddp.is_distributed():  # one process: nothing to send, nothing to pack
        return detections, ground_truths
    parts = ddp.gather_tensors(pack_results(detections, ground_truths))
    names = ddp.gather_objects([(d["image_id"], d["path"]) for d in detections])
    if parts is None or names is None:
        return None
    unpacked = [unpack_results(part, rank_names) for part, rank_names in zip(parts, names)]
    return merge_results([d for d, _ in unpacked]), merge_results([g for _, g in unpacked])


def pack_results(detections: Sequence[dict[str, Any]], ground_truths: Sequence[dict[str, Tensor]]
                 ) -> dict[str, Tensor]:
    """The tensors of ``N`` images' results, concatenated: ``boxes [D, 4]``, ``scores [D]``, ``labels [D]`` (their
    ``D`` detections), ``gt_boxes [M, 4]``, ``gt_labels [M]``, ``gt_difficult [M]`` (their ``M`` objects) and
    ``counts [N, 4]`` int64 (per image: detections, objects, height, width). Image ids and paths are not packed."""
    return {"boxes": _cat([d["boxes"] for d in detections], (0, 4)),
            "scores": _cat([d["scores"] for d in detections]),
            "labels": _cat([d["labels"] for d in detections], dtype=torch.int64),
            "gt_boxes": _cat([g["boxes"] for g in ground_truths], (0, 4)),
            "gt_labels": _cat([g["labels"] for g in ground_truths], dtype=torch.int64),
            "gt_difficult": _cat([g["difficult"] for g in ground_truths], dtype=torch.bool),
            "counts": torch.tensor([[len(d["scores"]), len(g["labels"]), *g["image_size"]]
                                    for d, g in zip(detections, ground_truths)], dtype=torch.int64).view(-1, 4)}


def unpack_results(packed: dict[str, Tensor], names: Sequence[tuple[Any, str]]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Tensor]]]:
    """The per-image detections and ground truths of :func:`pack_results`'s tensors, the ``(image_id, path)`` of
    each image from ``names``; the tensors are views of ``packed``'s."""
    found, objects, *size = packed["counts"].T.tolist() if len(packed["counts"]) else ([], [], [], [])
    detections = [{"boxes": b, "scores": s, "labels": lab, "image_id": i, "path": p}
                  for b, s, lab, (i, p) in zip(packed["boxes"].split(found), packed["scores"].split(found),
                                               packed["labels"].split(found), names)]
    truths = [{"boxes": b, "labels": lab, "difficult": dif, "image_size": hw} for b, lab, dif, hw
              in zip(packed["gt_boxes"].split(objects), packed["gt_labels"].split(objects),
                     packed["gt_difficult"].split(objects), zip(*size))]
    return detections, truths


def _cat(tensors: list[Tensor], empty: tuple[int, ...] = (0,), dtype: torch.dtype = torch.float32) -> Tensor:
    """``torch.cat`` of per-image tensors; of the given shape and dtype when there are none."""
    return torch.cat(tensors) if tensors else torch.zeros(empty, dtype=dtype)
