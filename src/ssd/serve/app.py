"""The FastAPI app of ``ssd serve`` (:func:`create_app`).

Routes: ``POST /predict`` (an image as the body or a one-file multipart form; query options :data:`QUERY_OPTIONS`)
answers :meth:`ssd.inference.results.Result.to_dict` as JSON, or with ``draw=1`` the drawn image (PNG);
``GET /model`` the model card, ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /`` a page to try images
on, ``GET /samples`` and ``GET /samples/{name}`` the example images of ``samples`` (a folder).

Every error is JSON, ``{"error": message}``, with its status (400 bad option or image, 404, 405, 408 upload not
received in time, 413 upload or image too large, 415 wrong content type, 500 a server bug, never a traceback, 503 with
``Retry-After`` when ``max_pending`` requests are already in or the batcher is not running, 504 no answer within the
deadline); the server keeps serving after each. A client that goes away mid-upload is counted as 499 (nginx's "client
closed request"), not as an error of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
from collections.abc import Iterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ssd.data.images import decode_upload, is_image
from ssd.errors import ImageError, MissingInputError, RequestError
from ssd.inference.detector import Detector
from ssd.inference.results import Result
from ssd.limits import MAX_UPLOAD_BYTES
from ssd.optional import has_torch
from ssd.schemas import ServeConfig
from ssd.serve.batching import Batcher
from ssd.serve.card import model_card
from ssd.serve.metrics import MetricsMiddleware, ServerMetrics
from ssd.serve.request import QUERY_OPTIONS, parse_options, read_upload
from ssd.settings import Thresholds, check_thresholds

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["create_app", "QUERY_OPTIONS", "RETRY_AFTER_S", "CLIENT_GONE"]

RETRY_AFTER_S = 1
"""The ``Retry-After`` of a 503 answer, in seconds."""

CLIENT_GONE = 499
"""The status counted for a request whose client went away before its upload arrived (nginx's code)."""


def create_app(detector: Detector, *, score_threshold: float | None = ServeConfig.score_threshold,
               iou_threshold: float = ServeConfig.iou_threshold, max_detections: int = ServeConfig.max_detections,
               max_batch: int = ServeConfig.max_batch, max_wait_ms: float = ServeConfig.max_wait_ms,
               max_upload_bytes: int = MAX_UPLOAD_BYTES, samples: str | Path | None = ServeConfig.samples,
               max_pending: int = ServeConfig.max_pending, timeout: float = ServeConfig.timeout,
               idle_timeout: float = ServeConfig.idle_timeout, max_pixels: int = ServeConfig.max_pixels) -> FastAPI:
    """The app serving ``detector``.

    The thresholds are the defaults of requests that do not give ``conf``, ``iou``, ``max_det``
    (``score_threshold=None``: the model's best-F1 confidence, :meth:`Detector.confidence`). Concurrent requests are
    gathered into batches of up to ``max_batch`` images, waiting at most ``max_wait_ms`` for requests being decoded
    (:class:`~ssd.serve.batching.Batcher`; ``max_batch=1``: no batching). Bodies over ``max_upload_bytes`` are
    refused with 413. ``samples``: a folder whose images the page offers as examples.

    Bounds (``ssd serve``'s options, :class:`ssd.schemas.ServeConfig`): at most ``max_pending`` ``/predict``
    requests are in at once, from arrival to answer (more: 503 with ``Retry-After``); each has ``timeout`` s to be
    answered (408 while its upload is still arriving, else 504); an upload that sends nothing for ``idle_timeout`` s
    gets 408; an image is decoded near the model's input size (JPEG draft mode) and refused with 413 when it would
    still be over ``max_pixels`` pixels, from its header."""
    conf, origin = detector.confidence(score_threshold)
    check_thresholds(conf, iou_threshold, max_detections)
    defaults = Thresholds(conf, iou_threshold, max_detections)
    sample_files = _samples(samples)
    card = {**model_card(detector.backend),
            "thresholds": {"conf": conf, "conf_origin": origin, "iou": iou_threshold, "max_det": max_detections},
            "batching": {"max_batch": max_batch, "max_wait_ms": max_wait_ms}}
    input_size = detector.card.image_size
    admitted = _Admission(max_pending)
    metrics = ServerMetrics()
    batcher = Batcher(detector, max_batch, max_wait_ms, metrics.batch_size.observe)
    page = files("ssd.serve").joinpath("page.html").read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="ssd serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.card, app.state.batcher = card, batcher
    app.state.timeout, app.state.idle_timeout = timeout, idle_timeout  # for uvicorn's settings (serve.connections)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    _add_error_handlers(app)

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        options = parse_options(request.query_params.multi_items(), detector, defaults)
        if options.draw and not has_torch():  # the drawing is torchvision's
            raise RequestError("draw=1 needs PyTorch, which this server's runtime lacks (ask for the JSON "
                               "detections, without draw)", 501)
        received = False
        with admitted():
            try:
                async with asyncio.timeout(timeout):
                    data, name = await read_upload(request, max_upload_bytes, idle_timeout)
                    received = True
                    with batcher.arriving():
                        image, size = await run_in_threadpool(_decoded, data, name, input_size, max_pixels)
                    del data  # the bytes are not needed while the request waits for its batch
                    found = await batcher.detect(image, options.detect_options)
                    if options.draw:  # on the image as decoded
                        png = await run_in_threadpool(_drawn, image, found, detector.class_names)
                        return Response(png, media_type="image/png")
            except TimeoutError:
                if received:
                    raise RequestError(f"no answer within the request deadline of {timeout:g} s (--timeout); the "
                                       "request can be retried", 504) from None
                raise RequestError(f"upload not received within the request deadline of {timeout:g} s (--timeout)",
                                   408) from None
        return JSONResponse({**_scaled(found, size).to_dict(), "file": None if name == "upload" else name})

    @app.get("/model")
    async def model() -> dict:
        return card

    @app.get("/health")
    async def health() -> JSONResponse:
        problem = batcher.problem()
        if problem is not None:
            return JSONResponse({"status": "not ready", "error": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/samples")
    async def sample_names() -> list[str]:
        return sorted(sample_files)

    @app.get("/samples/{name}")
    async def sample(name: str) -> FileResponse:
        if name not in sample_files:
            raise HTTPException(404, f"no sample image {name!r} (samples: {', '.join(sorted(sample_files)) or 'none'})")
        return FileResponse(sample_files[name])

    return app


def _samples(folder: str | Path | None) -> dict[str, Path]:
    """The images directly inside ``folder`` by file name (only these are served: no path reaches elsewhere)."""
    if folder is None:
        return {}
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingInputError(f"samples folder {folder} does not exist")
    return {p.name: p for p in folder.iterdir() if p.is_file() and is_image(p)}


class _Admission:
    """At most ``limit`` requests inside at once: ``with admitted():`` raises a 503 :class:`RequestError` past it."""

    def __init__(self, limit: int):
        self.limit, self.inside = limit, 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.inside >= self.limit:
            raise RequestError(f"server busy: {self.limit} requests already in (--max-pending); retry later", 503)
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1


def _decoded(data: bytes, name: str, input_size: tuple[int, int], max_pixels: int) -> tuple[Tensor, tuple[int, int]]:
    """The upload decoded near ``input_size`` (:func:`ssd.data.images.decode_upload`), and its whole size; an image
    over ``max_pixels`` is a 413."""
    try:
        return decode_upload(data, name, input_size, max_pixels)
    except ImageError as e:
        if e.code == "too_many_pixels":
            raise RequestError(f"{e} (--max-pixels)", 413) from None
        raise


def _scaled(result: Result, size: tuple[int, int]) -> Result:
    """``result`` of an image decoded at a reduced scale, in the pixels of the whole picture ``size`` (width,
    height)."""
    width, height = size
    if (width, height) == (result.width, result.height):
        return result
    factor = [width / result.width, height / result.height] * 2
    boxes = result.boxes  # a tensor, or numpy on the runtime without PyTorch
    boxes = boxes * np.float32(factor) if isinstance(boxes, np.ndarray) else boxes * boxes.new_tensor(factor)
    return dataclasses.replace(result, boxes=boxes, width=width, height=height)


def _drawn(image: Tensor, result: Result, class_names: list[str]) -> bytes:
    """The image with its detections drawn (:func:`ssd.plots.draw_detections`), as PNG bytes."""
    from ssd.plots import draw_detections

    drawn = draw_detections(image, result.boxes, result.labels, result.scores, class_names)
    buffer = io.BytesIO()
    Image.fromarray(drawn.permute(1, 2, 0).numpy()).save(buffer, format="PNG")
    return buffer.getvalue()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": message}``: the request's fault with its reason, a server fault without a
    traceback (the server's log has it)."""

    @app.exception_handler(RequestError)
    async def refused(_request: Request, e: RequestError) -> JSONResponse:
        answer = _error(e.status, str(e))
        if e.status == 503:
            answer.headers["Retry-After"] = str(RETRY_AFTER_S)
        return answer

    @app.exception_handler(ClientDisconnect)
    async def gone(_request: Request, _e: ClientDisconnect) -> Response:
        return Response(status_code=CLIENT_GONE)  # sent nowhere: for the metrics, and no traceback in the log

    @app.exception_handler(ImageError)
    async def bad_image(_request: Request, e: ImageError) -> JSONResponse:
        return _error(400, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        return _error(400, "; ".join(str(error.get("msg")) for error in e.errors()))

    @app.exception_handler(Exception)
    async def server_fault(_request: Request, e: Exception) -> JSONResponse:
        return _error(500, f"internal server error ({type(e).__name__}); the request can be retried")
