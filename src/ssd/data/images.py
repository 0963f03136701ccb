"""Image decoding: the one guarded entry point for every image file the library reads.

``read_image`` (full decode, used by training, validation and predict), ``verify_image`` (full but cheap decode,
used by ``ssd check``) and ``read_image_size`` (header only, used by the annotation readers) apply the same rules
and raise :class:`ImageError` (a ``DataError``) naming the file for anything they cannot or will not decode:

- **Pixel limit**: ``width * height`` at most ``PIL.Image.MAX_IMAGE_PIXELS`` (about 89.5 MP by default; raise it,
  or set it to ``None``, to accept larger images), checked from the header before any pixel is decoded; Pillow's
  own decompression-bomb error is reported the same way.
- **One decoder**: Pillow, for every format and every caller (check, training, validation, predict), so they
  cannot disagree about a file; a decode error is never swallowed (no all-black picture for a corrupt file).
- **One picture**: animated GIF/PNG/WebP and multi-page TIFF files are refused (the boxes of an annotation describe
  one picture, and which frame would it be?). A camera's multi-picture JPEG (MPO) is read as its primary picture,
  which is what viewers show and what the JPEG decoder reads.
- **8-bit RGB out**: RGB, gray (``L``), RGBA and palette (``P``) images are accepted (alpha dropped); bilevel
  (``1``), gray+alpha, CMYK, YCbCr and RGBX images are converted to RGB; 16-bit images (PNG, TIFF) are scaled to
  8 bits (``value >> 8``: the picture a viewer shows); float (``F``) and 32-bit integer (``I``) images
  are refused, because they have no defined 0..255 range and a guess would decode them as, say, an all-black image.

Sizes and pixels honour the EXIF orientation tag, so they agree with what a viewer shows. A malformed EXIF block
is ignored (the picture is read as stored) with one :class:`ImageWarning` naming the file, in place of Pillow's raw
"Corrupt EXIF data" warning.
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from ssd.data.memo import remembered
from ssd.errors import ImageError
from ssd.optional import has_torch
from ssd.sizes import as_hw

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["IMAGE_SUFFIXES", "ImageWarning", "read_image", "decode_image", "decode_upload", "read_image_size",
           "is_image", "verify_image", "pil_to_rgb", "exif_transposed"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
_EXIF_ORIENTATION = 0x0112
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}  # EXIF orientation -> the transpose that displays the image upright
_TRANSPOSED = (5, 6, 7, 8)  # orientations that swap width and height
_ACCEPTED = ("RGB", "L", "RGBA", "P")
_CONVERTED = ("1", "LA", "La", "PA", "RGBX", "RGBa", "CMYK", "YCbCr")
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_REFUSED = {"F": "32-bit float pixels (mode F)", "I": "32-bit integer pixels (mode I)"}
_JPEG = ("JPEG", "MPO")  # the formats with a reduced-scale (draft) decode
_METADATA_LOCK = threading.Lock()  # catch_warnings is process-wide: one header read at a time (caches use threads)


class ImageWarning(UserWarning):
    """A problem the decoder works around, e.g. a malformed EXIF block (ignored); the message starts with the file."""


def _error(path: Path, reason: str, code: str = "corrupt_image") -> ImageError:
    return ImageError(f"{path}: {reason}", code, reason)


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


@contextlib.contextmanager
def _metadata_warnings(path: Path) -> Iterator[None]:
    """Pillow's warnings about a file's metadata (``UserWarning``: "Corrupt EXIF data", "Tag data larger than
    file", ...) re-raised as one :class:`ImageWarning` naming the file; other warnings pass unchanged."""
    with _METADATA_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    complaints = [str(w.message).strip() for w in caught if issubclass(w.category, UserWarning)]
    for w in caught:
        if not issubclass(w.category, UserWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if complaints:
        warnings.warn(ImageWarning(f"{path}: malformed metadata, the unreadable entries are ignored "
                                   f"({'; '.join(dict.fromkeys(complaints))})"), stacklevel=5)  # read_image's caller


def _open(path: Path, data: bytes | None = None) -> Image.Image:
    """Pillow's lazy open (header only) plus the pixel-limit, frame and mode rules; ``ImageError`` otherwise."""
    try:
        with _metadata_warnings(path):
            im = Image.open(io.BytesIO(data) if data is not None else path)
    except FileNotFoundError as e:
        raise _error(path, "image file does not exist", "missing_image") from e
    except UnidentifiedImageError as e:
        raise _error(path, "not an image (no image format Pillow knows starts this file)") from e
    except Image.DecompressionBombError as e:
        raise _error(path, f"over twice the pixel limit of {Image.MAX_IMAGE_PIXELS:,} (PIL.Image.MAX_IMAGE_PIXELS, a "
                     f"guard against decompression bombs; set it higher to accept larger images): {e}",
                     "unsupported_image") from e
    except Exception as e:  # Pillow's plugins raise many kinds (OSError, SyntaxError, struct.error, ...) on bad bytes
        raise _error(path, f"cannot read image ({type(e).__name__}: {e})") from e
    try:
        _check_rules(im, path)
    except BaseException:
        im.close()
        raise
    return im


def _check_rules(im: Image.Image, path: Path) -> None:
    w, h = im.size
    limit = Image.MAX_IMAGE_PIXELS
    if limit and w * h > limit:
        raise _error(path, f"{w}x{h} = {w * h:,} pixels exceed the limit of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS, "
                     "a guard against decompression bombs; set it higher to accept larger images)", "unsupported_image")
    try:
        frames = 1 if im.format == "MPO" or not getattr(im, "is_animated", False) else im.n_frames
    except Exception as e:  # counting frames reads them: a broken frame is a broken file
        raise _error(path, f"cannot read image frames ({type(e).__name__}: {e})") from e
    if frames > 1:
        raise _error(path, f"{im.format} image with {frames} frames (animated or multi-page) refused: an annotation "
                     "describes one picture; save the annotated frame as a still image", "unsupported_image")
    if im.mode not in _ACCEPTED + _CONVERTED + _SIXTEEN_BIT:
        what = _REFUSED.get(im.mode, f"pixel mode {im.mode}")
        raise _error(path, f"{what} refused: no defined 8-bit RGB meaning (accepted: 8-bit RGB, gray, RGBA, palette; "
                     "converted: 1-bit, gray+alpha, CMYK, YCbCr, 16-bit); convert the image to 8-bit RGB yourself",
                     "unsupported_image")


def _orientation(im: Image.Image, path: Path) -> int | None:
    """The EXIF orientation tag, or None; an unreadable EXIF block is ignored with one :class:`ImageWarning`."""
    if im.format == "PNG":
        im.load()  # Pillow reads a PNG's EXIF only after its pixels: their errors are the caller's, not EXIF's
    try:
        with _metadata_warnings(path):
            return im.getexif().get(_EXIF_ORIENTATION)
    except Exception as e:  # Pillow's EXIF parser raises many kinds on bad bytes
        warnings.warn(ImageWarning(f"{path}: unreadable EXIF data ignored, the picture is read as stored, without "
                                   f"rotation ({type(e).__name__}: {e})"), stacklevel=3)
        return None


def _to_pixels(im: Image.Image) -> Tensor:
    """An RGB Pillow image -> ``uint8 [3, H, W]``: a tensor, or a numpy array without PyTorch (the runtime
    install, :mod:`ssd.arrays`)."""
    if not has_torch():
        from ssd.arrays import pil_to_array

        return pil_to_array(im)
    from torchvision.transforms.v2.functional import pil_to_tensor

    return pil_to_tensor(im)


def pil_to_rgb(im: Image.Image) -> Tensor:
    """A Pillow image (of a mode the rules accept) to ``uint8 [3, H, W]`` RGB, EXIF orientation applied."""
    return _to_pixels(_upright_rgb(im, _orientation(im, Path(getattr(im, "filename", "") or "<image>"))))


def _upright_rgb(im: Image.Image, orientation: int | None) -> Image.Image:
    method = _TRANSPOSE.get(orientation)
    if method is not None:
        im = im.transpose(method)
    if im.mode in _SIXTEEN_BIT:  # scale to 8 bits; Pillow's own conversion would clip at 255 (a white image)
        im = Image.fromarray((np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8), "L")
    elif im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # the palette-with-transparency path Pillow asks for (no warning, same colours)
    return im if im.mode == "RGB" else im.convert("RGB")


def read_image(path: str | Path, min_size: int | tuple[int, int] | None = None) -> Tensor:
    """Decode ``path`` to a ``uint8`` tensor ``[3, H, W]`` RGB, EXIF orientation applied (rules: module docstring).

    Raises :class:`ImageError` naming the file when the file is missing, refused or does not decode completely.

    ``min_size``: the caller resizes the image next to at most this size (an int: square; or ``(height, width)``),
    so a JPEG at least twice that size on each axis is decoded at a reduced DCT scale (1/2, 1/4 or 1/8) that keeps
    its height and width >= the target's (JPEG "draft" mode, per axis, in the upright orientation the EXIF tag
    gives): 2-4x faster for phone photos fed to a 300 px network, and no detail the resize would keep is lost.
    """
    path = Path(path)
    return _decode(_file_bytes(path), path, min_size, _to_pixels)[0]


def _file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()  # read once: the header checked is the one decoded
    except FileNotFoundError as e:
        raise _error(path, "image file does not exist", "missing_image") from e
    except OSError as e:
        raise _error(path, f"cannot read image file ({e.strerror or e})") from e


def decode_image(data: bytes, name: str | Path = "<image>", min_size: int | tuple[int, int] | None = None) -> Tensor:
    """Decode the bytes of an image file (an upload, say) as :func:`read_image` decodes a file, by the same rules;
    :class:`ImageError` messages name it ``name``."""
    return _decode(data, Path(name), min_size, _to_pixels)[0]


def decode_upload(data: bytes, name: str | Path, min_size: int | tuple[int, int],
                  max_pixels: int) -> tuple[Tensor, tuple[int, int]]:
    """:func:`decode_image` with ``min_size`` (a JPEG decoded at a reduced scale), and ``(width, height)`` of the
    whole picture, upright, to scale what is found on the reduced one back. An image that would decode to more than
    ``max_pixels`` is refused (``ImageError`` code ``too_many_pixels``) from its header, before any pixel is decoded:
    a JPEG counts at its reduced scale, other formats at full size."""
    return _decode(data, Path(name), min_size, _to_pixels, max_pixels)


def _decode(data: bytes, path: Path, min_size: int | tuple[int, int] | None, finish: Callable[[Image.Image], Any],
            max_pixels: int | None = None) -> tuple[Any, tuple[int, int]]:
    """``finish`` of the decoded picture, upright and RGB (see :func:`read_image`), and the whole picture's upright
    ``(width, height)``."""
    with _open(path, data) as im:
        if im.format not in _JPEG:  # before _orientation, which decodes a PNG
            _check_decoded_pixels(im, path, max_pixels)
        try:
            orientation = _orientation(im, path)
            width, height = im.size
            whole = (height, width) if orientation in _TRANSPOSED else (width, height)
            if min_size is not None and im.format in _JPEG:
                want_h, want_w = as_hw(min_size)
                if orientation in _TRANSPOSED:  # the file stores the picture transposed: its width is our height
                    want_h, want_w = want_w, want_h
                if width >= 2 * want_w and height >= 2 * want_h:
                    im.draft("RGB", (want_w, want_h))
            if im.format in _JPEG:
                _check_decoded_pixels(im, path, max_pixels)  # at the draft's scale
            im.load()  # decode now: a corrupt or truncated file raises here, never converts to a black picture
            return finish(_upright_rgb(im, orientation)), whole
        except ImageError:
            raise
        except Exception as e:  # Pillow's decoders raise many kinds (OSError, SyntaxError, struct.error, ...)
            raise _error(path, f"image does not decode ({type(e).__name__}: {e})") from e


def _check_decoded_pixels(im: Image.Image, path: Path, max_pixels: int | None) -> None:
    w, h = im.size
    if max_pixels is not None and w * h > max_pixels:
        raise _error(path, f"{w}x{h} = {w * h:,} pixels to decode exceed the limit of {max_pixels:,}",
                     "too_many_pixels")


@remembered("decode", error=ImageError)
def verify_image(path: str | Path) -> None:
    """Raise :class:`ImageError` for what :func:`read_image` refuses, including truncated or corrupt files that a
    header read (:func:`read_image_size`) accepts: :func:`read_image`'s decode, cheaply (JPEGs at 1/8 scale, no
    tensor made)."""
    path = Path(path)
    _decode(_file_bytes(path), path, 1, lambda picture: None)


@remembered("size", tuple, tuple, error=ImageError)
def read_image_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of the image as displayed (EXIF rotation applied), from the header only (no decode, except
    for PNGs, whose EXIF Pillow reads after the pixels).

    Raises :class:`ImageError` naming the file when it is missing, not an image, or refused by the rules.
    """
    path = Path(path)
    with _open(path) as im:
        w, h = im.size
        return (h, w) if _transposed(im, path) else (w, h)


def exif_transposed(path: str | Path) -> bool:
    """True when the file stores the picture transposed (EXIF orientation 5-8: rotated by 90 degrees), so that its
    stored width is the displayed height; for messages about boxes drawn on the stored picture. ``ImageError`` as
    :func:`read_image_size`."""
    path = Path(path)
    with _open(path) as im:
        return _transposed(im, path)


def _transposed(im: Image.Image, path: Path) -> bool:
    try:
        return _orientation(im, path) in _TRANSPOSED
    except Exception as e:  # a PNG's pixels, decoded to reach its EXIF
        raise _error(path, f"image does not decode ({type(e).__name__}: {e})") from e
