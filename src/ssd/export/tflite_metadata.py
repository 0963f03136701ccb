"""The metadata that makes a ``.tflite`` file of :mod:`ssd.export.tflite` run as it is in MediaPipe's
``ObjectDetector`` (Android, iOS, web, Python): the TFLite metadata flatbuffer (``TFLITE_METADATA``) and the zip of
associated files appended to the model, as MediaPipe's metadata writer lays them out.

What MediaPipe reads: the input's normalization (``mean``/``std`` in pixel units; the graph normalizes itself, so
MediaPipe feeds the uint8 pixels unchanged), the two raw outputs ``location`` and ``score`` (with ``labels.txt``),
and the ``DETECTOR_METADATA`` custom metadata: the default boxes as fixed SSD anchors and the decoding
(``x_scale = 1 / variances[0]``, ``w_scale = 1 / variances[1]``, exponential sizes, scores used as they are). MediaPipe
then decodes, keeps each box's best class and runs its own NMS.

The metadata is written with MediaPipe's generated flatbuffer classes and ``metadata_info`` (pure Python);
MediaPipe's own populator needs a compiled module that some wheels lack.
"""

from __future__ import annotations

import io
import zipfile

import flatbuffers
import numpy as np
from torch import Tensor

from ssd.card import ModelCard
from ssd.inference.backends.tflite import LABELS_FILE, METADATA_FILE, PRIORS_FILE, tflite_digest
from ssd.optional import require

__all__ = ["with_metadata"]

_METADATA_FIELD = "TFLITE_METADATA"
_DETECTOR_METADATA = "DETECTOR_METADATA"  # the custom metadata name MediaPipe's object detector looks up


def _detector_options(fb, priors: Tensor, num_classes: int, variances: tuple[float, float]):
    """MediaPipe's ``DETECTOR_METADATA`` custom metadata: anchors and decoding for ``priors [P, 4]`` cxcywh."""
    options = fb.ObjectDetectorOptionsT()
    anchors = []
    for cx, cy, w, h in priors.tolist():
        anchor = fb.FixedAnchorT()
        anchor.xCenter, anchor.yCenter, anchor.width, anchor.height = cx, cy, w, h
        anchors.append(anchor)
    options.ssdAnchorsOptions = fb.SsdAnchorsOptionsT()
    options.ssdAnchorsOptions.fixedAnchorsSchema = fb.FixedAnchorsSchemaT()
    options.ssdAnchorsOptions.fixedAnchorsSchema.anchors = anchors
    decoding = options.tensorsDecodingOptions = fb.TensorsDecodingOptionsT()
    decoding.numClasses, decoding.numBoxes, decoding.numCoords = num_classes, len(anchors), 4
    decoding.keypointCoordOffset = decoding.numKeypoints = 0
    decoding.numValuesPerKeypoint = 2  # MediaPipe requires (x, y) keypoints even when there are none
    decoding.xScale = decoding.yScale = 1 / variances[0]
    decoding.wScale = decoding.hScale = 1 / variances[1]
    decoding.applyExponentialOnBoxSize, decoding.sigmoidScore = True, False
    builder = flatbuffers.Builder(0)
    builder.Finish(options.Pack(builder), b"V001")
    return bytes(builder.Output())


def _metadata_buffer(card: ModelCard, priors: Tensor) -> bytes:
    """The ``TFLITE_METADATA`` flatbuffer for ``card``'s model (input ``image``, outputs ``location``, ``score``)."""
    md = require("mediapipe.tasks.metadata.metadata_schema_py_generated", "tflite", "TFLite export")
    detector_fb = require("mediapipe.tasks.metadata.object_detector_metadata_schema_py_generated", "tflite",
                          "TFLite export")
    info = require("mediapipe.tasks.python.metadata.metadata_writers.metadata_info", "tflite", "TFLite export")
    schema = require("mediapipe.tasks.metadata.schema_py_generated", "tflite", "TFLite export")

    image = info.InputImageTensorMd(
        name="image", description="RGB image at the network size, uint8 (normalized inside the graph)",
        norm_mean=[m * 255 for m in card.mean], norm_std=[s * 255 for s in card.std],
        color_space_type=md.ColorSpaceType.RGB, tensor_type=schema.TensorType.UINT8).create_metadata()
    location = info.LocationTensorMd(name="location", description="box offsets from the anchors, (y, x, h, w)"
                                     ).create_metadata()
    score = info.ClassificationTensorMd(name="score", description="softmax probability of each class",
                                        label_files=[info.LabelFileMd(LABELS_FILE)]).create_metadata()
    custom = md.CustomMetadataT()
    custom.name = _DETECTOR_METADATA
    custom.data = list(_detector_options(detector_fb, priors, card.num_classes, card.variances))
    subgraph = md.SubGraphMetadataT()
    subgraph.inputTensorMetadata, subgraph.outputTensorMetadata = [image], [location, score]
    subgraph.customMetadata = [custom]
    model = info.GeneralMd(name="ObjectDetector", version=card.model_name,
                           description=f"SSD ({card.model_name}) exported by ssd-detect").create_metadata()
    model.subgraphMetadata = [subgraph]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), b"M001")
    return bytes(builder.Output())


def _insert(flatbuffer: bytes, metadata: bytes) -> bytes:
    """The TFLite model ``flatbuffer`` with ``metadata`` as its ``TFLITE_METADATA`` entry; buffers stored after the
    flatbuffer (``offset``/``size``, as litert-torch's FP16 recipe writes them) are moved inside it."""
    schema = require("mediapipe.tasks.metadata.schema_py_generated", "tflite", "TFLite export")
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    for buffer in model.buffers or []:
        if buffer.offset > 1:  # 0 and 1: no data outside the flatbuffer
            buffer.data = np.frombuffer(flatbuffer, np.uint8, buffer.size, buffer.offset)
            buffer.offset = buffer.size = 0
    buffer = schema.BufferT()
    buffer.data = list(metadata)
    model.buffers = [*(model.buffers or []), buffer]
    entry = schema.MetadataT()
    entry.name, entry.buffer = _METADATA_FIELD, len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if m.name != _METADATA_FIELD.encode()] + [entry]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), b"TFL3")
    return bytes(builder.Output())


def with_metadata(flatbuffer: bytes, card: ModelCard, priors: Tensor) -> bytes:
    """The ``.tflite`` file of a converted graph: ``flatbuffer`` with MediaPipe's metadata, followed by the zip of
    ``labels.txt``, ``priors.bin`` (``priors [P, 4]`` float32 little-endian, for runtimes without the metadata
    parser) and ``ssd.json``, ``card`` sealed with :func:`ssd.inference.backends.tflite.tflite_digest`."""
    import json

    model = _insert(flatbuffer, _metadata_buffer(card, priors))
    files = {LABELS_FILE: "\n".join(card.class_names).encode(),
             PRIORS_FILE: priors.float().contiguous().numpy().astype("<f4").tobytes()}
    sealed = card.sealed(tflite_digest(model, files))
    files[METADATA_FILE] = json.dumps(sealed.to_strings()).encode()
    archive = io.BytesIO()
    archive.write(model)
    with zipfile.ZipFile(archive, "a", compression=zipfile.ZIP_STORED) as zf:  # MediaPipe reads stored members
        for name, data in files.items():
            zf.writestr(name, data)
    return archive.getvalue()
