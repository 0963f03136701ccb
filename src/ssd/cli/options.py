"""Pieces of the ``ssd`` grammar shared by the subcommands: the parser class, option types, and the options made
from a schema's fields (:mod:`ssd.schemas`, :class:`ssd.training.config.TrainConfig`)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path

from ssd.errors import UsageError
from ssd.names import closest_names

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
        if f.metadata.get("required") or (f.default is dataclasses.MISSING and
                                          f.default_factory is dataclasses.MISSING):
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
