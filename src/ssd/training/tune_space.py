"""The search space of ``ssd tune``: a YAML mapping of :class:`~ssd.training.config.TrainConfig` fields (the
``ssd train`` options, spelled as in ``config.yaml``) to what each may take::

    lr: {low: 0.0006, high: 0.015, log: true}   # a range: a number between low and high (log: on a log scale)
    close_mosaic: {low: 0, high: 3}            # whole numbers for a whole-number option (step: optional)
    augment: {choices: [ssd, light]}           # one of a list (YAML null: the option's default)

Only :data:`TUNABLE` fields may be searched; everything else comes from ``ssd tune``'s own options (and its
``--config``). :func:`read_space` refuses, before any trial runs, an unknown field or key (naming the closest
valid ones), a range whose ends are not numbers of the field's type or not in order, a log range that reaches 0,
and any choice or range end that ``ssd train`` itself would refuse (its own message, prefixed by the file and
key). :func:`default_space` is the space ``ssd tune`` searches without ``--space``, sized to the model: it is
written into the run directory as ``space.yaml``, a file to copy, edit and pass back with ``--space``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ssd.errors import ConfigError
from ssd.files import write_text
from ssd.limits import is_real, is_whole, value_text
from ssd.names import did_you_mean
from ssd.training.config import MAX_LR, TrainConfig
from ssd.yamlfile import safe_load

__all__ = ["TUNABLE", "Param", "default_space", "read_space", "space_to_yaml", "parse_space", "sample",
           "default_params"]

TUNABLE = ("lr", "weight_decay", "momentum", "warmup_epochs", "final_lr_ratio", "grad_clip", "batch_size",
           "optimizer", "scheduler", "augment", "image_size", "mosaic", "close_mosaic", "crop_scale", "ema",
           "ema_decay", "priors")
"""The ``TrainConfig`` fields a search space may name."""

SPEC_KEYS = ("low", "high", "log", "step", "choices")

_HINTS = typing.get_type_hints(TrainConfig)


def _kind(name: str) -> type | None:
    """``int`` or ``float`` for a field a range can search, else ``None`` (choices only)."""
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0] if len(args) == 1 and args[0] in (int, float) else None


@dataclass(frozen=True)
class Param:
    """One searched option: a range (``low``, ``high``, ``log``, ``step``) or ``choices``."""

    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    def suggest(self, trial) -> Any:
        """This option's value for an Optuna ``trial``."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if _kind(self.name) is int:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log, step=self.step)

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is one this option can take (a choice, or a number in the range on its step)."""
        if self.choices is not None:
            flag = isinstance(value, bool)  # True == 1 in Python, but a flag is not a number here
            return any(value == choice and flag == isinstance(choice, bool) for choice in self.choices)
        if not is_real(value) or isinstance(value, bool) or not self.low <= value <= self.high:
            return False
        return self.step is None or abs((value - self.low) / self.step - round((value - self.low) / self.step)) < 1e-9

    def to_dict(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        spec = {"low": self.low, "high": self.high}
        return {**spec, **({"log": True} if self.log else {}), **({"step": self.step} if self.step else {})}


def sample(space: list[Param], trial, base: TrainConfig) -> dict[str, Any]:
    """One trial's options: each of ``space`` suggested by the Optuna ``trial``, but for the options that would
    not act: mosaic (and its closing epochs) with native crops (``ssd train`` refuses the two together, and a
    trial's crops come first), and ``close_mosaic`` without mosaic. ``base``: the value of an option the space
    does not search."""
    params: dict[str, Any] = {}
    for param in sorted(space, key=lambda p: p.name != "crop_scale"):  # stable: the others in the space's order
        crops = params.get("crop_scale", base.crop_scale) is not None
        if (param.name in ("mosaic", "close_mosaic") and crops) or (
                param.name == "close_mosaic" and not params.get("mosaic", base.mosaic)):
            continue
        params[param.name] = param.suggest(trial)
    return params


def default_params(space: list[Param], base: TrainConfig) -> dict[str, Any]:
    """The options of ``space`` at the values ``ssd train`` would use (``base`` with the per-model defaults), for a
    first trial that measures the defaults: a tune then finds nothing worse than them at its trial length. An option
    whose default the space cannot take is left to the sampler."""
    resolved = base.resolved()
    return {p.name: getattr(resolved, p.name) for p in space if p.holds(getattr(resolved, p.name))}


def _round(value: float) -> float:
    return float(f"{value:.2g}")


def default_space(model: str) -> list[Param]:
    """The space searched without ``--space``, for ``model``: its learning rate and weight decay (the per-model
    defaults of :meth:`TrainConfig.resolved`) from a fifth to 5x and a tenth to 10x on log scales, its input size
    and 1.25x of it, augmentation ``ssd`` or ``light``, mosaic off or at 0.5 and its closing epochs (without
    crops: :func:`sample`), native crops or none, EMA or none, the default boxes of the model or fitted to the data
    (``priors: auto``)."""
    from ssd.models import MODEL_CONFIGS  # the architectures only when a tune is set up

    resolved = TrainConfig(model=model).resolved()
    size = MODEL_CONFIGS[model].image_size if model in MODEL_CONFIGS else 300
    return [
        Param("lr", _round(resolved.lr / 5), _round(min(MAX_LR, resolved.lr * 5)), log=True),
        Param("weight_decay", _round(resolved.weight_decay / 10), _round(resolved.weight_decay * 10), log=True),
        Param("augment", choices=("ssd", "light")),
        Param("image_size", choices=(size, round(size * 1.25 / 32) * 32)),
        Param("mosaic", choices=(0.0, 0.5)),
        Param("close_mosaic", 0, 3),
        Param("crop_scale", choices=(None, "native")),
        Param("ema", choices=(False, True)),
        Param("priors", choices=(None, "auto")),
    ]


def space_to_yaml(space: list[Param], path: str | Path | None = None) -> str:
    """The YAML text of a space (what :func:`read_space` reads), written to ``path`` when given."""
    text = ("# ssd tune search space: TrainConfig field -> {low, high[, log][, step]} or {choices: [...]}\n"
            + yaml.safe_dump({p.name: p.to_dict() for p in space}, sort_keys=False, default_flow_style=None))
    if path is not None:
        write_text(path, text)
    return text


def read_space(path: str | Path) -> list[Param]:
    """Read and check a search-space YAML file (rules: module docstring)."""
    path = Path(path)
    try:
        values = safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    return parse_space(values, str(path))


def parse_space(values: Any, source: str = "search space") -> list[Param]:
    """Check a search space given as a mapping (what :func:`read_space` reads from ``source``)."""
    if not isinstance(values, dict) or not values:
        raise ConfigError(f"{source}: expected a mapping of option: {{low, high}} or {{choices: [...]}}, got "
                          f"{value_text(values)}")
    return [_param(source, str(name), spec) for name, spec in values.items()]


def _param(source: str, name: str, spec: Any) -> Param:
    where = f"{source}: {name}"
    if name not in TUNABLE:
        hint = " (set it in --config: it is not searched)" if name in TrainConfig.field_names() else ""
        raise ConfigError(f"{where}: not an option ssd tune searches{hint}{did_you_mean(name, TUNABLE)}")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected {{low: A, high: B}} or {{choices: [...]}}, got {value_text(spec)}")
    for key in spec:
        if key not in SPEC_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), SPEC_KEYS)}")
    if "choices" in spec:
        return _choices(where, name, spec)
    return _range(where, name, spec)


def _check_value(where: str, name: str, value: Any) -> None:
    """``ssd train``'s own rules for ``name: value``."""
    try:
        TrainConfig(**{name: value})
    except ConfigError as e:
        raise ConfigError(f"{where}: {value_text(value)}: {e}") from None


def _choices(where: str, name: str, spec: dict) -> Param:
    extra = sorted(set(spec) - {"choices"})
    if extra:
        raise ConfigError(f"{where}: choices comes alone, without {', '.join(extra)}")
    choices = spec["choices"]
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices must be a non-empty list, got {value_text(choices)}")
    for choice in choices:
        if not (choice is None or isinstance(choice, (bool, int, float, str))):
            raise ConfigError(f"{where}: choice {value_text(choice)} is not a number, text, true/false or null")
        _check_value(where, name, choice)
    if len({repr(c) for c in choices}) != len(choices):
        raise ConfigError(f"{where}: choices {value_text(choices)} repeat a value")
    return Param(name, choices=tuple(choices))


def _range(where: str, name: str, spec: dict) -> Param:
    kind = _kind(name)
    if kind is None:
        raise ConfigError(f"{where}: takes choices only ({{choices: [...]}}), not a range")
    missing = [key for key in ("low", "high") if key not in spec]
    if missing:
        raise ConfigError(f"{where}: a range needs low and high (missing {', '.join(missing)}), or give choices")
    words = "whole numbers" if kind is int else "finite numbers"
    for key in ("low", "high", "step"):
        value = spec.get(key)
        if value is not None and not (is_whole(value) if kind is int else is_real(value, finite=True)):
            raise ConfigError(f"{where}: {key} must be one of {words}, got {value_text(value)}")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {value_text(log)}")
    if not low < high:
        raise ConfigError(f"{where}: low {low} must be below high {high}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range must start above 0, got low {low}")
    if step is not None and (step <= 0 or log):
        raise ConfigError(f"{where}: step must be above 0 and without log, got step {step}")
    for value in (low, high):
        _check_value(where, name, value)
    return Param(name, low, high, log, step)

