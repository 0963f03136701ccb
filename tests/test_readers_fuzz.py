"""Property-based fuzzing of the three annotation readers and the image decoder.

Random mutations of valid files (truncation, byte flips, inserted/deleted bytes, a BOM, CRLF line ends, removed
keys or elements, values of the wrong type, huge / negative / NaN / infinite numbers) never raise anything but the
library's ``DataError`` naming the file; whatever a reader returns, ``check`` reports without raising, and every
problem it reports names its file. A deadline bounds each example (no hang); examples are derandomized so the suite
is reproducible.
"""

import io
import json
import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from ssd.data import check_dataset, load_dataset
from ssd.data.images import read_image, read_image_size, verify_image
from ssd.errors import DataError, ImageError

pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

FUZZ = settings(max_examples=60, deadline=3000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HOSTILE_NUMBERS = ["nan", "-nan", "inf", "-inf", "1e999", "-1e12", "1e12", "-1", "0", "-0", "1" + "0" * 30,
                   "0x10", "", "  ", "1,5", "true", "null", "½", "\u0661"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.sampled_from([10 ** 30, -10 ** 30, 10 ** 400])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)


@st.composite
def byte_mutations(draw, data: bytes) -> bytes:
    """Up to three byte-level edits: truncate, flip, insert, delete, a UTF-8 BOM, CRLF line ends."""
    for op in draw(st.lists(st.sampled_from(["truncate", "flip", "insert", "delete", "bom", "crlf"]), min_size=1,
                            max_size=3)):
        at = draw(st.integers(0, len(data)))
        if op == "truncate":
            data = data[:at]
        elif op == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
        elif op == "insert":
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 16)):]
        elif op == "bom":
            data = b"\xef\xbb\xbf" + data
        elif op == "crlf":
            data = data.replace(b"\n", b"\r\n")
    return data


@st.composite
def number_mutations(draw, text: str) -> str:
    """Replace up to three numbers of ``text`` by hostile ones (huge, negative, NaN, not numbers at all)."""
    spans = [m.span() for m in re.finditer(r"-?\d+(\.\d+)?", text)]
    for start, end in sorted(draw(st.lists(st.sampled_from(spans), max_size=3, unique=True)), reverse=True):
        text = text[:start] + draw(st.sampled_from(HOSTILE_NUMBERS)) + text[end:]
    return text


def _nodes(value, found: list) -> list:
    """Every (container, key) pair of a parsed JSON/YAML value."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        found.append((value, key))
        _nodes(child, found)
    return found


@st.composite
def tree_mutations(draw, value):
    """Up to three structural edits of a parsed JSON/YAML value: remove a key, replace or wrap a value."""
    value = json.loads(json.dumps(value))  # a fresh copy
    for _ in range(draw(st.integers(1, 3))):
        nodes = _nodes(value, [])
        if not nodes:
            break
        container, key = draw(st.sampled_from(nodes))
        op = draw(st.sampled_from(["remove", "replace", "wrap"]))
        if op == "remove":
            del container[key]
        elif op == "replace":
            container[key] = draw(JSON_VALUES)
        else:
            container[key] = [container[key]]
    return value


# Private writers, not builders.make_dataset: the seed files are what the mutations start from.
def _jpg(path: Path, w: int, h: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), (120, 30, 200)).save(path)


def _assert_reads_or_names(read, path: Path) -> None:
    """``read()`` returns a spec that ``check`` reports on, or raises ``DataError`` naming ``path``."""
    try:
        spec = read()
    except DataError as e:
        assert path.name in str(e), str(e)
        return
    report = check_dataset(spec, decode_images=False)
    for issue in report.issues:
        assert (issue.file and Path(issue.file).name in issue.message) or issue.file in issue.message, issue


# --- COCO ------------------------------------------------------------------------------------------------------------

COCO = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
                   {"id": 2, "file_name": "b.jpg", "width": 64, "height": 48}],
        "categories": [{"id": 3, "name": "yak"}, {"id": 7, "name": "zebra"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 10, 20], "iscrowd": 0},
                        {"id": 2, "image_id": 2, "category_id": 7, "bbox": [5.5, 0, 30, 40.25], "iscrowd": 1}]}


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco")
    _jpg(root / "images" / "a.jpg", 64, 48)
    _jpg(root / "images" / "b.jpg", 64, 48)
    return root


@FUZZ
@given(data=st.data())
def test_coco_reader_survives_mutations(coco_dir, data):
    valid = json.dumps(COCO, indent=1)
    kind = data.draw(st.sampled_from(["tree", "numbers", "bytes"]))
    if kind == "tree":
        content = json.dumps(data.draw(tree_mutations(COCO))).encode()
    elif kind == "numbers":
        content = data.draw(number_mutations(valid)).encode()
    else:
        content = data.draw(byte_mutations(valid.encode()))
    path = coco_dir / "instances_val.json"
    path.write_bytes(content)
    _assert_reads_or_names(lambda: load_dataset(path), path)


# --- VOC -------------------------------------------------------------------------------------------------------------

VOC_XML = ("<annotation>\n  <size><width>64</width><height>48</height></size>\n"
           "  <object><name>dog</name><difficult>0</difficult>\n"
           "    <bndbox><xmin>1</xmin><ymin>2</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object>\n"
           "  <object><name>cat</name><difficult>1</difficult>\n"
           "    <bndbox><xmin>10.5</xmin><ymin>5</ymin><xmax>64</xmax><ymax>48</ymax></bndbox></object>\n"
           "</annotation>\n")


@st.composite
def element_mutations(draw, text: str) -> str:
    """Remove up to two XML elements or replace their text by hostile values."""
    spans = [(m.start(), m.end(), m.group(1)) for m in re.finditer(r"<(\w+)>[^<]*</\1>", text)]
    for start, end, tag in sorted(draw(st.lists(st.sampled_from(spans), max_size=2, unique=True)), reverse=True):
        replacement = draw(st.sampled_from(["", f"<{tag}>{draw(st.sampled_from(HOSTILE_NUMBERS))}</{tag}>",
                                            f"<{tag}><{tag}>1</{tag}></{tag}>"]))
        text = text[:start] + replacement + text[end:]
    return text


@pytest.fixture(scope="module")
def voc_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("voc") / "VOC2007"
    _jpg(root / "JPEGImages" / "a.jpg", 64, 48)
    (root / "Annotations").mkdir()
    (root / "ImageSets" / "Main").mkdir(parents=True)
    return root


@FUZZ
@given(data=st.data())
def test_voc_reader_survives_mutations(voc_dir, data):
    target = data.draw(st.sampled_from(["xml", "xml", "classes", "imagesets"]))
    xml, classes, imagesets = VOC_XML, "cat\ndog\n", "a\n"
    if target == "xml":
        kind = data.draw(st.sampled_from(["elements", "numbers", "bytes"]))
        xml = (data.draw(element_mutations(xml)) if kind == "elements" else
               data.draw(number_mutations(xml)) if kind == "numbers" else xml)
        xml_bytes = data.draw(byte_mutations(xml.encode())) if kind == "bytes" else xml.encode()
    else:
        xml_bytes = xml.encode()
    files = {voc_dir / "Annotations" / "a.xml": xml_bytes,
             voc_dir / "classes.txt": data.draw(byte_mutations(classes.encode())) if target == "classes" else
             classes.encode(),
             voc_dir / "ImageSets" / "Main" / "train.txt": data.draw(byte_mutations(imagesets.encode()))
             if target == "imagesets" else imagesets.encode()}
    for path, content in files.items():
        path.write_bytes(content)
    mutated = {"xml": "a.xml", "classes": "classes.txt", "imagesets": "train.txt"}[target]
    _assert_reads_or_names(lambda: load_dataset(voc_dir), Path(mutated))


# --- YOLO ------------------------------------------------------------------------------------------------------------

YOLO_YAML = {"path": ".", "train": "images/train", "val": "images/train", "nc": 2, "names": ["ant", "bee"]}
LABELS = "0 0.5 0.5 0.2 0.4\n\n1 0.1 0.2 0.2 0.2\n1 0.1 0.1 0.3 0.1 0.2 0.5\n"


@pytest.fixture(scope="module")
def yolo_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("yolo")
    _jpg(root / "images" / "train" / "p.jpg", 100, 50)
    (root / "labels" / "train").mkdir(parents=True)
    return root


@FUZZ
@given(data=st.data())
def test_yolo_reader_survives_mutations(yolo_dir, data):
    target = data.draw(st.sampled_from(["yaml", "labels"]))
    kind = data.draw(st.sampled_from(["tree", "numbers", "bytes"]))
    desc, labels = yaml.safe_dump(YOLO_YAML).encode(), LABELS.encode()
    if target == "yaml":
        desc = (yaml.safe_dump(data.draw(tree_mutations(YOLO_YAML))).encode() if kind == "tree" else
                data.draw(number_mutations(desc.decode())).encode() if kind == "numbers" else
                data.draw(byte_mutations(desc)))
    else:
        labels = (data.draw(number_mutations(LABELS)).encode() if kind != "bytes" else
                  data.draw(byte_mutations(labels)))
    (yolo_dir / "data.yaml").write_bytes(desc)
    (yolo_dir / "labels" / "train" / "p.txt").write_bytes(labels)
    _assert_reads_or_names(lambda: load_dataset(yolo_dir / "data.yaml"),
                           Path("data.yaml" if target == "yaml" else "p.txt"))


# --- images ----------------------------------------------------------------------------------------------------------

def _seed_images() -> dict[str, bytes]:
    """Small valid files of every format and several pixel modes (one with an EXIF rotation)."""
    rng = np.random.RandomState(0)
    rgb = Image.fromarray(rng.randint(0, 255, (12, 16, 3)).astype(np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    seeds = {}
    for name, image, fmt, kwargs in [
        ("rgb.jpg", rgb, "JPEG", dict(exif=exif)), ("rgb.png", rgb, "PNG", {}),
        ("pal.gif", rgb.convert("P"), "GIF", {}), ("gray16.png", Image.fromarray(
            rng.randint(0, 65535, (12, 16)).astype(np.uint16)), "PNG", {}),
        ("cmyk.tif", rgb.convert("CMYK"), "TIFF", {}), ("rgb.bmp", rgb, "BMP", {}),
        ("rgba.webp", rgb.convert("RGBA"), "WEBP", dict(lossless=True)),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, fmt, **kwargs)
        seeds[name] = buffer.getvalue()
    return seeds


SEEDS = _seed_images()


@st.composite
def png_size_mutation(draw, data: bytes) -> bytes:
    """A PNG declaring another size, CRC fixed (the header stays valid, so the decoders see the new size)."""
    ihdr = bytearray(data[16:29])
    ihdr[0:8] = struct.pack(">II", draw(st.integers(0, 1 << 31)), draw(st.integers(0, 1 << 31)))
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(ihdr)))
    return data[:16] + bytes(ihdr) + crc + data[33:]


@FUZZ
@given(data=st.data())
def test_image_decoder_survives_mutations(tmp_path, data):
    name = data.draw(st.sampled_from(sorted(SEEDS)))
    seed = SEEDS[name]
    use_size = name.endswith(".png") and data.draw(st.booleans())
    content = data.draw(png_size_mutation(seed) if use_size else byte_mutations(seed))
    path = tmp_path / f"fuzz-{name}"
    path.write_bytes(content)
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = 1 << 20  # keeps each example small (a mutated header may declare anything)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's warnings about odd files are not the property
            outcomes = {}
            for decode in (read_image_size, verify_image, read_image, lambda p: read_image(p, min_size=4)):
                try:
                    outcomes[decode] = decode(path)
                except ImageError as e:
                    assert str(e).startswith(f"{path}: ") and e.code in ("corrupt_image", "unsupported_image")
                    outcomes[decode] = e
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    size, image = outcomes[read_image_size], outcomes[read_image]
    if not isinstance(image, ImageError):
        assert image.dtype.is_floating_point is False and image.dtype.itemsize == 1 and image.shape[0] == 3
        if not isinstance(size, ImageError):  # both read: the boxes' frame and the pixels agree
            assert (image.shape[2], image.shape[1]) == size
