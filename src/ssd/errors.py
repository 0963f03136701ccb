"""Every error ``ssd`` raises for bad input, in one place: catch them by type (all are :class:`SSDError`), the
command line prints each as one ``error: ...`` line (exit code 1; :class:`UsageError` exits 2). Any other exception is
a bug and the command line shows its traceback.

Each class is also the built-in type it was before :class:`SSDError` existed (``ValueError`` for bad values,
``FileNotFoundError`` for a missing input, ``ImportError`` for a missing extra), so ``except ValueError`` code keeps
working. The tree (a subclass is indented under its parent; every message names the file or object, the bad value
and the rule)::

    SSDError, and ValueError
    ├── DataError               a dataset that cannot be read or used (ssd.data)
    │   └── ImageError          an image file that does not decode or is refused by a rule
    ├── CheckpointError         a checkpoint that is missing, truncated, corrupt, foreign or does not fit
    │   ├── WeightsDownloadError  known weights that could not be fetched or fail their checksum (ssd.weights.hub)
    │   ├── WeightsImportError    a foreign weights file that is no detector this library imports (ssd import)
    │   ├── OnnxModelError        an exported model that ssd cannot run (ssd.inference.backends)
    │   └── ModelConfigError      a checkpoint's model configuration that lacks a setting or holds a wrong type
    ├── ConfigError             an unknown option or an invalid value (ssd.settings, every command's options)
    ├── InputError              an argument of the Python API that is not what it takes (a tensor's shape or values)
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
    ├── StudyError              a tuning study's database that is corrupt, not Optuna's or another tune's (ssd tune)
    └── CallbackError           a training callback that cannot run as given (a TypeError too)
    SSDError, and FileNotFoundError
    └── MissingInputError       a source, dataset or file the user named that does not exist
    SSDError, and ImportError
    └── MissingDependencyError  an optional dependency (a pip extra) is not installed; names the pip install
    SSDError
    └── UsageError              a command-line mistake (ssd.cli; exit code 2)

The YAML reader's own errors (``ssd.yamlfile.YAMLLimitError``, ``YAMLDuplicateKeyError``) are ``yaml.YAMLError``
subclasses, so that its callers handle them with PyYAML's; they stay there.

This module imports nothing (any layer may import it).
"""

from __future__ import annotations


class SSDError(Exception):
    """The base of every error of ``ssd``'s own: what the command line prints as one ``error:`` line."""

__all__ = ["SSDError", "DataError", "ImageError", "CheckpointError", "WeightsDownloadError", "WeightsImportError",
           "OnnxModelError", "ConfigError", "ModelConfigError", "PriorConfigError", "BackboneWeightsError",
           "InputError", "OutputError", "JSONInputError", "DetectionsError", "StreamError", "GlobLimitError",
           "RequestError", "ServerError", "ExportCheckError", "NonFiniteLossError", "StudyError", "CallbackError",
           "MissingDependencyError", "MissingInputError", "UsageError"]


class DataError(SSDError, ValueError):
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


class CheckpointError(SSDError, ValueError):
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


class ConfigError(SSDError, ValueError):
    """An unknown option or an invalid value (the message names the option, the value and the rule)."""


class InputError(SSDError, ValueError):
    """An argument of the Python API that is not what the function takes: a tensor's shape, dtype or values, an
    image of the wrong type (the message names the argument, what it got and what it takes)."""


class PriorConfigError(SSDError, ValueError):
    """A default-box configuration or input size that cannot give default boxes (the message names the value)."""


class BackboneWeightsError(SSDError, ValueError):
    """A backbone weights file that is missing, unreadable or made for another architecture."""


class OutputError(SSDError, ValueError):
    """An output path that would overwrite an input or has the wrong kind, or a write that failed (one line)."""


class JSONInputError(SSDError, ValueError):
    """A JSON file a user gave that is too large, too deeply nested, not JSON, or not what it should hold."""


class DetectionsError(JSONInputError):
    """A detections list or file (``ssd val --detections``) that is not COCO results of the dataset."""


class StreamError(SSDError, ValueError):
    """A live source that cannot be opened, stopped and did not come back, or a bad ``.streams`` file."""


class GlobLimitError(SSDError, ValueError):
    """A glob pattern that matches more paths than :data:`ssd.limits.MAX_GLOB_PATHS`."""


class RequestError(SSDError, ValueError):
    """A request the server refuses, with its HTTP ``status`` (400 bad value or image, 413 too large, 415 wrong
    content type)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class ServerError(SSDError, ValueError):
    """The server refused a request: ``status`` and its message (the JSON ``error``); ``status`` ``None``: no answer
    came (the server is down or unreachable, or it timed out)."""

    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


class ExportCheckError(SSDError, ValueError):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerances (the message says where and by how much)."""


class NonFiniteLossError(SSDError, ValueError):
    """The loss or the weights became NaN/inf (the message says where, what was saved and what to try)."""


class StudyError(SSDError, ValueError):
    """A study database ``ssd tune`` will not use: not SQLite, another program's tables, a study of another model or
    dataset, or one Optuna cannot open (the message names the database; it is never overwritten)."""


class CallbackError(SSDError, ValueError, TypeError):
    """A callback that cannot run as given (a ``TypeError`` too, as it was before it had a type of its own)."""


class MissingDependencyError(SSDError, ImportError):
    """A feature needs an optional dependency (a pip extra of ssd-detect) that is not installed; the message names
    the ``pip install`` that brings it (the CLI prints it as one line)."""


class MissingInputError(SSDError, FileNotFoundError):
    """A source, dataset, folder or file the user named that does not exist (the message names it and what to give)."""


class UsageError(SSDError):
    """A command-line mistake (exit code 2)."""
