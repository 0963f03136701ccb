"""MOT-format tracking ground truth (:func:`read_mot`): the sequences ``ssd val --track`` scores a tracker on.

Two layouts are read:

- MOTChallenge: ``SEQ/img1/*.jpg`` with ``SEQ/gt/gt.txt``, given as the sequence folder or as a folder of sequence
  folders (``MOT17/train``);
- a plain folder of frames with its ``gt.txt`` next to them.

The frames are the folder's images in name order; frame ``n`` of ``gt.txt`` (from 1) is the n-th. Each line of
``gt.txt`` is ``frame, id, left, top, width, height[, flag[, class[, visibility]]]`` (pixels; MOTChallenge's
columns). A line whose flag is 0 marks an object not to score (MOTChallenge's rule): it is neither a miss nor, when a
tracked box covers it, a false positive. The class column is not used: the tracker is scored on every box, whatever
its class. Any line that does not follow these rules is refused with its file and line number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ssd.data.images import is_image
from ssd.errors import DataError
from ssd.limits import MAX_DETECTIONS_FILE_BYTES, MAX_DETECTIONS_PER_IMAGE

__all__ = ["MotFrame", "MotSequence", "read_mot", "GT_FILE"]

GT_FILE = "gt.txt"


@dataclass
class MotFrame:
    """The ground truth of one frame: ``ids`` ``[N]`` int64, ``boxes`` ``[N, 4]`` float64 ``xyxy`` pixels, and
    ``ignored`` ``[M, 4]`` boxes of the objects not scored (flag 0)."""

    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    ignored: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))


@dataclass
class MotSequence:
    """One sequence: its ``name``, its ``frames`` (image paths in order) and the ground truth of each frame."""

    name: str
    frames: list[Path]
    truth: list[MotFrame]


def read_mot(root: str | Path) -> list[MotSequence]:
    """The sequences under ``root`` (see the module's layouts), in name order.

    Raises :class:`DataError` naming the folder when it holds no sequence, a sequence without frames, and naming the
    file and line for a line of ``gt.txt`` that breaks a rule (too few columns, not a number, a frame outside the
    sequence, an id below 0, a box without area, an id twice in a frame)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--track --data {root}: not a folder (give a MOTChallenge sequence folder SEQ with img1/ and "
                        f"gt/{GT_FILE}, a folder of such sequences, or a folder of frames with its {GT_FILE})")
    if (root / GT_FILE).is_file():
        return [_sequence(root.name, root, root / GT_FILE)]
    if (root / "gt" / GT_FILE).is_file():
        return [_sequence(root.name, root / "img1", root / "gt" / GT_FILE)]
    sequences = [_sequence(seq.name, seq / "img1", seq / "gt" / GT_FILE) for seq in sorted(root.iterdir())
                 if (seq / "gt" / GT_FILE).is_file()]
    if not sequences:
        raise DataError(f"{root}: no MOT ground truth: neither {GT_FILE}, gt/{GT_FILE} nor SEQ/gt/{GT_FILE} for a "
                        f"sequence folder SEQ")
    return sequences


def _sequence(name: str, images: Path, gt: Path) -> MotSequence:
    frames = sorted(p for p in images.iterdir() if p.is_file() and is_image(p)) if images.is_dir() else []
    if not frames:
        raise DataError(f"{images}: no frames (images) for the sequence of {gt}")
    return MotSequence(name, frames, _read_gt(gt, len(frames)))


def _read_gt(path: Path, frame_count: int) -> list[MotFrame]:
    if path.stat().st_size > MAX_DETECTIONS_FILE_BYTES:
        raise DataError(f"{path}: over {MAX_DETECTIONS_FILE_BYTES:,} bytes (ssd.limits.MAX_DETECTIONS_FILE_BYTES)")
    rows: list[dict[int, list[float]]] = [{} for _ in range(frame_count)]
    ignored: list[list[list[float]]] = [[] for _ in range(frame_count)]
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        frame, track_id, box, scored = _parse(line, f"{path}:{number}", frame_count)
        if not scored:
            ignored[frame - 1].append(box)
        elif track_id in rows[frame - 1]:
            raise DataError(f"{path}:{number}: id {track_id} twice in frame {frame}: an id is one object")
        else:
            rows[frame - 1][track_id] = box
            if len(rows[frame - 1]) > MAX_DETECTIONS_PER_IMAGE:
                raise DataError(f"{path}:{number}: over {MAX_DETECTIONS_PER_IMAGE:,} objects in frame {frame} "
                                "(ssd.limits.MAX_DETECTIONS_PER_IMAGE)")
    return [MotFrame(np.array(list(boxes), dtype=np.int64), np.array(list(boxes.values())).reshape(-1, 4),
                     np.array(hidden).reshape(-1, 4)) for boxes, hidden in zip(rows, ignored)]


def _parse(line: str, where: str, frame_count: int) -> tuple[int, int, list[float], bool]:
    """(frame, id, ``xyxy`` box, scored) of one line of ``gt.txt``."""
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) < 6:
        raise DataError(f"{where}: {len(cells)} columns, need at least 6: frame, id, left, top, width, height"
                        f"[, flag, class, visibility] (got {line.strip()[:80]!r})")
    try:
        values = [float(cell) for cell in cells[:7]]
    except ValueError:
        raise DataError(f"{where}: not a number in {line.strip()[:80]!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise DataError(f"{where}: a value that is not finite in {line.strip()[:80]!r}")
    frame, track_id, left, top, width, height = values[:6]
    if frame != int(frame) or not 1 <= frame <= frame_count:
        raise DataError(f"{where}: frame {cells[0]} is not one of the sequence's frames 1..{frame_count}")
    if track_id != int(track_id) or track_id < 0:
        raise DataError(f"{where}: id {cells[1]} is not a whole number >= 0")
    if width <= 0 or height <= 0:
        raise DataError(f"{where}: box of width {cells[4]} and height {cells[5]}: both must be > 0")
    scored = len(values) < 7 or values[6] != 0
    return int(frame), int(track_id), [left, top, left + width, top + height], scored
