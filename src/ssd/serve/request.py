"""What a ``POST /predict`` request asks for: its query options, checked (:func:`parse_options`), and its image bytes,
read under the upload bound (:func:`read_upload`). Every refusal is a :class:`RequestError` carrying its HTTP status,
which the app sends as JSON."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from ssd.errors import ConfigError, RequestError
from ssd.inference.detector import Detector
from ssd.limits import MAX_DETECTIONS, value_text
from ssd.names import did_you_mean
from ssd.settings import Thresholds, check_thresholds

__all__ = ["QUERY_OPTIONS", "ACCEPTED_TYPES", "PredictOptions", "parse_options", "read_upload"]

QUERY_OPTIONS = ("conf", "iou", "max_det", "classes", "draw")
"""The query options of ``POST /predict``: the ``ssd predict`` thresholds (``--conf``, ``--iou``, ``--max-det``), the
classes to keep (names or labels, comma-separated) and ``draw=1`` (answer with the drawn image)."""

_THRESHOLD_NAMES = {"score_threshold": "conf", "iou_threshold": "iou", "max_detections": "max_det"}

ACCEPTED_TYPES = ("multipart/form-data", "image/*", "application/octet-stream")
"""Content types of an upload: a form with one file part, or the image file's bytes as the body."""


@dataclass(frozen=True)
class PredictOptions:
    """One request's options: thresholds and the labels to keep (``None``: all) as
    :meth:`ssd.inference.detector.Detector.detect` takes them, and whether to answer with the drawn image."""

    score_threshold: float
    iou_threshold: float
    max_detections: int
    classes: tuple[int, ...] | None = None
    draw: bool = False

    @property
    def detect_options(self) -> dict[str, Any]:
        """The keyword arguments of ``Detector.detect``; requests with equal ones can share a batch."""
        return dict(score_threshold=self.score_threshold, iou_threshold=self.iou_threshold,
                    max_detections=self.max_detections, classes=self.classes)


def parse_options(items: Sequence[tuple[str, str]], detector: Detector, defaults: Thresholds) -> PredictOptions:
    """The query ``items`` (name, value pairs) of a request, checked: unknown names are answered with the closest
    valid ones, a repeated name or a value out of range names the option, the value and the rule; ``classes`` are
    read by ``detector`` (:meth:`~ssd.inference.detector.Detector.class_indices`)."""
    given: dict[str, str] = {}
    for name, value in items:
        if name not in QUERY_OPTIONS:
            raise RequestError(f"unknown query option {value_text(name)}{did_you_mean(name, QUERY_OPTIONS)} "
                               f"(options: {', '.join(QUERY_OPTIONS)})")
        if name in given:
            raise RequestError(f"query option {name} given twice ({value_text(given[name])}, {value_text(value)}): "
                               "give it once")
        given[name] = value
    conf = _number(given, "conf", float, defaults.score_threshold)
    iou = _number(given, "iou", float, defaults.iou_threshold)
    max_det = _number(given, "max_det", int, defaults.max_detections)
    if max_det > MAX_DETECTIONS:  # a top-k of 2**63 would fail inside the network's post-processing: a 500
        raise RequestError(f"max_det must be at most {MAX_DETECTIONS:,} (ssd.limits.MAX_DETECTIONS), got {max_det}")
    classes = None
    try:
        check_thresholds(conf, iou, max_det, names=_THRESHOLD_NAMES)
        if "classes" in given:
            classes = tuple(sorted(set(detector.class_indices([c.strip() for c in given["classes"].split(",")]))))
    except ConfigError as e:
        raise RequestError(str(e)) from None
    draw = given.get("draw", "0").lower()
    if draw not in ("0", "1", "true", "false"):
        raise RequestError(f"draw must be 1 or 0 (true or false), got {value_text(given['draw'])}")
    return PredictOptions(conf, iou, max_det, classes, draw in ("1", "true"))


def _number(given: dict[str, str], name: str, kind: type, default: float | int) -> float | int:
    if name not in given:
        return default
    try:
        return kind(given[name])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise RequestError(f"{name} must be {what}, got {value_text(given[name])}") from None


async def _limited(request: Request, limit: int, idle_timeout: float) -> AsyncIterator[bytes]:
    """The request body's chunks, refused with 413 once more than ``limit`` bytes have arrived (a body without a
    ``Content-Length``, or one longer than it said), and with 408 when no byte arrives for ``idle_timeout`` s."""
    received, chunks = 0, request.stream()
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RequestError(f"upload stalled: no byte for {idle_timeout:g} s (--idle-timeout) after "
                               f"{received:,} bytes", 408) from None
        received += len(chunk)
        if received > limit:
            raise RequestError(_too_large(limit), 413)
        yield chunk


def _too_large(limit: int) -> str:
    return f"upload over the limit of {limit:,} bytes (ssd.limits.MAX_UPLOAD_BYTES)"


async def read_upload(request: Request, limit: int, idle_timeout: float) -> tuple[bytes, str]:
    """The image file a request carries, and its name for messages (the form's file name, else ``upload``).

    A ``Content-Length`` over ``limit`` is refused before any of the body is read; a form needs exactly one file
    part; a body of another content type than :data:`ACCEPTED_TYPES` is refused with 415; an upload that stalls for
    ``idle_timeout`` s with 408."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise RequestError(_too_large(limit), 413)
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "multipart/form-data":
        return await _form_file(request, limit, idle_timeout)
    if media and not (media.startswith("image/") or media == "application/octet-stream"):
        raise RequestError(f"content type {value_text(media)} is not an upload: send {', '.join(ACCEPTED_TYPES)}", 415)
    body = b"".join([chunk async for chunk in _limited(request, limit, idle_timeout)])
    if not body:
        raise RequestError("empty body: send an image file's bytes, or a multipart form with one file part")
    return body, "upload"


async def _form_file(request: Request, limit: int, idle_timeout: float) -> tuple[bytes, str]:
    parser = MultiPartParser(request.headers, _limited(request, limit, idle_timeout), max_files=1, max_fields=0,
                             max_part_size=limit)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise RequestError(f"multipart form: {e.message} (send one file part and no other field)") from None
    files = [value for _, value in form.multi_items() if not isinstance(value, str)]
    if not files:
        raise RequestError("multipart form without a file part: send the image as a file")
    try:
        data = await files[0].read()
    finally:
        await form.close()
    if not data:
        raise RequestError(f"empty file part {value_text(files[0].filename)}: send an image")
    return data, files[0].filename or "upload"
