"""Every error ``ssd`` raises for bad input, in one place: catch them by type, the command line prints each as one
``error: ...`` line (exit code 1; :class:`UsageError` exits 2).

The tree (a subclass is indented under its parent; every message names the file or object, the bad value and the
rule)::

    ValueError
    ├── DataError               a dataset that cannot be read or used (ssd.data)
    │   └── ImageError          an image file that does not decode or is refused by a rule
    ├── CheckpointError         a checkpoint that is missing, truncated, corrupt, foreign or does not fit
    │   ├── WeightsDownloadError  known weights that could not be fetched or fail their checksum (ssd.weights.hub)
    │   ├── WeightsImportError    a foreign weights file that is no detector this library imports (ssd import)
    │   ├── OnnxModelError        an exported model that ssd cannot run (ssd.inference.backends)
    │   └── ModelConfigError      a checkpoint's model configuration that lacks a setting or holds a wrong type
    ├── ConfigError             an unknown option or an invalid value (ssd.settings, every command's options)
    ├── PriorConfigError        a default-box configuration or input size that gives no default boxes
    ├── BackboneWeightsError    a backbone weights file that is missing, unreadable or for another architecture
    ├── OutputError             an output that would overwrite an input, has the wrong kind, or failed to write
    ├── JSONInputError          a JSON file too large, too deep, not JSON or not what it should hold
    │   └── DetectionsError     detections that are not COCO results of the dataset (ssd val --detections)
    ├── StreamError             a live source that cannot be opened or stopped, or a bad .streams file
    ├── GlobLimitError          a glob pattern that matches more than ssd.limits.MAX_GLOB_PATHS paths
    ├── RequestError            a request the server refuses, with its HTTP status (ssd serve)
    ├── ServerError             a refusal from the server, as the client sees it (ssd.client)
    ├── ExportCheckError        ONNX Runtime's outputs differ from PyTorch's beyond the tolerances (ssd export)
    ├── NonFiniteLossError      the loss or the weights became NaN/inf during training
    └── CallbackError           a training callback that cannot run as given (a TypeError too)
    ImportError
    └── MissingDependencyError  an optional dependency (a pip extra) is not installed; names the pip install
    Exception
    └── UsageError              a command-line mistake (ssd.cli; exit code 2)

The YAML reader's own errors (``ssd.yamlfile.YAMLLimitError``, ``YAMLDuplicateKeyError``) are ``yaml.YAMLError``
subclasses, so that its callers handle them with PyYAML's; they stay there.

This module imports nothing (any layer may import it).
"""

from __future__ import annotations

__all__ = ["DataError", "ImageError", "CheckpointError", "WeightsDownloadError", "WeightsImportError",
           "OnnxModelError", "ConfigError", "ModelConfigError", "PriorConfigError", "BackboneWeightsError",
           "OutputError", "JSONInputError", "DetectionsError", "StreamError", "GlobLimitError", "RequestError",
           "ServerError", "ExportCheckError", "NonFiniteLossError", "CallbackError", "MissingDependencyError",
           "UsageError"]


class DataError(ValueError):
    """A dataset cannot be read or used (the message names the file, the bad value and the rule)."""


class ImageError(DataError):
    """An image file that cannot or will not be decoded; the message starts with the file.

    ``code`` is ``missing_image``, ``corrupt_image`` (does not decode) or ``unsupported_image`` (refused by a rule:
    too many pixels, several frames, a pixel format without an 8-bit meaning) or ``too_many_pixels`` (over the
    caller's bound, :func:`ssd.data.images.decode_upload`); ``reason`` is the message without the
    file, for reports that name the file their own way.
    """

    def __init__(self, message: str, code: str = "corrupt_image", reason: str = ""):
        super().__init__(message)
        self.code, self.reason = code, reason or message


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupt, foreign, or does not fit the request."""


class WeightsDownloadError(CheckpointError):
    """Known weights that could not be fetched: offline, a server error, or bytes whose checksum is wrong."""


class WeightsImportError(CheckpointError):
    """A weights file that is no detector of a format this library imports, or does not fit its architecture."""


class OnnxModelError(CheckpointError):
    """An exported file that ``ssd`` cannot run: unreadable, not exported by ``ssd export``, modified or
    inconsistent."""


class ModelConfigError(CheckpointError):
    """A checkpoint's model configuration (``ModelConfig.from_dict``) that lacks a setting or holds one of the
    wrong type."""


class ConfigError(ValueError):
    """An unknown option or an invalid value (the message names the option, the value and the rule)."""


class PriorConfigError(ValueError):
    """A default-box configuration or input size that cannot give default boxes (the message names the value)."""


class BackboneWeightsError(ValueError):
    """A backbone weights file that is missing, unreadable or made for another architecture."""


class OutputError(ValueError):
    """An output path that would overwrite an input or has the wrong kind, or a write that failed (one line)."""


class JSONInputError(ValueError):
    """A JSON file a user gave that is too large, too deeply nested, not JSON, or not what it should hold."""


class DetectionsError(JSONInputError):
    """A detections list or file (``ssd val --detections``) that is not COCO results of the dataset."""


class StreamError(ValueError):
    """A live source that cannot be opened, stopped and did not come back, or a bad ``.streams`` file."""


class GlobLimitError(ValueError):
    """A glob pattern that matches more paths than :data:`ssd.limits.MAX_GLOB_PATHS`."""


class RequestError(ValueError):
    """A request the server refuses, with its HTTP ``status`` (400 bad value or image, 413 too large, 415 wrong
    content type)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class ServerError(ValueError):
    """The server refused a request: ``status`` and its message (the JSON ``error``); ``status`` ``None``: no answer
    came (the server is down or unreachable, or it timed out)."""

    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


class ExportCheckError(ValueError):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerances (the message says where and by how much)."""


class NonFiniteLossError(ValueError):
    """The loss or the weights became NaN/inf (the message says where, what was saved and what to try)."""


class CallbackError(ValueError, TypeError):
    """A callback that cannot run as given (a ``TypeError`` too, as it was before it had a type of its own)."""


class MissingDependencyError(ImportError):
    """A feature needs an optional dependency (a pip extra of ssd-detect) that is not installed; the message names
    the ``pip install`` that brings it (the CLI prints it as one line)."""


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""
