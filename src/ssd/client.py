"""A client of ``ssd serve``: :class:`Client` sends images and returns the same
:class:`~ssd.inference.results.Result` objects as ``ssd.load(...).predict`` (httpx, the ``[serve]`` extra). It loads
neither the detector nor PyTorch to do so: its results hold tensors when PyTorch is installed, numpy arrays else."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ssd.errors import ServerError
from ssd.inference.results import Result
from ssd.optional import has_torch, require

__all__ = ["Client"]


class Client:
    """``Client("http://127.0.0.1:8000").predict("image.jpg")`` -> ``[Result]``; ``timeout`` in seconds per
    request. Use it as a context manager, or :meth:`close` it, to close its connections."""

    def __init__(self, url: str, timeout: float = 60.0):
        httpx = require("httpx", "serve", "ssd.client.Client")
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._transport_error = httpx.TransportError

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def predict(self, source: str | Path | Sequence[str | Path], *, score_threshold: float | None = None,
                iou_threshold: float | None = None, max_detections: int | None = None,
                classes: Sequence[str | int] | None = None) -> list[Result]:
        """Detections of one image file or a list of them, one :class:`Result` per image in order (``path``: the
        file as given); thresholds not given are the server's defaults; ``classes``: names or labels to keep.

        Raises :class:`ServerError` with the server's reason for a refused request, or when no answer came."""
        paths = list(source) if isinstance(source, (list, tuple)) else [source]
        query: dict[str, Any] = {key: value for key, value in (("conf", score_threshold), ("iou", iou_threshold),
                                                               ("max_det", max_detections)) if value is not None}
        if classes is not None:
            query["classes"] = ",".join(map(str, classes))
        results = []
        for path in paths:
            results.append(_result(self._json("POST", "/predict", params=query, content=Path(path).read_bytes(),
                                              headers={"Content-Type": "application/octet-stream"}), str(path)))
        return results

    def model(self) -> dict[str, Any]:
        """The server's model card (``GET /model``)."""
        return self._json("GET", "/model")

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/health")

    def _json(self, method: str, path: str, **request: Any) -> Any:
        """The JSON answer of a request; :class:`ServerError` for a refusal, or with status ``None`` when no answer
        came (the server is down, unreachable or too slow)."""
        try:
            response = self._http.request(method, path, **request)
        except self._transport_error as e:
            raise ServerError(f"{method} {self.url}{path}: no answer from the server ({type(e).__name__}: "
                              f"{e or 'no reason given'})", None) from None
        if response.is_success:
            return response.json()
        try:
            message = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise ServerError(f"{response.request.method} {response.request.url}: {response.status_code} {message}",
                          response.status_code)


def _result(answer: dict[str, Any], path: str) -> Result:
    """A ``/predict`` answer (:meth:`Result.to_dict`) back to a :class:`Result`: JSON numbers are the float32 values
    written exactly, so the arrays are equal to the server's (tensors when PyTorch is installed, as
    ``ssd.load(...).predict`` gives)."""
    detections = answer["detections"]
    arrays = (np.array([d["box"] for d in detections], dtype=np.float32).reshape(-1, 4),
              np.array([d["score"] for d in detections], dtype=np.float32),
              np.array([d["label"] for d in detections], dtype=np.int64))
    if has_torch():
        import torch

        arrays = tuple(torch.from_numpy(array) for array in arrays)
    boxes, scores, labels = arrays
    return Result(boxes=boxes, scores=scores, labels=labels, names=[d["name"] for d in detections],
                  width=answer["width"], height=answer["height"], path=path)
