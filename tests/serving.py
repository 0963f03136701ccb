"""A real uvicorn server in a thread on a free 127.0.0.1 port, with ``ssd serve``'s settings, and raw HTTP requests
for what a well-behaved client would not send (half-sent uploads, idle connections). tests/ is on the path:
``from serving import running``."""

import contextlib
import json
import socket
import struct
import threading
import zlib

from ssd.serve.connections import uvicorn_config


@contextlib.contextmanager
def running(app):
    """``app`` served in a thread with :func:`ssd.serve.connections.uvicorn_config`; yields the base URL and the
    ``uvicorn.Server`` (``server.should_exit = True`` is what SIGTERM does). The socket listens before the server
    starts, so the first request waits in its backlog instead of racing the start."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn_config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
    assert not thread.is_alive()


def connect(url: str, timeout: float = 30) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The status, headers (lower-case names) and JSON body of the answer arriving on ``sock``."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ", 2)[1]), headers, json.loads(body)


def raw_request(url: str, head: str, body: bytes) -> tuple[int, dict]:
    """Send ``head`` and ``body`` on a plain socket, read the answer: for uploads a client would not finish."""
    with connect(url) as sock:
        sock.sendall(head.encode() + body)
        status, _, answer = read_answer(sock)
    return status, answer


def upload_head(length: int) -> str:
    """The head of a ``POST /predict`` of ``length`` bytes of JPEG."""
    return f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: {length}\r\n\r\n"


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` gray pixels, with one row of data: refused from the header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1)))
            + chunk(b"IEND", b""))
