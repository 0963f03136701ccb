"""The default boxes of a run: fitted to a dataset (``ssd check --fit-priors``, ``ssd train --priors auto``) or read
from the YAML file that ``ssd check --fit-priors`` writes (``ssd train --priors FILE``).

The file::

    # comment lines: how it was made and the coverage it gives
    model: ssd300_vgg16
    image_size: 300          # or "384x288" (height x width) for a non-square input; [384, 288] is read too
    coverage: {boxes: 3324, before: 0.583, after: 0.721}
    priors: {feature_maps: [...], steps: [...], min_sizes: [...], max_sizes: [...], aspect_ratios: [...], clip: true}

``priors`` holds :class:`ssd.priors.PriorConfig`'s fields in pixels of ``image_size``; a file holding only those
fields (no ``priors`` key) is read too. Read for another input size of the same model, the box sizes scale with
the input's ``sqrt(height * width)`` (as the model's own default boxes do), the aspect ratios stay, and the feature
maps and steps become the network's at that size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import yaml
from torch import Tensor

from ssd._utils import as_hw, compact_size, size_text
from ssd.data.check import spec_boxes
from ssd.data.records import DatasetSpec
from ssd.files import write_text
from ssd.models import MODEL_CONFIGS
from ssd.models.build import default_priors
from ssd.priors import PriorConfig
from ssd.priors.fit import FitResult, fit_priors
from ssd.yamlfile import safe_load

__all__ = ["fit_for_model", "load_priors", "resolve_priors", "save_priors", "train_command", "training_boxes"]

TRAIN_SPLIT = "train"
_FILE_KEYS = ("model", "image_size", "coverage", "priors")


def training_boxes(spec: DatasetSpec) -> Tensor:
    """``[N, 4]`` xyxy normalized boxes of the training split (every split when there is no ``train`` split)."""
    return spec_boxes(spec, [TRAIN_SPLIT] if TRAIN_SPLIT in spec.splits else None)


def fit_for_model(data: DatasetSpec | Tensor, model: str, image_size: int | tuple[int, int] | str | None = None, *,
                  free: bool = False, seed: int = 0) -> FitResult:
    """:func:`ssd.priors.fit.fit_priors` for ``model`` at ``image_size`` (default: its own; an int, ``(h, w)`` or
    ``"HxW"``) on a dataset's training split (or on boxes ``[N, 4]`` xyxy normalized to their images)."""
    boxes = data if isinstance(data, Tensor) else training_boxes(data)
    base = default_priors(model, image_size)
    size = MODEL_CONFIGS[model].image_size if image_size is None else image_size
    return fit_priors(boxes, size, base, free=free, seed=seed)


def save_priors(path: str | Path, result: FitResult, model: str, source: str | None = None) -> Path:
    """Write ``result.priors`` as the YAML file ``ssd train --priors FILE`` reads; returns the path."""
    path = Path(path)
    b, a = result.before, result.after
    how = "fitted" if result.changed else "kept (the fit gained too little)"
    size = size_text(result.image_size)
    lines = [f"# default boxes of {model} at {size} px, {how} by `ssd check --fit-priors"
             f"{'=free' if result.free else ''}`" + (f" on {source}" if source else ""),
             f"# coverage of the {b['boxes']} training boxes (IoU >= {b['iou_threshold']}): {b['covered']:.1%} with "
             f"the defaults, {a['covered']:.1%} fitted; use with: {train_command(model, result.image_size, path.name)}"]
    square = isinstance(result.image_size, int)
    body = {"model": model, "image_size": result.image_size if square else size,  # an int or "HxW"
            "coverage": {"boxes": b["boxes"], "before": round(b["covered"], 4), "after": round(a["covered"], 4)},
            "priors": result.priors.to_dict()}
    return write_text(path, "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None))


def train_command(model: str, image_size: int | tuple[int, int] | str, priors_file: str | Path) -> str:
    """The ``ssd train`` options that use a priors file (``--image-size`` when the input is not square)."""
    size = compact_size(image_size)
    return (f"ssd train --model {model}" + ("" if isinstance(size, int) else f" --image-size {size_text(size)}")
            + f" --priors {priors_file}")


def load_priors(path: str | Path) -> tuple[PriorConfig, str | None, int | tuple[int, int] | None]:
    """``(priors, model or None, image_size or None)`` from a file of :func:`save_priors` (or bare prior fields);
    the size is an int for a square input, else ``(height, width)`` (the file may hold ``"HxW"`` or ``[h, w]``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"priors file {path} does not exist (write one with `ssd check DATA --model NAME "
                                "--fit-priors`, or use --priors auto)")
    try:
        values = safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping with a 'priors' key, got {type(values).__name__}")
    if "priors" not in values:
        values = {"priors": values}
    unknown = sorted(set(values) - set(_FILE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown} (a priors file has {', '.join(_FILE_KEYS)})")
    fields = values["priors"]
    try:
        priors = PriorConfig.from_dict(fields)
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: 'priors' must hold feature_maps, steps, min_sizes, max_sizes, aspect_ratios "
                         f"and clip ({exc})") from None
    size = values.get("image_size")
    if size is not None:
        try:
            size = compact_size(size)
        except ValueError:
            raise ValueError(f"{path}: image_size must be a positive int (square input), 'HxW' (height x width, "
                             f"e.g. '384x288') or [height, width], got {size!r}") from None
    return priors, values.get("model"), size


def resolve_priors(spec_or_boxes: DatasetSpec | Tensor | None, model_name: str,
                   image_size: int | tuple[int, int] | str | None,
                   value: str | None, *, seed: int = 0, log: Callable[[str], object] = print) -> PriorConfig | None:
    """The default boxes a run asks for (``TrainConfig.priors``): ``None`` (the model's own: returns ``None``),
    ``"auto"`` (fitted to the training split of ``spec_or_boxes``; ``None`` when the fit gains too little to
    change them) or the path of a priors file (checked against ``model_name``, scaled to ``image_size``).
    Pass the result to ``build_model(..., priors=...)`` / ``model_from_checkpoint(..., priors=...)``."""
    if value is None:
        return None
    size = compact_size(MODEL_CONFIGS[model_name].image_size if image_size is None else image_size)
    if value == "auto":
        if spec_or_boxes is None:
            raise ValueError("priors=auto fits the default boxes to the training data, but no data was given")
        result = fit_for_model(spec_or_boxes, model_name, size, seed=seed)
        b, a = result.before["covered"], result.after["covered"]
        log(f"priors auto: default boxes of {model_name} at {size_text(size)} px "
            + (f"fitted to {result.before['boxes']} training boxes: coverage {b:.1%} -> {a:.1%}" if result.changed
               else f"kept: coverage {b:.1%} (a fit reaches {a:.1%}, too little to change them)"))
        return result.priors if result.changed else None
    priors, model, file_size = load_priors(value)
    if model is not None and model != model_name:
        raise ValueError(f"{value} holds default boxes for {model}, not {model_name}: fit them for this model with "
                         f"`ssd check DATA --model {model_name} --fit-priors`")
    if file_size is None or file_size == size:
        return priors
    target = default_priors(model_name, size)
    if len(priors.min_sizes) != len(target.feature_maps):
        raise ValueError(f"{value} has {len(priors.min_sizes)} levels but {model_name} has "
                         f"{len(target.feature_maps)}")
    scale = math.sqrt(math.prod(as_hw(size))) / math.sqrt(math.prod(as_hw(file_size)))  # side / side when square
    log(f"priors: {value} was fitted at {size_text(file_size)} px; box sizes scaled by {scale:g} for "
        f"{size_text(size)} px")
    return PriorConfig(feature_maps=target.feature_maps, steps=target.steps,
                       min_sizes=[s * scale for s in priors.min_sizes], max_sizes=[s * scale for s in priors.max_sizes],
                       aspect_ratios=priors.aspect_ratios, clip=priors.clip)
