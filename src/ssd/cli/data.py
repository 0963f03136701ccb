"""``ssd data convert | split | merge | browse``: the parser of the command group and what each subcommand does
(its modules imported inside, so that ``ssd --help`` loads none of them)."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from ssd.cli.options import EPILOG, Parser, add_config_options
from ssd.data_schemas import POSITIONAL, DataBrowseConfig, DataConvertConfig, DataMergeConfig, DataSplitConfig
from ssd.errors import ConfigError, UsageError

__all__ = ["add_data_parser", "run_data"]

_SCHEMAS = {"convert": DataConvertConfig, "split": DataSplitConfig, "merge": DataMergeConfig,
            "browse": DataBrowseConfig}
_HELP = {"convert": "write a dataset in another format (voc, coco, yolo, labelstudio), every object kept",
         "split": "deal a dataset's images into train / val / test, stratified by class",
         "merge": "merge datasets into one, classes matched by name (--map old=new renames)",
         "browse": "one HTML page: thumbnails with boxes, class counts, box sizes; flagged images first"}


def add_data_parser(sub) -> None:
    p = sub.add_parser("data", help="convert, split, merge and browse datasets", epilog=EPILOG,
                       description="Datasets as they come: " + "; ".join(f"{k}: {v}" for k, v in _HELP.items()))
    commands = p.add_subparsers(dest="data_command", parser_class=Parser, metavar="{convert,split,merge,browse}")
    for name, schema in _SCHEMAS.items():
        q = commands.add_parser(name, help=_HELP[name], description=_HELP[name], epilog=EPILOG)
        fields = {f.name: f for f in dataclasses.fields(schema)}
        for positional in POSITIONAL[name]:
            many = typing.get_origin(typing.get_type_hints(schema)[positional]) is list
            q.add_argument(positional, nargs="+" if many else None, help=fields[positional].metadata["help"])
        add_config_options(q, schema, [f for f in fields if f not in POSITIONAL[name]])
        q.add_argument("--quiet", action="store_true", help="no progress bars")


def _config(args: argparse.Namespace):
    try:
        return _SCHEMAS[args.data_command].from_options(vars(args))
    except ConfigError as e:
        raise UsageError(f"ssd data {args.data_command}: {e}") from None


def _browse(config: DataBrowseConfig):
    from ssd.data.commands.browse import batch_thumbs, browse_dataset

    thumbs = []
    if config.augmented:  # the training layer builds the batches as a run does
        from ssd.training.config import TrainConfig
        from ssd.training.preview import training_batches

        try:
            train = TrainConfig.from_yaml(config.config) if config.config else TrainConfig()
        except ConfigError as e:
            raise UsageError(f"ssd data browse --config: {e}") from None
        batches, _, mean, std = training_batches(train, config.source, config.batches)
        thumbs = batch_thumbs(batches, mean, std)
    return browse_dataset(**config.values("augmented", "config", "batches"), batches=thumbs)


def run_data(args: argparse.Namespace) -> int:
    if not getattr(args, "data_command", None):
        raise UsageError("ssd data: name a command: convert, split, merge or browse (ssd data --help)")
    config = _config(args)
    if args.data_command == "convert":
        from ssd.data.commands.convert import convert_dataset

        print(convert_dataset(**config.values()))
    elif args.data_command == "split":
        from ssd.data.commands.split import split_dataset

        print(split_dataset(**config.values()))
    elif args.data_command == "merge":
        from ssd.data.commands.merge import merge_datasets

        *sources, out = config.sources
        print(merge_datasets(sources, out, **config.values("sources")))
    else:
        print(f"wrote {_browse(config)}")
    return 0
