"""An ONNX file read without the ``onnx`` package: the bytes of its graph and its metadata, from the protobuf wire
format of ``ModelProto`` (field 7 ``graph``, field 14 ``metadata_props``: ``key`` 1, ``value`` 2).

The ONNX backend checks a file's card and checksum with these before ONNX Runtime parses the graph (an edited graph
is refused before it runs), and the runtime install without PyTorch needs neither ``onnx`` nor its dependencies.
The graph's bytes are those the runtime parses: a field given twice (protobuf merges the two) is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from ssd.errors import OnnxModelError

__all__ = ["read_onnx_file", "graph_sha256"]

_GRAPH, _METADATA = 7, 14
_FIXED = {1: 8, 5: 4}  # wire type -> byte length of the fixed-size fields


def _varint(data: memoryview, pos: int, source: str) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if byte < 0x80:
            return value, pos
    raise OnnxModelError(f"cannot load ONNX model {source}: a truncated or malformed protobuf field")


def _fields(data: memoryview, source: str) -> Iterator[tuple[int, int, memoryview | None]]:
    """``(field number, wire type, bytes of a length-delimited field or None)`` of one protobuf message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos, source)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos, source)
            yield number, wire, None
        elif wire == 2:
            length, pos = _varint(data, pos, source)
            if pos + length > len(data):
                raise OnnxModelError(f"cannot load ONNX model {source}: a field runs past the end of the file")
            yield number, wire, data[pos:pos + length]
            pos += length
        elif wire in _FIXED:
            pos += _FIXED[wire]
            yield number, wire, None
        else:
            raise OnnxModelError(f"cannot load ONNX model {source}: not protobuf (wire type {wire} at byte {pos})")


def _text(value: memoryview, source: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise OnnxModelError(f"{source}: its metadata is not UTF-8 text") from None


def read_onnx_file(path: str | Path) -> tuple[bytes, dict[str, str]]:
    """``(graph bytes, metadata)`` of the ONNX file ``path``.

    Raises:
        OnnxModelError: naming the file, when it is not a protobuf ``ModelProto`` with one graph, or when its
            metadata repeats a key.
    """
    source = str(path)
    data = memoryview(Path(path).read_bytes())
    graphs, metadata = [], {}
    for number, wire, value in _fields(data, source):
        if number == _GRAPH and wire == 2:
            graphs.append(value)
        elif number == _METADATA and wire == 2:
            entry = {n: _text(v, source) for n, w, v in _fields(value, source) if w == 2 and n in (1, 2)}
            key = entry.get(1, "")
            if key in metadata:
                raise OnnxModelError(f"{source}: its metadata gives {key!r} twice; export the model again")
            metadata[key] = entry.get(2, "")
    if len(graphs) != 1:
        raise OnnxModelError(f"cannot load ONNX model {source}: {len(graphs)} graphs, not one")
    return bytes(graphs[0]), metadata


def graph_sha256(graph: bytes) -> str:
    """SHA-256 of a graph's serialized bytes, as hex (equal to :func:`ssd.inference.backends.onnx.graph_digest` of
    the parsed model: ONNX messages have no maps, so their serialization is deterministic)."""
    return hashlib.sha256(graph).hexdigest()
