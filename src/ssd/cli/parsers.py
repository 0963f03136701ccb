"""The ``ssd`` argument parser: one small builder per subcommand, and :func:`parse` (unknown options answered with
the closest valid ones)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ssd.cli.data import add_data_parser
from ssd.cli.options import (
    EPILOG,
    Parser,
    add_config_options,
    crop_scale_option,
    image_size_option,
    suggest,
)
from ssd.errors import UsageError
from ssd.schemas import BenchmarkConfig, ExportConfig, PredictConfig, ServeConfig, ValConfig
from ssd.tune_schema import TuneConfig


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ssd", description="SSD object detection that just works on your own data.", epilog=EPILOG)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=Parser,
                                metavar="{train,val,predict,serve,export,benchmark,check,demo,import,weights,runs,tune,data}")
    for add in (_add_train_parser, _add_val_parser, _add_predict_parser, _add_serve_parser, _add_export_parser,
                _add_benchmark_parser, _add_check_parser, _add_demo_parser, _add_import_parser, _add_weights_parser,
                _add_runs_parser, _add_tune_parser, add_data_parser):
        add(sub)
    for command in sub.choices.values():  # one spelling of "no progress bars" on every command
        if "--quiet" not in command._option_string_actions:
            command.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _add_train_parser(sub) -> None:
    from ssd.training.config import TrainConfig

    p = sub.add_parser("train", help="train a detector on a dataset", epilog=EPILOG,
                       description="Validate the data (the `ssd check` rules), then train. "
                                   "DATA is a data.yaml (YOLO), a dataset folder (VOC/YOLO, detected) or a COCO JSON.")
    p.add_argument("--config", dest="config_file", type=Path, help="YAML file of training options")
    add_config_options(p, TrainConfig)


def _add_val_parser(sub) -> None:
    p = sub.add_parser("val", help="evaluate a checkpoint or an exported model on a dataset split", epilog=EPILOG)
    source = ("weights", "detections")  # what is scored: one of them
    add_config_options(p.add_mutually_exclusive_group(required=True), ValConfig, source)
    add_config_options(p, ValConfig, [f.name for f in dataclasses.fields(ValConfig) if f.name not in source])


def _add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="detect objects in images, folders, globs or videos", epilog=EPILOG)
    add_config_options(p, PredictConfig)


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP: POST /predict, /model, /metrics and a page at /",
                       epilog=EPILOG)
    add_config_options(p, ServeConfig)


def _add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX (FP32/INT8), OpenVINO or torch.export",
                       epilog=EPILOG)
    add_config_options(p, ExportConfig)


def _add_benchmark_parser(sub) -> None:
    p = sub.add_parser("benchmark", help="export to every format, score each on the val split and time it",
                       description="Export WEIGHTS to each format into a new run directory, validate each on the "
                                   "dataset's val split and time it; print one table, also written as CSV and JSON.",
                       epilog=EPILOG)
    add_config_options(p, BenchmarkConfig)


def _add_check_parser(sub) -> None:
    p = sub.add_parser("check", help="report problems in a dataset before training", epilog=EPILOG)
    p.add_argument("data", help="data.yaml, dataset folder or COCO JSON")
    p.add_argument("--model", help="also report default-box coverage for this model (see `ssd train --help`)")
    p.add_argument("--image-size", type=image_size_option,
                   help="input size of --model: N (square) or HxW, height x width, e.g. 512x288 (default: the model's)")
    p.add_argument("--crop-scale", type=crop_scale_option,
                   help="coverage of the boxes as `ssd train --crop-scale` crops show them (native, MIN or MIN,MAX; "
                        "at the median crop scale)")
    p.add_argument("--fit-priors", nargs="?", const="keep", choices=["keep", "free"],
                   help="fit the default boxes of --model to the training split and write them to --priors-out "
                        "(for `ssd train --priors FILE`); --fit-priors=free may also change the number of aspect "
                        "ratios per level (new head shapes: pretrained heads no longer load)")
    p.add_argument("--priors-out", type=Path, default=Path("priors.yaml"),
                   help="where --fit-priors writes (default: priors.yaml)")
    p.add_argument("--json", dest="as_json", action="store_true", help="machine-readable output")
    p.add_argument("--recheck", action="store_true",
                   help="read and decode the whole dataset again instead of trusting its index (rebuilt)")


def _add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="generate a synthetic dataset, train, evaluate and draw predictions",
                       epilog="No download, no arguments needed; about 5 minutes on a 2-core CPU.")
    p.add_argument("--project", type=Path, help="where the demo writes: its dataset in PROJECT/data, its run in "
                                                "PROJECT/NAME (default: runs/demo)")
    p.add_argument("--name", help="run directory name; name2, name3, ... when taken (default: exp)")
    p.add_argument("--exist-ok", action="store_true", help="write into PROJECT/NAME when it exists")
    p.add_argument("--epochs", type=int, help="override the demo's number of epochs")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument("--quiet", action="store_true")


def _add_import_parser(sub) -> None:
    p = sub.add_parser("import", help="convert an ssd.pytorch, torchvision or lufficc/SSD detector to a checkpoint",
                       description="Recognise the file by its keys and shapes, convert it (input normalization and "
                                   "default boxes included) and write a checkpoint that every command reads. "
                                   "predict/val/export/train also take such files directly.", epilog=EPILOG)
    p.add_argument("source", type=Path, help="the weights file (.pth)")
    p.add_argument("--output", required=True, type=Path, help="the checkpoint to write (.pt)")
    p.add_argument("--format", dest="fmt", default="auto", choices=["auto", "ssd.pytorch", "torchvision", "lufficc"],
                   help="the file's format (default: auto, recognised by its keys)")
    p.add_argument("--classes", help="names of the file's classes: voc, coco or a text file with one name per line "
                                     "(default: VOC names for 21 outputs, COCO names for 81 and torchvision's 91)")


def _add_weights_parser(sub) -> None:
    p = sub.add_parser("weights", help="list the pretrained weights known by name, and download them",
                       description="Known names work wherever a weights file does: --weights NAME (detectors: train, "
                                   "predict, val, export, import) and --backbone-weights NAME (backbones; imagenet is "
                                   "the model's ImageNet one). Files are downloaded once into the torch hub cache, "
                                   "checksum verified.", epilog=EPILOG)
    p.add_argument("--download", nargs="+", default=[], metavar="NAME",
                   help="download these now (e.g. before going offline); already cached ones are kept")


def _add_runs_parser(sub) -> None:
    p = sub.add_parser("runs", help="compare training runs: one table and one figure of their metrics",
                       description="Read each run directory's results.csv and config.yaml; print a table (best and "
                                   "last mAP, epochs, minutes, the options that differ) and write it as runs.csv with "
                                   "a figure, runs.png (mAP by epoch and by minute, training loss).", epilog=EPILOG)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories of ssd train (or ssd tune)")
    p.add_argument("--output", type=Path, help="folder for runs.csv and runs.png (default: a new runs/compare/exp)")


def _add_tune_parser(sub) -> None:
    p = sub.add_parser("tune", help="search training options within a time budget (Optuna), then train the best",
                       description="Trials are ssd train runs of sampled options (TPE), pruned on their per-epoch "
                                   "validation mAP; the rest of --time trains the best configuration. The run "
                                   "directory holds best.pt, the winning config.yaml (ssd train --config), "
                                   "trials.csv and trials.png. Needs the tune extra (optuna).", epilog=EPILOG)
    add_config_options(p, TuneConfig)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparser = parser._subparsers._group_actions[0].choices.get(args.command, parser)
        raise UsageError(suggest(subparser, unknown))
    return args
