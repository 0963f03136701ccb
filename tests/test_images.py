"""The guarded image decoder: pixel limit, one frame, 8-bit RGB out, errors naming the file; ``read_image``,
``verify_image`` (check) and ``read_image_size`` (the readers) apply the same rules, and check/train see them."""

import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from builders import biased_model
from ssd.data import check_dataset, load_dataset
from ssd.data.check import screen
from ssd.data.images import ImageWarning, pil_to_rgb, read_image, read_image_size, verify_image
from ssd.data.loader import DetectionDataset
from ssd.errors import ImageError

DECODERS = {"read_image_size": read_image_size, "verify_image": verify_image, "read_image": read_image,
            "read_image(min_size)": lambda p: read_image(p, min_size=8)}


def _png(path: Path, width: int, height: int, bit_depth: int, colour_type: int, rows: bytes | None = None,
         row_filter: bytes = b"\0") -> Path:
    """A PNG written chunk by chunk (Pillow writes neither 16-bit RGB nor a cheap 20000x20000 image).

    ``rows``: the raw scanlines without filter bytes; ``None`` means all zero (streamed: a bomb stays cheap).
    ``row_filter``: the filter byte of every row (0: none; 5 and up are invalid)."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row_bytes = (width * bit_depth * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour_type] + 7) // 8
    if rows is None:
        packer = zlib.compressobj(9)
        zero_row = bytes(1 + row_bytes)
        idat = b"".join(packer.compress(zero_row) for _ in range(height)) + packer.flush()
    else:
        idat = zlib.compress(b"".join(row_filter + rows[i * row_bytes:(i + 1) * row_bytes] for i in range(height)))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def _refused_everywhere(path: Path, pattern: str, code: str = "unsupported_image") -> None:
    for name, decode in DECODERS.items():
        with pytest.raises(ImageError, match=pattern) as e:
            decode(path)
        assert e.value.code == code and str(e.value).startswith(f"{path}: "), name


def test_decompression_bomb_png_is_refused_by_every_decoder(tmp_path):
    bomb = _png(tmp_path / "bomb.png", 20000, 20000, 1, 0)  # 400 MP of one bit each
    assert bomb.stat().st_size < 100_000
    _refused_everywhere(bomb, r"over twice the pixel limit of 89,478,485 \(PIL.Image.MAX_IMAGE_PIXELS, a guard "
                              r"against decompression bombs.*\(400000000 pixels\)")


def test_pixel_limit_is_checked_before_any_pixel_is_decoded(tmp_path, monkeypatch):
    jpg, png = tmp_path / "a.jpg", tmp_path / "a.png"
    Image.new("RGB", (40, 30), (9, 8, 7)).save(jpg)
    Image.new("RGB", (40, 30), (9, 8, 7)).save(png)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow itself only warns up to twice the limit
    load = ImageFile.ImageFile.load

    def decoder_must_not_run(*args, **kwargs):
        raise AssertionError("decoder called on an image over the pixel limit")

    monkeypatch.setattr(ImageFile.ImageFile, "load", decoder_must_not_run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        for path in (jpg, png):
            _refused_everywhere(path, r"40x30 = 1,200 pixels exceed the limit of 1,000 \(PIL.Image.MAX_IMAGE_PIXELS")
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the documented way to lift the limit
    assert read_image(png)[:, 0, 0].tolist() == [9, 8, 7] and read_image_size(jpg) == (40, 30)


@pytest.mark.parametrize("suffix", [".gif", ".png", ".webp"])
def test_animated_images_are_refused_by_name(tmp_path, suffix):
    frames = [Image.new("RGB", (8, 6), (80 * i, 0, 0)) for i in range(3)]
    path = tmp_path / f"anim{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    _refused_everywhere(path, r"image with 3 frames \(animated or multi-page\) refused")
    frames[1].save(tmp_path / f"still{suffix}")  # one frame: fine
    still = read_image(tmp_path / f"still{suffix}")[:, 0, 0]  # WebP is lossy: a few levels off
    assert (still.int() - torch.tensor([80, 0, 0])).abs().max() <= 3


def test_camera_multi_picture_jpeg_reads_its_primary_picture(tmp_path):
    path = tmp_path / "camera.mpo"
    Image.new("RGB", (16, 12), (200, 10, 10)).save(path, "MPO", save_all=True,
                                                   append_images=[Image.new("RGB", (8, 6), (10, 200, 10))])
    assert read_image_size(path) == (16, 12) and read_image(path).shape == (3, 12, 16)
    assert abs(int(read_image(path)[0, 0, 0]) - 200) <= 2
    verify_image(path)


def test_16_bit_images_are_scaled_to_8_bits(tmp_path):
    values = np.array([[0, 255, 256, 4095], [32768, 40000, 65280, 65535]], np.uint16)
    expected = torch.from_numpy((values >> 8).astype(np.uint8))
    gray_png, gray_tif = tmp_path / "g.png", tmp_path / "g.tif"
    Image.fromarray(values).save(gray_png)  # Pillow mode I;16
    Image.fromarray(values).save(gray_tif)
    rgb = np.stack([values, 65535 - values, np.full_like(values, 513)], -1)
    rgb_png = _png(tmp_path / "rgb.png", 4, 2, 16, 2, rgb.astype(">u2").tobytes())
    for path in (gray_png, gray_tif):
        image = read_image(path)
        assert image.dtype == torch.uint8 and torch.equal(image, expected.expand(3, 2, 4)), path
        verify_image(path)
    image = read_image(rgb_png)
    expected = torch.from_numpy((rgb >> 8).astype(np.uint8)).permute(2, 0, 1)
    assert image.dtype == torch.uint8 and torch.equal(image, expected)
    assert read_image_size(rgb_png) == (4, 2)


def test_float_and_32_bit_integer_images_are_refused_by_name(tmp_path):
    floats = tmp_path / "f.tif"
    Image.fromarray(np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)).save(floats)
    _refused_everywhere(floats, r"32-bit float pixels \(mode F\) refused: no defined 8-bit RGB meaning")
    ints = tmp_path / "i.tif"
    Image.fromarray(np.arange(12, dtype=np.int32).reshape(3, 4) * 100000).save(ints)
    _refused_everywhere(ints, r"32-bit integer pixels \(mode I\) refused")


def test_cmyk_bilevel_and_alpha_images_are_converted(tmp_path):
    cmyk_jpg, cmyk_tif = tmp_path / "c.jpg", tmp_path / "c.tif"
    Image.new("CMYK", (5, 4), (0, 255, 255, 0)).save(cmyk_jpg, quality=100)  # torchvision path
    Image.new("CMYK", (5, 4), (0, 255, 255, 0)).save(cmyk_tif)  # Pillow path
    for path in (cmyk_jpg, cmyk_tif):
        assert read_image(path)[:, 0, 0].tolist() == [255, 0, 0], path
    bits = np.zeros((4, 6), bool)
    bits[:, 3:] = True
    for suffix in (".png", ".tif", ".bmp"):
        path = tmp_path / f"one{suffix}"
        Image.fromarray(bits).convert("1").save(path)
        assert Image.open(path).mode == "1"
        assert read_image(path)[1].tolist() == [[0, 0, 0, 255, 255, 255]] * 4, suffix
    gray_alpha = tmp_path / "la.png"
    Image.new("LA", (3, 2), (77, 0)).save(gray_alpha)
    assert read_image(gray_alpha)[:, 1, 2].tolist() == [77, 77, 77]


def test_palette_with_transparency_converts_without_warning(tmp_path):
    path = tmp_path / "p.png"
    image = Image.new("P", (4, 3), 1)
    image.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    image.info["transparency"] = 1
    image.save(path, transparency=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pil_to_rgb(Image.open(path))[:, 0, 0].tolist() == [10, 200, 30]
    assert read_image(path)[:, 2, 3].tolist() == [10, 200, 30]


def test_exif_orientations_agree_between_decoders_and_header(tmp_path):
    pixels = np.random.RandomState(0).randint(0, 255, (6, 10, 3)).astype(np.uint8)
    for orientation in range(1, 9):
        path = tmp_path / f"o{orientation}.png"
        exif = Image.Exif()
        exif[0x0112] = orientation
        Image.fromarray(pixels).save(path, exif=exif)
        from_file, from_pillow = read_image(path), pil_to_rgb(Image.open(path))
        assert torch.equal(from_file, from_pillow), orientation
        assert read_image_size(path) == (from_pillow.shape[2], from_pillow.shape[1])
    assert read_image_size(tmp_path / "o6.png") == (6, 10)


def test_unreadable_files_name_the_file_and_the_reason(tmp_path):
    _refused_everywhere(tmp_path / "gone.jpg", "image file does not exist", "missing_image")
    (tmp_path / "folder.png").mkdir()
    _refused_everywhere(tmp_path / "folder.png", "Is a directory", "corrupt_image")
    text = tmp_path / "text.jpg"
    text.write_text("hello")
    _refused_everywhere(text, r"not an image \(no image format Pillow knows", "corrupt_image")
    for suffix in (".jpg", ".png"):
        whole = tmp_path / f"whole{suffix}"
        Image.effect_noise((100, 50), 60).convert("RGB").save(whole)
        cut = tmp_path / f"cut{suffix}"
        cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
        if suffix == ".jpg":  # the header still reads: decoding finds it
            assert read_image_size(cut) == (100, 50)
        decoders = (verify_image, read_image) if suffix == ".jpg" else (read_image_size, verify_image, read_image)
        for decode in decoders:  # Pillow reads a PNG's EXIF only after its pixels: the size read decodes them
            with pytest.raises(ImageError, match=f"^{cut}: .*truncated") as e:
                decode(cut)
            assert e.value.code == "corrupt_image"


def test_png_with_an_invalid_row_filter_does_not_crash_the_process(tmp_path):
    # torchvision 0.29's PNG decoder segfaults on this file ("bad adaptive filter value"); Pillow's does not
    path = _png(tmp_path / "filter.png", 16, 12, 8, 2, bytes(range(48)) * 12, row_filter=b"\x07")
    try:
        assert read_image(path).shape == (3, 12, 16)
    except ImageError as e:
        assert e.code == "corrupt_image"


def test_image_error_survives_pickling_from_loader_workers(tmp_path):
    import pickle

    error = pickle.loads(pickle.dumps(ImageError("x.png: refused", "unsupported_image", "refused")))
    assert (str(error), error.code, error.reason) == ("x.png: refused", "unsupported_image", "refused")
    assert str(ImageError("message only")) == "message only"  # how torch re-raises a worker's error


def test_check_train_and_loader_share_the_rules(tmp_path):
    """A bomb, an animated GIF and a float TIFF fail `check` (by name) and are dropped by skip_invalid; a 16-bit PNG
    passes and loads as uint8."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    Image.new("RGB", (32, 24), (1, 2, 3)).save(tmp_path / "images" / "good.jpg")
    _png(tmp_path / "images" / "bomb.png", 20000, 20000, 1, 0)
    frames = [Image.new("RGB", (32, 24), (80 * i, 0, 0)) for i in range(2)]
    frames[0].save(tmp_path / "images" / "anim.gif", save_all=True, append_images=frames[1:])
    Image.fromarray(np.ones((24, 32), np.float32)).save(tmp_path / "images" / "float.tif")
    Image.fromarray(np.full((24, 32), 51400, np.uint16)).save(tmp_path / "images" / "deep.png")
    for stem in ("good", "bomb", "anim", "float", "deep"):
        (tmp_path / "labels" / f"{stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (tmp_path / "classes.txt").write_text("thing\n")
    report = check_dataset(tmp_path)
    refused = {Path(i.file).name: i for i in report.errors}
    assert sorted(refused) == ["anim.gif", "bomb.png", "float.tif"]
    assert all(i.code == "unsupported_image" for i in refused.values())
    assert "2 frames" in refused["anim.gif"].message and "mode F" in refused["float.tif"].message
    assert "MAX_IMAGE_PIXELS" in refused["bomb.png"].message
    clean, report = screen(load_dataset(tmp_path), ["train"], skip_invalid=True)
    assert report.dropped["images"] == 3
    kept = clean.splits["train"]
    assert sorted(r.path.name for r in kept) == ["deep.png", "good.jpg"]
    images = {r.path.name: DetectionDataset([r], ["thing"])[0][0] for r in kept}
    assert images["deep.png"].dtype == torch.uint8 and int(images["deep.png"][0, 0, 0]) == 51400 >> 8


def _png_with_corrupt_pixel_data(path: Path) -> Path:
    """A PNG whose header reads but whose compressed pixel data (IDAT) is broken part way through."""
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (24, 32, 3)).astype(np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IDAT") + 4
    data[start + 20:start + 40] = bytes(20)
    path.write_bytes(bytes(data))
    return path


def test_png_with_corrupt_pixel_data_is_refused_by_check_and_predict_alike(tmp_path):
    """Was: ``ssd check`` refused it while predict read it as a partly black picture (the decode error raised
    while reading EXIF was swallowed)."""
    path = _png_with_corrupt_pixel_data(tmp_path / "corrupt.png")
    for name, decode in DECODERS.items():
        with pytest.raises(ImageError, match=r"image does not decode \(OSError: broken data stream") as e:
            decode(path)
        assert e.value.code == "corrupt_image" and str(e.value).startswith(f"{path}: "), name
    from ssd.inference.detector import Detector

    with pytest.raises(ImageError, match=f"^{path}: image does not decode"):
        Detector(biased_model("ssd_tiny")).predict(path)


def test_malformed_exif_is_reported_as_the_library_warning_naming_the_file(tmp_path):
    path = tmp_path / "phone.jpg"
    exif = Image.Exif()
    exif[0x0112], exif[0x010E] = 6, "x" * 100  # rotated 90 degrees, and a description the cut leaves incomplete
    Image.new("RGB", (40, 30), (200, 10, 10)).save(path, exif=exif.tobytes()[:-60])
    for name, decode in DECODERS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decode(path)
        assert [(w.category, str(w.message)) for w in caught] == [
            (ImageWarning, f"{path}: malformed metadata, the unreadable entries are ignored (Tag data larger than "
                           "file. Skipping tag 270)")], name
    with pytest.warns(ImageWarning):
        assert read_image_size(path) == (30, 40) and read_image(path).shape == (3, 40, 30)  # still rotated


def test_boxes_drawn_on_an_exif_rotated_picture_without_the_rotation_get_a_hint(tmp_path):
    """A VOC image stored 60x20 with EXIF orientation 6 is shown (and read) as 20x60; a box drawn on the stored
    picture lies outside the shown one, and the error says why."""
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (60, 20), (9, 9, 9)).save(tmp_path / "a.jpg", exif=exif)
    (tmp_path / "a.xml").write_text("<annotation><size><width>60</width><height>20</height></size><object><name>cat"
                                    "</name><bndbox><xmin>30</xmin><ymin>2</ymin><xmax>55</xmax><ymax>18</ymax>"
                                    "</bndbox></object></annotation>")
    (error,) = [i for i in check_dataset(tmp_path, decode_images=False).errors if i.code == "outside_image"]
    assert error.message == (
        "a.xml object 1 (cat): box (29, 1, 54, 17) (written: xmin=30 ymin=2 xmax=55 ymax=18) lies outside the 20x60 "
        "image; the image is stored as 60x20 and shown (and read) rotated by its EXIF orientation tag, and the box "
        "fits the stored picture: it was probably drawn without the rotation (save the image upright, e.g. with "
        "PIL.ImageOps.exif_transpose, and annotate it again)")
    Image.new("RGB", (60, 20), (9, 9, 9)).save(tmp_path / "a.jpg")  # stored upright: the box fits, no error
    assert check_dataset(tmp_path, decode_images=False).errors == []
