"""What a model artifact is: :class:`ModelCard`, the one type every checkpoint and export carries.

A card holds what the rest of the pipeline needs to use a network and what changes its results: the model name,
the class names (label ``k`` is ``class_names[k]``) and the dataset's category ids, the input size ``(h, w)``, the
normalization, the box encoding's variances, the stored best-F1 operating point (the default confidence of
predict), the thresholds fixed in a graph with NMS inside, the precision, and one checksum.

One validator (:meth:`ModelCard.from_dict`, the rule of every field, raising the caller's error type naming the
source, the field, the value and the rule), one serialization to a dict of JSON values (:meth:`~ModelCard.to_dict`,
what checkpoints and ``ssd.json`` store) and to strings (:meth:`~ModelCard.to_strings`, ONNX ``metadata_props`` and
OpenVINO's ``metadata.json``). The keys are those exports have always written, so files written before the card
read as cards.

The checksum (:meth:`~ModelCard.sealed`, :meth:`~ModelCard.verify`) covers the network and every field: ``network``
is the digest of the artifact kind's network (one function per kind: the ONNX graph, the OpenVINO IR files, the
``torch.export`` program, a checkpoint's state dict), ``fields`` a fingerprint of each field, so that an edit is
refused naming the field, and ``sha256`` the digest of both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ssd._version import __version__
from ssd.limits import MAX_DETECTIONS, MAX_INPUT_SIDE, is_real, is_whole, value_text
from ssd.log import LOGGER
from ssd.names import class_names_problem
from ssd.settings import PREDICT, Thresholds
from ssd.sizes import as_hw, compact_size

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["ModelCard", "OPERATING_POINT_KEYS", "PRECISIONS", "check_operating_point", "check_category_ids",
           "network_digest", "strings_from_json", "legacy_warning"]

OPERATING_POINT_KEYS = ("score_threshold", "precision", "recall", "f1", "split")
"""The operating point (the optional ``operating_point`` of a card): the best-F1 confidence on a split and its
precision, recall and F1 there; what predict uses as its default confidence."""

PRECISIONS = ("fp32", "int8", "fp16")
_NMS_KEYS = ("score_threshold", "iou_threshold", "max_det")
_PLAIN_TEXT = ("model_name",)  # stored as text, not JSON, in the string form
_CHECKSUM = "checksum"


def check_operating_point(value: Any, source: str, error: type[Exception] = ValueError) -> dict[str, Any] | None:
    """``value`` (``None`` or a dict of :data:`OPERATING_POINT_KEYS`: ``score_threshold`` in ``[0, 1)``,
    precision / recall / F1 in ``[0, 1]``, ``split`` a string) as a plain dict; raises ``error`` naming ``source``."""
    if value is None:
        return None
    rule = "a dict of score_threshold in [0, 1), precision, recall, f1 in [0, 1] and split (a name)"
    if not isinstance(value, Mapping) or set(value) != set(OPERATING_POINT_KEYS):
        raise error(f"{source}: operating_point must be {rule}, got {_shown(value)}")
    numbers = [value[k] for k in OPERATING_POINT_KEYS[:4]]
    if (not all(_finite(v) and 0 <= v <= 1 for v in numbers) or not value["score_threshold"] < 1
            or not isinstance(value["split"], str)):
        raise error(f"{source}: operating_point must be {rule}, got {_shown(value)}")
    return {**{k: float(value[k]) for k in OPERATING_POINT_KEYS[:4]}, "split": value["split"]}


def check_category_ids(ids: Any, num_classes: int, source: str, error: type[Exception] = ValueError
                       ) -> list[int] | None:
    """``ids`` (a sequence of ``K`` integers: label ``k`` -> the dataset's category id) as a list, or ``None``;
    raises ``error`` naming ``source`` otherwise."""
    if ids is None:
        return None
    values = ids.tolist() if hasattr(ids, "tolist") else ids  # a tensor or numpy array
    if (not isinstance(values, Sequence) or isinstance(values, str) or len(values) != num_classes
            or not all(map(is_whole, values))):
        raise error(f"{source}: category_ids must be {num_classes} integers (one per class), got {value_text(ids)}")
    return list(values)


def network_digest(code: str, tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 of a PyTorch network's ``code`` and of its named ``tensors`` (name, dtype, shape, bytes), as hex: the
    network digest of a checkpoint (its state dict, no code) and of a ``torch.export`` program."""
    import torch

    digest = hashlib.sha256(code.encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def legacy_warning(source: str, action: str) -> str:
    """What a file written before model cards does not cover (its network is checked, its fields are not)."""
    return (f"{source} was written before model cards: its network is checked against the digest stored with it, "
            "but its fields (class names, input size, normalization, thresholds) are covered by no checksum, and an "
            f"edit of them, or a newer file stripped to this layout, is not detected; {action} to cover them")


def _shown(value: Any) -> str:
    """A value for a message: a small mapping entry by entry (each cut by :func:`ssd.limits.value_text`)."""
    if isinstance(value, Mapping) and len(value) <= 2 * len(OPERATING_POINT_KEYS):
        return "{" + ", ".join(f"{value_text(k)}: {value_text(v)}" for k, v in value.items()) + "}"
    return value_text(value)


def _finite(v: Any) -> bool:
    return is_real(v, finite=True)


def _numbers(count: int, positive: bool = False):
    return lambda v: (isinstance(v, (list, tuple)) and len(v) == count
                      and all(_finite(x) and (x > 0 or not positive) for x in v))


def _side(v: Any) -> bool:
    return is_whole(v) and 0 < v <= MAX_INPUT_SIDE


# field -> (test of the JSON value, the rule in words)
_RULES = {
    "model_name": (lambda v: v is None or isinstance(v, str), "a name"),
    "class_names": (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(n, str) for n in v),
                    "a non-empty list of strings"),
    "image_size": (lambda v: _side(v) or (isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_side, v))),
                   f"a side S or [H, W], each from 1 to {MAX_INPUT_SIDE}"),
    "mean": (_numbers(3), "a list of 3 finite numbers"),
    "std": (_numbers(3, positive=True), "a list of 3 positive numbers"),
    "variances": (_numbers(2, positive=True), "a list of 2 positive numbers"),
    "nms": (lambda v: isinstance(v, bool), "true or false"),
    "score_threshold": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "iou_threshold": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "max_det": (lambda v: is_whole(v) and 0 < v <= MAX_DETECTIONS, f"an integer from 1 to {MAX_DETECTIONS}"),
    "precision": (lambda v: v in PRECISIONS, " or ".join(map(json.dumps, PRECISIONS))),
    "category_ids": (lambda v: True, ""),  # check_category_ids
    "operating_point": (lambda v: True, ""),  # check_operating_point
    _CHECKSUM: (lambda v: isinstance(v, Mapping) and isinstance(v.get("sha256"), str)
                and isinstance(v.get("network"), str) and isinstance(v.get("fields"), Mapping),
                "an object of sha256, network and fields"),
}
_REQUIRED = ("class_names", "image_size", "mean", "std", "variances", "nms")


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What a network is and how to use it (see the module docstring).

    Attributes:
        model_name: the architecture (``ssd_tiny``, ...), ``None`` where a file does not say.
        class_names: the K class names; ``category_ids``: the dataset's category id of each label, or ``None``.
        image_size: the network input ``(h, w)``; ``mean``, ``std``: per-channel normalization;
            ``variances``: the box encoding's two variances.
        operating_point: the stored best-F1 point (:data:`OPERATING_POINT_KEYS`) or ``None``.
        nms: the thresholds fixed in a graph with NMS inside (:class:`ssd.settings.Thresholds`), ``None`` for a
            network that returns head outputs.
        precision: ``"fp32"``, ``"int8"`` or ``"fp16"`` (float16 weights: TFLite).
        checksum: ``{"sha256", "network", "fields"}`` (:meth:`sealed`), or ``None`` before sealing.
    """

    model_name: str | None
    class_names: tuple[str, ...]
    image_size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    variances: tuple[float, float]
    category_ids: tuple[int, ...] | None = None
    operating_point: Mapping[str, Any] | None = None
    nms: Thresholds | None = None
    precision: str = "fp32"
    checksum: Mapping[str, Any] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def replace(self, **changes: Any) -> ModelCard:
        """A copy with ``changes`` (field values, e.g. ``nms=Thresholds(...)``), validated through :meth:`to_dict`
        and :meth:`from_dict`; the checksum is dropped (seal the new card again)."""
        return ModelCard.from_dict(dataclasses.replace(self, checksum=None, **changes).to_dict(), "the model card")

    def confidence(self, score_threshold: float | None = None, given: str = "score_threshold") -> tuple[float, str]:
        """The score threshold a prediction uses and where it comes from, in words: ``score_threshold`` when given
        (``given`` names the option), else the operating point's, else :data:`ssd.settings.PREDICT`'s; a graph with
        NMS inside cannot go below the threshold fixed at its export, which is then the default."""
        if score_threshold is not None:
            return score_threshold, given
        point = self.operating_point
        value, origin = ((point["score_threshold"], f"the model's best-F1 confidence on its {point['split']} split")
                         if point is not None else (PREDICT.score_threshold, "default"))
        if self.nms is not None and value < self.nms.score_threshold:
            below = "the model's" if point is not None else "the default"
            return self.nms.score_threshold, f"the NMS graph's threshold, above {below} {value:g}"
        return value, origin

    # --- serialization -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON values under the keys exports have always written (``image_size`` an int when square, ``nms`` a
        bool and, with NMS, ``score_threshold``, ``iou_threshold``, ``max_det``); absent optional fields are left
        out."""
        values: dict[str, Any] = {
            "model_name": self.model_name,
            "class_names": list(self.class_names),
            "category_ids": None if self.category_ids is None else list(self.category_ids),
            "image_size": _json_size(self.image_size),
            "mean": list(self.mean),
            "std": list(self.std),
            "variances": list(self.variances),
            "operating_point": None if self.operating_point is None else dict(self.operating_point),
            "nms": self.nms is not None,
            "precision": self.precision,
        }
        if self.nms is not None:
            values.update(score_threshold=self.nms.score_threshold, iou_threshold=self.nms.iou_threshold,
                          max_det=self.nms.max_detections)
        if self.checksum is not None:
            values[_CHECKSUM] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.checksum.items()}
        return {k: v for k, v in values.items() if v is not None}

    def to_strings(self) -> dict[str, str]:
        """:meth:`to_dict` as strings (ONNX ``metadata_props``): JSON text, the model name as it is, and
        ``ssd_version``."""
        strings = {k: v if k in _PLAIN_TEXT else json.dumps(v) for k, v in self.to_dict().items()}
        return {"ssd_version": __version__, **strings}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str, error: type[Exception] = ValueError) -> ModelCard:
        """The card of :meth:`to_dict`'s values (unknown keys ignored: files carry others), every field checked;
        ``error`` names ``source``, the field, the value and the rule."""
        for key, value in values.items():
            test, rule = _RULES.get(key, (None, None))
            if test is not None and not test(value):
                raise error(f"{source}: {key}={value_text(value)} is not {rule}; export the model again")
        nms = values.get("nms") is True
        missing = [k for k in _REQUIRED + (_NMS_KEYS if nms else ()) if k not in values]
        if missing:
            raise error(f"{source}: the model card lacks {', '.join(missing)} (has {', '.join(values) or 'nothing'});"
                        " it was edited or written by another tool; export the model again with `ssd export`")
        names = tuple(values["class_names"])
        if (problem := class_names_problem(names)) is not None:  # names are data: shown, never acting on a terminal
            raise error(f"{source}: {problem}")
        ids = check_category_ids(values.get("category_ids"), len(names), source, error)
        return cls(
            model_name=values.get("model_name"), class_names=names, image_size=as_hw(values["image_size"]),
            mean=tuple(float(v) for v in values["mean"]), std=tuple(float(v) for v in values["std"]),
            variances=tuple(float(v) for v in values["variances"]),
            category_ids=None if ids is None else tuple(ids),
            operating_point=check_operating_point(values.get("operating_point"), source, error),
            nms=Thresholds(float(values["score_threshold"]), float(values["iou_threshold"]), values["max_det"])
            if nms else None,
            precision=values.get("precision", "fp32"), checksum=values.get(_CHECKSUM))

    @classmethod
    def from_strings(cls, raw: Mapping[str, str], source: str, error: type[Exception] = ValueError) -> ModelCard:
        """The card of :meth:`to_strings`' output (or of an export written before the card, same keys); a value
        that is not JSON is refused like a wrong one."""
        if "class_names" not in raw and "image_size" not in raw:
            raise error(f"{source} was not written by `ssd export` (no class_names or image_size metadata); export "
                        "it with `ssd export --weights CKPT --format onnx`")
        values = {}
        for key, text in raw.items():
            if key in _PLAIN_TEXT or key not in _RULES:
                values[key] = text
                continue
            try:
                values[key] = json.loads(text)
            except (json.JSONDecodeError, TypeError, RecursionError):  # RecursionError: nested deeper than decoded
                raise error(f"{source}: metadata {key}={value_text(text)} is not JSON; export the model again"
                            ) from None
        return cls.from_dict(values, source, error)

    # --- checksum ------------------------------------------------------------------------------------------
    def fingerprints(self) -> dict[str, str]:
        """Field -> a short SHA-256 of its JSON value (every :meth:`to_dict` key but the checksum)."""
        values = {k: v for k, v in self.to_dict().items() if k != _CHECKSUM}
        return {k: hashlib.sha256(_canonical(v).encode()).hexdigest()[:16] for k, v in values.items()}

    def sealed(self, network: str) -> ModelCard:
        """This card with the checksum of ``network`` (the artifact kind's network digest) and of every field."""
        fields = self.fingerprints()
        checksum = {"sha256": _whole(network, fields), "network": network, "fields": fields}
        return dataclasses.replace(self, checksum=checksum)

    def verify(self, network: str, source: str, error: type[Exception] = ValueError) -> None:
        """Refuse (``error``) a card without checksum, a field that changed since it was sealed (named), a network
        whose digest is not ``network``'s, or an edited checksum."""
        if self.checksum is None:
            raise error(f"{source}: the model card has no checksum (the one `ssd export` stores): it was removed or "
                        "the file was written by another tool; export the model again")
        stored, now = self.checksum["fields"], self.fingerprints()
        changed = [k for k in [*now, *stored] if now.get(k) != stored.get(k)]
        if changed:
            value = self.to_dict().get(changed[0])
            raise error(f"{source}: {changed[0]} ({value_text(value)}) is not what was written with the model (the "
                        "checksum of the model card differs): the file was edited after it was written; export or "
                        "save the model again")
        if self.checksum["network"] != network:
            raise error(f"{source}: the network (weights or graph) does not match the checksum stored with it: the "
                        "file was modified or corrupted after it was written; export or save the model again")
        if self.checksum["sha256"] != _whole(network, stored):
            raise error(f"{source}: the checksum of the model card was edited; export or save the model again")

    @classmethod
    def from_file_strings(cls, raw: Mapping[str, str], network: Callable[[], str],
                          legacy: Mapping[str, Callable[[], str]], source: str,
                          error: type[Exception] = ValueError) -> ModelCard:
        """The card of an exported file (``raw``, its string form: :meth:`from_strings`), checked against
        ``network()`` (:meth:`verify`). A file written before the card has no checksum but its kind's network
        checksums (``legacy``: key -> the digest it stores), each checked as it was then. A missing checksum is
        refused like a wrong one: deleting it must not let an edit through. The digests are computed only when
        needed, once."""
        card = cls.from_strings(raw, source, error)
        if card.checksum is None and any(key in raw for key in legacy):
            for key, digest in legacy.items():
                if raw.get(key) != digest():
                    raise error(f"{source}: the network does not match the checksum stored at export ({key}, missing "
                                "or different): the file was modified or corrupted after `ssd export`; export it again")
            LOGGER.warning(legacy_warning(source, "export it again"))
            return card
        card.verify(network(), source, error)
        return card


def strings_from_json(text: str | bytes, source: str, error: type[Exception] = ValueError) -> dict[str, str]:
    """A card's string form (:meth:`ModelCard.to_strings`) stored as a JSON object (OpenVINO's ``metadata.json``, a
    ``.pt2``'s ``ssd.json``); refused (``error`` naming ``source``) when it is not JSON, nested deeper than the
    interpreter decodes, or not an object of strings."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{source} is not JSON ({e}); export the model again") from e
    except RecursionError:  # a card is one flat object; the decoder recurses per level of nesting
        raise error(f"{source} is nested too deeply to be a JSON object of strings; export the model again") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise error(f"{source} is not a JSON object of strings; export the model again")
    return raw


def _json_size(size: tuple[int, int]) -> int | list[int]:
    compact = compact_size(size)
    return list(compact) if isinstance(compact, tuple) else compact


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _whole(network: str, fields: Mapping[str, str]) -> str:
    return hashlib.sha256(_canonical({"network": network, "fields": dict(fields)}).encode()).hexdigest()
