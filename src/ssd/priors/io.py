"""The priors file that ``ssd check --fit-priors`` writes and ``ssd train --priors FILE`` reads.

The file::

    # comment lines: how it was made and the coverage it gives
    model: ssd300_vgg16
    image_size: 300          # or "384x288" (height x width) for a non-square input; [384, 288] is read too
    coverage: {boxes: 3324, before: 0.583, after: 0.721}
    priors: {feature_maps: [...], steps: [...], min_sizes: [...], max_sizes: [...], aspect_ratios: [...], clip: true}

``priors`` holds :class:`ssd.priors.PriorConfig`'s fields in pixels of ``image_size``; a file holding only those
fields (no ``priors`` key) is read too.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ssd.errors import MissingInputError, PriorConfigError
from ssd.files import write_text
from ssd.priors.config import PriorConfig
from ssd.priors.fit import FitResult
from ssd.sizes import compact_size, input_size, size_text
from ssd.yamlfile import safe_load

__all__ = ["load_priors", "save_priors", "train_command"]

_FILE_KEYS = ("model", "image_size", "coverage", "priors")


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
    the size is an int for a square input, else ``(height, width)`` (the file may hold ``"HxW"`` or ``[h, w]``).
    A file that is not one raises ``FileNotFoundError`` or :class:`ssd.errors.PriorConfigError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"priors file {path} does not exist (write one with `ssd check DATA --model NAME "
                                "--fit-priors`, or use --priors auto)")
    try:
        values = safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PriorConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(values, dict):
        raise PriorConfigError(f"{path}: expected a mapping with a 'priors' key, got {type(values).__name__}")
    if "priors" not in values:
        values = {"priors": values}
    unknown = sorted(set(values) - set(_FILE_KEYS))
    if unknown:
        raise PriorConfigError(f"{path}: unknown key(s) {unknown} (a priors file has {', '.join(_FILE_KEYS)})")
    try:
        priors = PriorConfig.from_dict(values["priors"])
    except PriorConfigError as exc:
        raise PriorConfigError(f"{path}: 'priors': {exc}") from None
    size = values.get("image_size")
    if size is not None:
        try:
            size = input_size(size)
        except ValueError as exc:  # PriorConfigError, or ConfigError from ssd.sizes.as_hw
            raise PriorConfigError(f"{path}: {exc}") from None
    return priors, values.get("model"), size
