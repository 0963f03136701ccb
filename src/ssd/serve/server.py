"""``ssd serve``: open a model, build its app (:func:`ssd.serve.app.create_app`) and run it with uvicorn."""

from __future__ import annotations

import ipaddress
import os
import socket
import warnings

from ssd.errors import ConfigError
from ssd.optional import has_torch, require
from ssd.schemas import ServeConfig

__all__ = ["ServeWarning", "serve", "exposure_warning"]


class ServeWarning(UserWarning):
    """The server is reachable from other machines."""


def exposure_warning(host: str) -> str | None:
    """What binding ``host`` exposes, or ``None`` for a loopback address (this machine only)."""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to any interface
        pass
    return (f"serving on {host}: other machines that reach it can send images and read the model card; the server "
            f"has no authentication or TLS, so put it behind a proxy that adds them, or bind {ServeConfig.host}")


def serve(config: ServeConfig) -> None:
    """Serve ``config.weights`` (anything :func:`ssd.inference.detector.load` opens) on ``config.host:port`` until
    interrupted; ``config``: ``ssd serve``'s options (:class:`ssd.schemas.ServeConfig`, which checked them when it was
    made: a bad one raised :class:`ssd.errors.ConfigError` naming its flag). The port is taken before the
    model is opened (a port in use fails at once; port 0 takes a free one), and the line ``serving ... on
    http://HOST:PORT ...`` is printed once it accepts connections. See :func:`ssd.serve.app.create_app` for the routes
    and the other options. A host other than a loopback address is served with a :class:`ServeWarning`.

    ``threads``: PyTorch's intra-op threads in this process (pre- and post-processing, and the layers of a ``.pt``
    network; ``0`` or ``None`` leaves PyTorch's default, one per core). The default 1 is set because a server's
    concurrent requests already keep the cores busy, and PyTorch's thread pool costs several times the work of one
    small image in waits (``benchmarks/serve.py``); ONNX Runtime and OpenVINO keep their own threads.

    ``max_pending``, ``timeout``, ``idle_timeout``, ``max_pixels``: the server's bounds (:func:`create_app`,
    :func:`ssd.serve.connections.uvicorn_config`). On SIGTERM or Ctrl-C it stops accepting, lets the requests in
    flight finish for up to ``timeout`` s, and returns."""
    require("uvicorn", "serve", "ssd serve")
    require("fastapi", "serve", "ssd serve")
    import uvicorn

    from ssd.inference.detector import load
    from ssd.serve.app import create_app
    from ssd.serve.connections import uvicorn_config

    host = config.host
    with _listen(host, config.port) as sock:
        if config.threads and has_torch():  # 0 or None: PyTorch's default (ONNX Runtime and OpenVINO keep their own)
            import torch

            torch.set_num_threads(config.threads)
        detector = load(config.weights, device=config.device, half=config.half)
        app = create_app(detector, **config.values("weights", "host", "port", "device", "half", "threads"))
        warning = exposure_warning(host)
        if warning is not None:
            warnings.warn(ServeWarning(warning), stacklevel=2)
        conf = app.state.card["thresholds"]
        batching = (f"batches of up to {config.max_batch} within {config.max_wait_ms:g} ms" if config.max_batch > 1
                    else "no batching")
        url_host = f"[{host}]" if ":" in host else host
        print(f"serving {detector.card.model_name} ({detector.backend.name}) on "
              f"http://{url_host}:{sock.getsockname()[1]} (conf {conf['conf']:g}: {conf['conf_origin']}; {batching})",
              flush=True)
        uvicorn.Server(uvicorn_config(app)).run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (connections wait in its backlog until the server accepts them; the port
    checked by :class:`ssd.schemas.ServeConfig`)."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    backlog=2048)
    except OSError as e:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there "
                          f"({os.strerror(e.errno) if e.errno else e})") from None
