"""A stream's credentials never leave ssd: the user, password and query token of a source URL are hidden
(ssd.text.redact_url) in every output file, window title, log line and error message, since the source's name is
made once, where the stream is opened. Streams come from a server on 127.0.0.1 made by the test."""

import pytest

from ssd.cli import main
from ssd.errors import StreamError
from ssd.inference.sources import predict_source
from ssd.inference.streams import StreamGroup, live_sources
from ssd.schemas import PredictConfig
from ssd.text import redact_url
from test_streams import MjpegServer

cv2 = pytest.importorskip("cv2")

SECRETS = ("admin", "S3cretPass", "T0kenValue")


def secret_url(url: str) -> str:
    """``url`` (``http://127.0.0.1:PORT/feed``) with a user, a password and a query token."""
    return url.replace("http://", "http://admin:S3cretPass@") + "?token=T0kenValue&channel=2"


def leaks(text: str | bytes) -> list[str]:
    raw = text if isinstance(text, bytes) else text.encode()
    return [s for s in SECRETS if s.encode() in raw]


def test_redact_url_hides_users_passwords_and_query_values():
    assert redact_url("rtsp://user:pass@10.0.0.2:8554/live?token=abc&x=1#k=v") == \
        "rtsp://***@10.0.0.2:8554/live?token=***&x=***#k=***"
    assert redact_url("cannot open 'http://a:b@h/x?abc': unreachable") == \
        "cannot open 'http://***@h/x?***': unreachable"
    assert redact_url("http://h/p@th/x") == "http://h/p@th/x"  # an @ in the path is not a user
    assert [redact_url(s) for s in ("0", "clips/a.mp4", "rtsp://cam/live")] == ["0", "clips/a.mp4", "rtsp://cam/live"]


@pytest.mark.parametrize("fmt", ["csv", "labelstudio"])
def test_stream_with_credentials_leaks_them_nowhere(tiny_checkpoint, tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.setattr("ssd.inference.streams.RECONNECT_DELAY", 0.01)
    with MjpegServer(4) as server:
        url = secret_url(server.url)
        code = main(["predict", "--weights", str(tiny_checkpoint), "--source", url, "--save-dir", str(tmp_path / "o"),
                     "--format", fmt, "--save-txt", "--save-crop", "--conf", "0.01", "--reconnect", "0"])
    out, err = capsys.readouterr()
    assert code == 1 and "error: http://***@127.0.0.1:" in err  # the stream ended: said, with its name hidden
    files = [p for p in (tmp_path / "o").rglob("*") if p.is_file()]
    assert len(files) >= 5  # marker, JSONL, the fmt file, the drawn video, YOLO labels and crops
    assert any(p.parent.name == "labels" for p in files) and any("crops" in p.parts for p in files)
    assert {str(p): leaks(p.read_bytes()) + leaks(str(p)) for p in files} == {str(p): [] for p in files}
    assert leaks(out) == leaks(err) == []


def test_window_titles_and_messages_hide_credentials(tiny_checkpoint, tmp_path, monkeypatch, ssd_messages):
    titles = []

    class Window:
        def show(self, name, image):
            titles.append(name)

        def close(self):
            pass

    monkeypatch.setattr("ssd.inference.sources.open_window", Window)
    with MjpegServer(3) as server:
        summary = predict_source(PredictConfig(weights=tiny_checkpoint, source=secret_url(server.url),
                                               save_dir=tmp_path / "o", show=True, reconnect=0), progress=False)
    assert titles and not {t for t in titles if leaks(t)}
    assert summary.stopped.startswith("http://***@127.0.0.1:") and not leaks(summary.stopped + str(summary))
    assert not [m for m in ssd_messages() if leaks(m)]

    with pytest.raises(StreamError, match=r"cannot open 'rtsp://\*\*\*@127.0.0.1:9/x\?token=\*\*\*'") as e:
        StreamGroup(["rtsp://admin:S3cretPass@127.0.0.1:9/x?token=T0kenValue"])
    assert not leaks(str(e.value))
    listing = tmp_path / "cams.streams"
    listing.write_text("ftp://admin:S3cretPass@127.0.0.1/x?token=T0kenValue\n")
    with pytest.raises(StreamError, match=r"line 1: 'ftp://\*\*\*@127.0.0.1/x\?token=\*\*\*' is not a") as e:
        live_sources(listing)
    assert not leaks(str(e.value))
