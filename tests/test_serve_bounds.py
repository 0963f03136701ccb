"""``ssd serve`` under pressure: a full server says 503, a late answer 504, a stalled upload 408, idle connections are
closed, a dead batcher is not ready, SIGTERM drains what is in flight. The slow backend is a gate (events), not time."""

import concurrent.futures
import io
import logging
import socket
import threading

import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="ssd serve needs the [serve] extra: pip install 'ssd-detect[serve]'")
pytest.importorskip("uvicorn", reason="ssd serve needs the [serve] extra: pip install 'ssd-detect[serve]'")
httpx = pytest.importorskip("httpx", reason="ssd.client needs the [serve] extra: pip install 'ssd-detect[serve]'")

from serving import connect, read_answer, running, upload_head  # noqa: E402
from ssd.client import Client  # noqa: E402
from ssd.data.images import decode_image, decode_upload  # noqa: E402
from ssd.errors import ImageError, ServerError  # noqa: E402
from ssd.inference.detector import load  # noqa: E402
from ssd.serve.app import create_app  # noqa: E402

WAIT = 60  # seconds any event of these tests may take on a loaded machine before the test fails


class Gated:
    """The detector, whose ``detect`` signals ``entered`` and then waits for ``release``: a backend as slow as the
    test wants."""

    def __init__(self, detector):
        self.detector, self.entered, self.release = detector, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.detector, name)

    def detect(self, images, **options):
        self.entered.set()
        assert self.release.wait(WAIT)
        return self.detector.detect(images, **options)


@pytest.fixture(scope="module")
def detector(tiny_checkpoint):
    return load(tiny_checkpoint)


def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    image = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    buffer = io.BytesIO()
    Image.fromarray(image.numpy()).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _post(url: str, data: bytes, **options) -> httpx.Response:
    return httpx.post(f"{url}/predict", content=data, headers={"Content-Type": "image/jpeg"}, timeout=WAIT, **options)


def _metric(url: str, status: int) -> float:
    line = f'ssd_requests_total{{route="/predict",status="{status}"}} '
    text = httpx.get(f"{url}/metrics").text
    return next((float(row.rsplit(" ", 1)[1]) for row in text.splitlines() if row.startswith(line)), 0.0)


def test_a_full_server_answers_503_with_retry_after_and_a_late_answer_is_504(detector):
    gated, jpeg = Gated(detector), _jpeg(64, 48)
    app = create_app(gated, max_batch=1, max_pending=1, timeout=1.0)
    with running(app) as (url, _), concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_post, url, jpeg)
        assert gated.entered.wait(WAIT)  # the first request is in the network, the server is full
        busy = _post(url, jpeg)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json() == {"error": "server busy: 1 requests already in (--max-pending); retry later"}
        late = first.result(WAIT)  # its deadline passes while the backend holds it
        assert late.status_code == 504
        assert late.json() == {"error": "no answer within the request deadline of 1 s (--timeout); the request can be "
                                        "retried"}
        gated.release.set()
        assert _post(url, jpeg).status_code == 200  # it keeps serving
        assert (_metric(url, 503), _metric(url, 504), _metric(url, 200)) == (1, 1, 1)


def test_a_dead_batcher_fails_the_waiting_request_and_health_says_not_ready(detector):
    gated, jpeg = Gated(detector), _jpeg(64, 48)
    app = create_app(gated, max_batch=1)
    with running(app) as (url, _), concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        waiting = pool.submit(_post, url, jpeg)
        assert gated.entered.wait(WAIT)
        task = app.state.batcher._task
        task.get_loop().call_soon_threadsafe(task.cancel)  # the batching task dies under a request
        answer = waiting.result(WAIT)
        assert answer.status_code == 503
        assert answer.json() == {"error": "server not ready: the batching task has ended (stopped)"}
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503
        assert health.json() == {"status": "not ready", "error": "the batching task is not running (stopped)"}
        refused = _post(url, jpeg)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        gated.release.set()


def test_a_failing_backend_makes_health_not_ready_until_a_batch_succeeds(detector):
    gated = Gated(detector)
    gated.release.set()
    app = create_app(gated, max_batch=1)
    with running(app) as (url, _):
        gated.detect = lambda images, **options: (_ for _ in ()).throw(RuntimeError("device lost"))
        assert _post(url, _jpeg(64, 48)).status_code == 500
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503
        assert health.json() == {"status": "not ready", "error": "the last batch failed (RuntimeError: device lost)"}
        del gated.detect  # the backend is back
        assert _post(url, _jpeg(64, 48)).status_code == 200
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_idle_and_half_sent_connections_are_closed_and_a_stalled_upload_gets_408(detector, caplog):
    app = create_app(detector, idle_timeout=0.2)
    with running(app) as (url, _):
        with connect(url) as idle:  # sends nothing at all
            assert idle.recv(1) == b""
        with connect(url) as half_head:  # a request head that never ends
            half_head.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
            assert half_head.recv(1) == b""
        with connect(url) as stalled:  # an upload that stops after 10 of its 1000 bytes
            stalled.sendall(upload_head(1000).encode() + b"\0" * 10)
            status, _, answer = read_answer(stalled)
        assert status == 408
        assert answer == {"error": "upload stalled: no byte for 0.2 s (--idle-timeout) after 10 bytes"}
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addHandler(caplog.handler)
        try:
            with connect(url) as gone:  # a client that goes away in the middle of its upload
                gone.sendall(upload_head(1000).encode() + b"\0" * 10)
            # the server has counted it once the next request on the same event loop is answered after it
            for _ in range(1000):
                if _metric(url, 499) == 1:
                    break
        finally:
            uvicorn_log.removeHandler(caplog.handler)
        assert (_metric(url, 499), _metric(url, 500)) == (1, 0)
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert _post(url, _jpeg(64, 48)).status_code == 200


def test_a_lone_request_is_not_held_back_by_a_slow_uploader(detector):
    app = create_app(detector, max_batch=8, max_wait_ms=10_000)
    with running(app) as (url, _), connect(url) as slow:
        slow.sendall(upload_head(1000).encode() + b"\0" * 10)  # still uploading: not waited for
        with httpx.Client(timeout=5) as client:  # far less than the 10 s the batch could wait
            answer = client.post(f"{url}/predict", content=_jpeg(64, 48), headers={"Content-Type": "image/jpeg"})
        assert answer.status_code == 200


def test_sigterm_drains_the_request_in_flight_and_a_half_sent_upload_does_not_hold_the_server(detector):
    gated = Gated(detector)
    app = create_app(gated, max_batch=1, idle_timeout=0.5)
    with running(app) as (url, server), concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(_post, url, _jpeg(64, 48))
        assert gated.entered.wait(WAIT)
        half_sent = connect(url)
        half_sent.sendall(upload_head(1000).encode())
        server.should_exit = True  # what uvicorn's SIGTERM handler does
        gated.release.set()
        assert in_flight.result(WAIT).status_code == 200
        status, _, _ = read_answer(half_sent)
        assert status == 408
    # running() has checked that the server's thread ended


def test_an_upload_is_decoded_near_the_model_size_and_answered_in_its_own_pixels(detector):
    jpeg = _jpeg(1280, 1024, seed=3)
    image, whole = decode_upload(jpeg, "upload", (128, 128), max_pixels=100_000)
    assert tuple(image.shape) == (3, 128, 160) and whole == (1280, 1024)  # JPEG draft: 1/8 scale
    expected = detector.detect([decode_image(jpeg, min_size=128)])[0]
    with running(create_app(detector, max_pixels=100_000)) as (url, _):
        answer = _post(url, jpeg).json()
        png = io.BytesIO()
        Image.new("RGB", (400, 300)).save(png, format="PNG")
        refused = _post(url, png.getvalue())
    assert (answer["width"], answer["height"]) == (1280, 1024) and len(answer["detections"]) > 0
    torch.testing.assert_close(torch.tensor([d["box"] for d in answer["detections"]]), expected.boxes * 8)
    assert refused.status_code == 413
    assert refused.json()["error"] == ("upload: 400x300 = 120,000 pixels to decode exceed the limit of 100,000 "
                                       "(--max-pixels)")
    with pytest.raises(ImageError, match="400x300 = 120,000 pixels") as caught:
        decode_upload(png.getvalue(), "a.png", (128, 128), max_pixels=100_000)
    assert caught.value.code == "too_many_pixels"


def test_a_client_of_a_server_that_is_down_raises_one_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nothing listens once it is closed
    with Client(f"http://127.0.0.1:{port}") as client, pytest.raises(ServerError) as caught:
        client.health()
    assert caught.value.status is None
    assert str(caught.value).startswith(f"GET http://127.0.0.1:{port}/health: no answer from the server (ConnectError:")
    assert "\n" not in str(caught.value)
