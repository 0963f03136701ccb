"""``ssd serve``: a real uvicorn server on a free 127.0.0.1 port (in a thread), driven by real HTTP clients."""

import asyncio
import io
import re
import select
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="ssd serve needs the [serve] extra: pip install 'ssd-detect[serve]'")
pytest.importorskip("uvicorn", reason="ssd serve needs the [serve] extra: pip install 'ssd-detect[serve]'")
httpx = pytest.importorskip("httpx", reason="ssd.client needs the [serve] extra: pip install 'ssd-detect[serve]'")


from serving import bomb_png, connect, raw_request, read_answer, running, upload_head  # noqa: E402
from ssd.card import ModelCard  # noqa: E402
from ssd.cli import main  # noqa: E402
from ssd.client import Client  # noqa: E402
from ssd.errors import ServerError  # noqa: E402
from ssd.inference.detector import load  # noqa: E402
from ssd.limits import MAX_UPLOAD_BYTES  # noqa: E402
from ssd.serve.app import create_app  # noqa: E402
from ssd.serve.card import model_card  # noqa: E402
from ssd.serve.server import exposure_warning  # noqa: E402
from ssd.settings import Thresholds  # noqa: E402

CONCURRENT = 32
TOP = 3  # detections compared per image in the concurrency test (max_det)


def _jpeg(image: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def detector(tiny_checkpoint):
    return load(tiny_checkpoint)


@pytest.fixture(scope="module")
def images(tmp_path_factory, detector):
    """``CONCURRENT`` JPEG files of distinct sizes whose top ``TOP + 1`` scores are at least 1e-4 apart, so that the
    float rounding of another batch composition (about 1e-6) cannot reorder them."""
    folder = tmp_path_factory.mktemp("serve_images")
    candidates = []
    for i in range(CONCURRENT + 16):
        generator = torch.Generator().manual_seed(i)
        candidates.append(folder / f"image{i}.jpg")
        image = torch.randint(0, 256, (3, 48 + 3 * i, 64 + 2 * i), dtype=torch.uint8, generator=generator)
        candidates[-1].write_bytes(_jpeg(image))
    found = detector.predict(candidates, max_detections=TOP + 1, batch_size=len(candidates))
    paths = [path for path, result in zip(candidates, found)
             if len(result.scores) == TOP + 1 and bool((result.scores[:-1] - result.scores[1:] > 1e-4).all())]
    assert len(paths) >= CONCURRENT
    return paths[:CONCURRENT]


@pytest.fixture(scope="module")
def server(detector, images):
    app = create_app(detector, max_batch=8, max_wait_ms=20, samples=images[0].parent)
    with running(app) as (url, _):
        yield url


def _assert_close(answer: dict, expected) -> None:
    """A ``/predict`` answer against a ``Result``: the same image and detections, up to the float rounding of
    another batch composition."""
    assert (answer["width"], answer["height"]) == (expected.width, expected.height)
    detections = answer["detections"]
    assert [d["label"] for d in detections] == expected.labels.tolist()
    assert [d["name"] for d in detections] == expected.names
    torch.testing.assert_close(torch.tensor([d["box"] for d in detections]), expected.boxes, rtol=0, atol=1e-3)
    torch.testing.assert_close(torch.tensor([d["score"] for d in detections]), expected.scores, rtol=0, atol=1e-5)


def test_predict_equals_detector_predict_exactly(server, detector, images):
    path = images[0]
    expected = detector.predict(path)[0]
    with Client(server) as client:
        (result,) = client.predict(path)
        card = client.model()
        assert client.health() == {"status": "ok"}
    for name in ("boxes", "scores", "labels"):
        assert torch.equal(getattr(result, name), getattr(expected, name)), name
    assert (result.names, result.width, result.height, result.path) == (
        expected.names, expected.width, expected.height, expected.path)
    assert len(result.boxes) > 0
    # a multipart form gives the same answer, named by its file name
    answer = httpx.post(f"{server}/predict", files={"image": (path.name, path.read_bytes(), "image/jpeg")}).json()
    assert answer == {**expected.to_dict(), "file": path.name}
    assert card["name"] == "ssd_tiny" and card["format"] == "torch"
    assert card["classes"] == ["circle", "square", "triangle"] and card["input_size"] == {"height": 128, "width": 128}
    assert card["thresholds"] == {"conf": 0.25, "conf_origin": "default", "iou": 0.45, "max_det": 100}
    assert card["operating_point"] is None and card["file"] == "best.pt" and card["nms"] is None
    assert card["checksum"] == (detector.card.checksum or {}).get("sha256")


def test_concurrent_requests_are_each_answered_with_their_own_image(server, detector, images):
    expected = detector.predict(images, max_detections=TOP, batch_size=len(images))
    before = _metric(server, "ssd_batch_size_sum")

    async def send_all():
        async with httpx.AsyncClient(base_url=server, timeout=60,
                                     limits=httpx.Limits(max_connections=CONCURRENT)) as client:
            return await asyncio.gather(*[
                client.post("/predict", params={"max_det": TOP}, content=path.read_bytes(),
                            headers={"Content-Type": "image/jpeg"}) for path in images])

    answers = asyncio.run(send_all())
    for answer, want in zip(answers, expected):
        assert answer.status_code == 200, answer.text
        _assert_close(answer.json(), want)
    # every image went through exactly one batch; the batch-size histogram counts them all
    assert _metric(server, "ssd_batch_size_sum") - before == CONCURRENT


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next((line for line in text.splitlines() if line.startswith(name + labels + " ")), None)
    return 0.0 if line is None else float(line.rsplit(" ", 1)[1])


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, before the refusal
def test_bad_requests_get_a_json_reason_and_the_server_keeps_serving(server, images):
    jpeg = images[1].read_bytes()
    raw = {"Content-Type": "image/jpeg"}
    cases = [  # (what, request, status, words of the reason)
        ("empty body", dict(content=b"", headers=raw), 400, "empty body"),
        ("truncated JPEG", dict(content=jpeg[: len(jpeg) // 2], headers=raw), 400, "upload: image does not decode"),
        ("not an image", dict(content=b"hello, world", headers=raw), 400, "not an image"),
        ("decompression bomb", dict(content=bomb_png(10_000, 10_000), headers=raw), 400,
         "10000x10000 = 100,000,000 pixels exceed the limit of 89,478,485"),
        ("81 MP PNG of 300 bytes", dict(content=bomb_png(9_000, 9_000), headers=raw), 413,
         "9000x9000 = 81,000,000 pixels to decode exceed the limit of 16,777,216 (--max-pixels)"),
        ("max_det of 2**63", dict(params={"max_det": str(2**63)}, content=jpeg, headers=raw), 400,
         "max_det must be at most 10,000 (ssd.limits.MAX_DETECTIONS), got 9223372036854775808"),
        ("wrong content type", dict(content=b'{"image": 1}', headers={"Content-Type": "application/json"}), 415,
         "content type 'application/json' is not an upload"),
        ("unknown option", dict(params={"cnf": "0.5"}, content=jpeg, headers=raw), 400,
         "unknown query option 'cnf'; did you mean 'conf'?"),
        ("bad value", dict(params={"conf": "2"}, content=jpeg, headers=raw), 400, "conf must be a number in [0, 1]"),
        ("unknown class", dict(params={"classes": "squar"}, content=jpeg, headers=raw), 400,
         "did you mean 'square'?"),
        ("form with a field", dict(data={"note": "x"}, files={"image": ("a.jpg", jpeg)}), 400,
         "multipart form: Too many fields"),
        ("form of text", dict(data={"image": "x"}), 415, "content type 'application/x-www-form-urlencoded'"),
    ]
    for what, request, status, words in cases:
        answer = httpx.post(f"{server}/predict", **request)
        assert answer.status_code == status, what
        assert words in answer.json()["error"], (what, answer.json())
        assert httpx.post(f"{server}/predict", content=jpeg, headers=raw).status_code == 200, what
    # 20 MB announced: refused from its Content-Length after 64 KiB were sent, not after 20 MB
    head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: {20_000_000}\r\n\r\n"
    status, error = raw_request(server, head, b"\0" * 65536)
    assert status == 413 and "upload over the limit of 16,777,216 bytes" in error["error"]
    # a chunked upload with no length is counted as it arrives and refused past the limit
    chunk = b"\0" * 2**20
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_UPLOAD_BYTES // len(chunk) + 1))
    head = "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, error = raw_request(server, head, chunks)
    assert status == 413 and "MAX_UPLOAD_BYTES" in error["error"]
    missing = httpx.get(f"{server}/nowhere")
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    with Client(server) as client, pytest.raises(ServerError, match="415"):
        client._json("POST", "/predict", content=b"x", headers={"Content-Type": "text/plain"})
    assert httpx.post(f"{server}/predict", content=jpeg, headers=raw).status_code == 200
    assert _metric(server, "ssd_request_errors_total", '{route="/predict",status="413"}') == 3


def test_draw_classes_and_metrics(server, detector, images):
    path = images[2]
    expected = detector.predict(path)[0]
    drawn = httpx.post(f"{server}/predict", params={"draw": "1"}, content=path.read_bytes(), timeout=60)
    assert drawn.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(drawn.content)) as image:
        assert image.size == (expected.width, expected.height)
    with Client(server) as client:
        (squares,) = client.predict(path, classes=["square", 0])
    keep = [name in ("square", "circle") for name in expected.names]
    assert squares.names == [n for n, k in zip(expected.names, keep) if k]
    assert torch.equal(squares.boxes, expected.boxes[torch.tensor(keep)])
    text = httpx.get(f"{server}/metrics").text
    assert "# TYPE ssd_request_latency_seconds histogram" in text and "# TYPE ssd_batch_size histogram" in text
    assert _metric(server, "ssd_requests_total", '{route="/predict",status="200"}') >= 3
    assert _metric(server, "ssd_request_latency_seconds_count", '{route="/predict"}') >= 3


@pytest.mark.slow
def test_page_renders_the_boxes_of_a_sample_in_headless_chromium(server, detector, images, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    expected = detector.predict(images[3])[0]
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
                          "--virtual-time-budget=20000", "--dump-dom", f"{server}/?sample={images[3].name}"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'data-ready="1"' in dom  # the page's start ran to its end
    assert f'data-count="{len(expected.names)}"' in dom and 'id="error"></p>' in dom
    assert dom.count('class="box"') == len(expected.names)
    first = f'data-name="{expected.names[0]}"'
    assert first in dom and f"{expected.names[0]} {expected.scores[0]:.2f}</span>" in dom


@pytest.mark.slow
def test_ssd_serve_process_on_a_free_port_answers_as_detector_predict(tiny_checkpoint, detector, images):
    # --threads 0: PyTorch's thread count of this process, which the float sums of a .pt network depend on
    process = subprocess.Popen([sys.executable, "-m", "ssd", "serve", "--weights", str(tiny_checkpoint), "--port", "0",
                                "--max-batch", "1", "--threads", "0", "--idle-timeout", "1"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([process.stdout], [], [], 120)[0], "no line from ssd serve within 120 s"
        line = process.stdout.readline()  # printed once the socket listens: requests wait in its backlog
        url = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert url is not None and "serving ssd_tiny (torch)" in line and "no batching" in line, line
        with Client(url.group()) as client:
            (result,) = client.predict(images[5])
        half_sent = connect(url.group())  # an upload that stops after its head: it cannot hold the server up
        half_sent.sendall(upload_head(1000).encode())
    finally:
        process.terminate()  # uvicorn shuts down, then ends by the signal
        process.wait(timeout=60)
    status, _, answer = read_answer(half_sent)
    assert status == 408 and answer == {"error": "upload stalled: no byte for 1 s (--idle-timeout) after 0 bytes"}
    expected = detector.predict(images[5])[0]
    assert all(torch.equal(getattr(result, k), getattr(expected, k)) for k in ("boxes", "scores", "labels"))
    assert process.stderr.read() == ""  # no warning on 127.0.0.1, no traceback


def test_the_model_card_of_an_export_has_its_checksum_and_nms_thresholds():
    card = ModelCard("ssd_tiny", ("cat", "dog"), (64, 80), (0.5, 0.4, 0.3), (0.2, 0.2, 0.25), (0.1, 0.2), (3, 7),
                     {"score_threshold": 0.3, "precision": 0.5, "recall": 0.25, "f1": 0.33, "split": "val"},
                     Thresholds(0.25, 0.45, 50), "int8").sealed("abc")
    backend = SimpleNamespace(card=card, name="onnx", source=Path("runs/best.int8.onnx"))
    assert model_card(backend) == {
        "name": "ssd_tiny", "format": "onnx", "classes": ["cat", "dog"], "category_ids": [3, 7],
        "input_size": {"height": 64, "width": 80},
        "operating_point": {"score_threshold": 0.3, "precision": 0.5, "recall": 0.25, "f1": 0.33, "split": "val"},
        "nms": {"conf": 0.25, "iou": 0.45, "max_det": 50}, "precision": "int8", "file": "best.int8.onnx",
        "checksum": card.checksum["sha256"]}
    assert len(card.checksum["sha256"]) == 64


def test_serving_beyond_this_machine_is_said():
    assert exposure_warning("127.0.0.1") is None and exposure_warning("::1") is None
    assert exposure_warning("localhost") is None
    assert "no authentication" in exposure_warning("0.0.0.0")


def test_ssd_serve_refuses_a_bad_option_in_one_line(tiny_checkpoint, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--weights", str(tiny_checkpoint), "--port", str(port)]) == 1
        assert capsys.readouterr().err == (f"error: --host 127.0.0.1 --port {port}: cannot listen there "
                                           "(Address already in use)\n")
    assert main(["serve", "--weights", str(tiny_checkpoint), "--port", "0", "--max-batch", "0"]) == 2
    assert capsys.readouterr().err == "error: ssd serve: --max-batch must be a positive integer, got 0\n"
    assert main(["serve", "--weights", str(tiny_checkpoint), "--threads", "-1"]) == 2
    assert capsys.readouterr().err == ("error: ssd serve: --threads must be a whole number, 0 or more (0: one per "
                                       "core), got -1\n")
    assert main(["serve", "--weights", str(tiny_checkpoint), "--timeout", "0"]) == 2
    assert capsys.readouterr().err == "error: ssd serve: --timeout must be a number of seconds in (0, 3600], got 0.0\n"
