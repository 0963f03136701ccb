"""How ``ssd serve`` runs uvicorn so that connections cannot pin it: :func:`uvicorn_config`.

uvicorn bounds a connection's idle time only between requests, and restarts that timer at every byte. A connection that
sends nothing, or a request head a byte at a time, would hold its socket forever; :class:`BoundedH11Protocol` closes a
connection whose next request head has not wholly arrived within ``idle_timeout`` of its opening or of its last answer.
A stalled upload is the app's to refuse (408, :func:`ssd.serve.request.read_upload`), and a slow but steady one meets
the request deadline.
"""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ssd.limits import MAX_CONNECTIONS

__all__ = ["BoundedH11Protocol", "uvicorn_config"]


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline (``timeout_keep_alive``) on the arrival of each request head."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self._in_request():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn's settings for an app of :func:`ssd.serve.app.create_app`, from its bounds (``app.state``): idle
    connections closed after its ``idle_timeout`` (:class:`BoundedH11Protocol`), at most
    :data:`ssd.limits.MAX_CONNECTIONS` connections and requests (more: 503 from uvicorn), and on SIGTERM or Ctrl-C the
    requests in flight given its request ``timeout`` to finish before they are cancelled and the server exits."""
    return uvicorn.Config(app, http=BoundedH11Protocol, log_level=log_level, access_log=False,
                          limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=app.state.idle_timeout,
                          timeout_graceful_shutdown=app.state.timeout)
