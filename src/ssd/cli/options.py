"""Pieces of the ``ssd`` grammar shared by the subcommands: the parser class, option types, the options made
from a schema's fields (:mod:`ssd.schemas`, :class:`ssd.training.config.TrainConfig`), and the threshold options of
``ssd serve``, spelled as the schemas spell them."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path

from ssd.errors import UsageError
from ssd.names import closest_names
from ssd.settings import THRESHOLD_OPTIONS, Thresholds

EPILOG = "Labels: a dataset with K classes uses labels 0..K-1; the background class is added internally."


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--epoch` is a typo to point out, not a prefix to guess from
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse prints usage and exits; we raise to print one clear message
        raise UsageError(f"{self.prog}: {message}")


def suggest(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    valid = [s for s in parser._option_string_actions if s.startswith("--")]
    lines = []
    for token in unknown:
        if not token.startswith("-"):
            lines.append(f"unexpected argument {token!r}")
            continue
        name = token.split("=", 1)[0]
        close = closest_names(name, valid)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        lines.append(f"unknown option {name!r}{hint}")
    return "\n".join(lines) + f"\nsee `{parser.prog} --help` for every option"


def field_type(tp):
    """The scalar type argparse should convert to, and whether the field is a list."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return field_type(args[0]) if len(args) == 1 else (str, False)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return (args[0] if args else str), True
    if origin is typing.Literal:
        return type(typing.get_args(tp)[0]), False
    return (tp if tp in (int, float, str, bool, Path) else str), False


class _Numbers(argparse.Action):
    """A list of numbers given space- or comma-separated (``--batch-sizes 1 8`` or ``1,8``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [number for part in values for number in part])


def _numbers(scalar: type):
    def convert(text: str) -> list:
        try:
            return [scalar(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {scalar.__name__} values, space- or comma-separated such "
                                             f"as 1,8, got {text!r}") from None
    return convert


def add_config_options(parser, config_cls, names: typing.Iterable[str] | None = None) -> None:
    """An option for every field of the dataclass ``config_cls`` (only ``names`` when given; ``parser`` may be a
    group), spelled by :func:`ssd.schemas.option_flag`, with the field's help, default (never set here: a field not
    given keeps the dataclass's default), choices (a ``Literal`` or the field's ``choices``) and ``required`` when
    the field has no default. Booleans are ``--flag / --no-flag``; lists take one or more values."""
    from ssd.schemas import option_flag

    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        if names is not None and f.name not in names:
            continue
        scalar, is_list = field_type(hints[f.name])
        flag = option_flag(f)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        if default not in (None, "", ()) and not isinstance(default, bool):
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            help_text = f"{help_text} (default: {shown})".strip()
        kwargs = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs["required"] = True
        choices = f.metadata.get("choices") or (
            typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else None)
        if "metavar" in f.metadata:
            kwargs["metavar"] = f.metadata["metavar"]
        elif flag != "--" + f.name.replace("_", "-") and not choices:  # a renamed option: name its value after it
            kwargs["metavar"] = flag.lstrip("-").replace("-", "_").upper()
        if scalar is bool and not is_list:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif is_list and scalar in (int, float):
            parser.add_argument(flag, type=_numbers(scalar), nargs="+", action=_Numbers, **kwargs)
        elif is_list:
            parser.add_argument(flag, type=scalar, nargs="+", **kwargs)
        else:
            if "const" in f.metadata:  # the value may be left out: `--cache-images` alone is `--cache-images ram`
                kwargs.update(nargs="?", const=f.metadata["const"])
            parser.add_argument(flag, type=scalar, choices=choices, **kwargs)


def image_size_option(text: str) -> int | str:
    """``ssd check --image-size``: the rules of ``TrainConfig.image_size``, as an argparse error."""
    from ssd.errors import ConfigError
    from ssd.sizes import parse_image_size

    try:
        return parse_image_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def crop_scale_option(text: str):
    """``ssd check --crop-scale``: the rules of ``TrainConfig.crop_scale`` (a :class:`ssd.data.crops.CropScale`), as
    an argparse error."""
    from ssd.data.crops import parse_crop_scale
    from ssd.errors import ConfigError

    try:
        return parse_crop_scale(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_threshold_options(parser: argparse.ArgumentParser, defaults: Thresholds, use: str,
                          model_conf: bool = False) -> None:
    """``--conf``, ``--iou``, ``--max-det`` (:data:`ssd.settings.THRESHOLD_OPTIONS`) with ``defaults``; ``use``:
    what they are for, in the help. ``model_conf``: ``--conf`` defaults to ``None``, the model's stored best-F1
    confidence when it has one."""
    conf, iou, max_det = (THRESHOLD_OPTIONS[k] for k in ("score_threshold", "iou_threshold", "max_detections"))
    conf_default = f"the model's best-F1 confidence, else {defaults.score_threshold}" if model_conf else (
        defaults.score_threshold)
    parser.add_argument(conf, dest="score_threshold", type=float, metavar="CONF",
                        default=None if model_conf else defaults.score_threshold,
                        help=f"{use}score threshold in [0, 1] (default: {conf_default})")
    parser.add_argument(iou, dest="iou_threshold", type=float, metavar="IOU", default=defaults.iou_threshold,
                        help=f"{use}NMS IoU threshold in [0, 1] (default: {defaults.iou_threshold})")
    parser.add_argument(max_det, dest="max_detections", type=int, metavar="N", default=defaults.max_detections,
                        help=f"{use}detections kept per image (default: {defaults.max_detections})")


def thresholds(args: argparse.Namespace) -> dict[str, float | int]:
    """The threshold options of a command, checked (a command-line mistake when out of range, named by flag)."""
    from ssd.settings import check_thresholds

    options = {key: getattr(args, key) for key in THRESHOLD_OPTIONS}
    given = {**options, "score_threshold": 0.0} if options["score_threshold"] is None else options  # the model's
    try:
        check_thresholds(**given, batch_size=getattr(args, "batch_size", 1),
                         names={**THRESHOLD_OPTIONS, "batch_size": "--batch-size"})
    except ValueError as e:
        raise UsageError(f"ssd {args.command}: {e}") from None
    return options
