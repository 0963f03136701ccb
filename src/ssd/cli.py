"""The ``ssd`` command line: ``ssd train|val|predict|export|benchmark|check|demo|import``.

One grammar everywhere: ``--option value`` (``--epochs 50``), booleans as ``--amp`` / ``--no-amp``.
``ssd train`` takes every field of :class:`ssd.training.config.TrainConfig` as an option and ``--config FILE.yaml``
for a file of the same fields; options given on the command line win over the file.
An unknown option is answered with the closest valid ones. Errors about data, checkpoints or options are
printed as one readable message (exit code 1 for errors, 2 for command-line mistakes); set ``SSD_DEBUG=1``
for the full traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import types
import typing
import warnings
from pathlib import Path

from ssd._utils import MissingDependencyError, closest_names
from ssd.settings import EVALUATE, PREDICT, THRESHOLD_OPTIONS, Thresholds

EPILOG = "Labels: a dataset with K classes uses labels 0..K-1; the background class is added internally."


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--epoch` is a typo to point out, not a prefix to guess from
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse prints usage and exits; we raise to print one clear message
        raise UsageError(f"{self.prog}: {message}")


def _suggest(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
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


def _field_type(tp):
    """The scalar type argparse should convert to, and whether the field is a list."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _field_type(args[0]) if len(args) == 1 else (str, False)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return (args[0] if args else str), True
    if origin is typing.Literal:
        return type(typing.get_args(tp)[0]), False
    return (tp if tp in (int, float, str, bool) else str), False


def _add_config_options(parser: argparse.ArgumentParser, config_cls, flag_of) -> None:
    """An option ``flag_of(field name)`` for every field of the dataclass ``config_cls``."""
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        scalar, is_list = _field_type(hints[f.name])
        flag = flag_of(f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        if default not in (None, "", dataclasses.MISSING) and not isinstance(default, bool):
            help_text = f"{help_text} (default: {default})".strip()
        kwargs = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if flag != "--" + f.name.replace("_", "-"):  # a renamed option: name its value after the option
            kwargs["metavar"] = flag.lstrip("-").replace("-", "_").upper()
        if scalar is bool and not is_list:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif is_list:
            parser.add_argument(flag, type=scalar, nargs="+", **kwargs)
        else:
            choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else None
            parser.add_argument(flag, type=scalar, choices=choices, **kwargs)


def _image_size_option(text: str) -> int | str:
    """``ssd check --image-size``: the rules of ``TrainConfig.image_size``, as an argparse error."""
    from ssd.settings import ConfigError
    from ssd.training.config import parse_image_size

    try:
        return parse_image_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tile_option(text: str) -> str | tuple[int, int]:
    """``--tile``: ``auto``, ``N`` or ``HxW`` (the rules of :func:`ssd.inference.tiling.check_tile`), as an argparse
    error."""
    from ssd.inference.tiling import check_tile

    try:
        return check_tile(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_tile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tile", type=_tile_option,
                        help="also detect on overlapping tiles of N (or HxW) pixels of each image, or auto (images "
                             "more than twice the network input, tiles of the input size), and merge (default: off)")
    parser.add_argument("--tile-overlap", type=float, default=0.2,
                        help="share of a tile its neighbours also cover, in [0, 1) (default: 0.2)")


def _add_threshold_options(parser: argparse.ArgumentParser, defaults: Thresholds, use: str) -> None:
    """``--conf``, ``--iou``, ``--max-det`` (:data:`ssd.settings.THRESHOLD_OPTIONS`) with ``defaults``; ``use``:
    what they are for, in the help."""
    conf, iou, max_det = (THRESHOLD_OPTIONS[k] for k in ("score_threshold", "iou_threshold", "max_detections"))
    parser.add_argument(conf, dest="score_threshold", type=float, metavar="CONF", default=defaults.score_threshold,
                        help=f"{use}score threshold in [0, 1] (default: {defaults.score_threshold})")
    parser.add_argument(iou, dest="iou_threshold", type=float, metavar="IOU", default=defaults.iou_threshold,
                        help=f"{use}NMS IoU threshold in [0, 1] (default: {defaults.iou_threshold})")
    parser.add_argument(max_det, dest="max_detections", type=int, metavar="N", default=defaults.max_detections,
                        help=f"{use}detections kept per image (default: {defaults.max_detections})")


def _thresholds(args: argparse.Namespace) -> dict[str, float | int]:
    """The threshold options of a command, checked (a command-line mistake when out of range, named by flag)."""
    from ssd.settings import check_thresholds

    options = {key: getattr(args, key) for key in THRESHOLD_OPTIONS}
    try:
        check_thresholds(**options, batch_size=getattr(args, "batch_size", 1),
                         names={**THRESHOLD_OPTIONS, "batch_size": "--batch-size"})
    except ValueError as e:
        raise UsageError(f"ssd {args.command}: {e}") from None
    return options


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ssd", description="SSD object detection that just works on your own data.", epilog=EPILOG)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{train,val,predict,export,benchmark,check,demo,import}",
                                parser_class=_Parser)
    for add in (_add_train_parser, _add_val_parser, _add_predict_parser, _add_export_parser, _add_benchmark_parser,
                _add_check_parser, _add_demo_parser, _add_import_parser):
        add(sub)
    return parser


def _add_train_parser(sub) -> None:
    from ssd.training.config import TrainConfig, option_name

    p = sub.add_parser("train", help="train a detector on a dataset", epilog=EPILOG,
                       description="Validate the data (the `ssd check` rules), then train. "
                                   "DATA is a data.yaml (YOLO), a dataset folder (VOC/YOLO, detected) or a COCO JSON.")
    p.add_argument("--config", dest="config_file", type=Path, help="YAML file of training options")
    _add_config_options(p, TrainConfig, option_name)


def _add_val_parser(sub) -> None:
    p = sub.add_parser("val", help="evaluate a checkpoint or an exported model on a dataset split", epilog=EPILOG)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", type=Path,
                        help="what to evaluate: checkpoint (.pt), run directory, .onnx (FP32 or INT8), OpenVINO .xml "
                             "or its folder, .torchscript")
    source.add_argument("--detections", type=Path,
                        help="score this COCO results JSON (the dataset's image and category ids) instead of a model")
    p.add_argument("--data", required=True, help="data.yaml, dataset folder or COCO JSON")
    p.add_argument("--split", default="val", help="dataset split (default: val)")
    p.add_argument("--metric", default="voc07", choices=["voc07", "voc", "coco"],
                   help="voc07: VOC2007 11-point AP@0.5; voc: VOC2010+ area AP@0.5; coco: AP@[.5:.95] (default: voc07)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    _add_threshold_options(p, EVALUATE, "")
    p.add_argument("--save-json", type=Path, help="also write the detections as COCO-format JSON here")
    p.add_argument("--project", type=Path, default=Path("runs/val"),
                   help="where the report's run directory goes (default: runs/val)")
    p.add_argument("--name", default="exp", help="run directory name; exp2, exp3, ... when taken (default: exp)")
    p.add_argument("--no-save", dest="save", action="store_false",
                   help="print the report only (no run directory, no report.html)")
    _add_tile_options(p)


def _add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="detect objects in images, folders, globs or videos", epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path,
                   help="checkpoint (.pt), run directory, .onnx (FP32 or INT8), OpenVINO .xml or its folder, "
                        ".torchscript")
    p.add_argument("--source", required=True, help="image, folder, glob or video file")
    _add_threshold_options(p, PREDICT, "")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--half", action="store_true", help="half precision (CUDA only)")
    p.add_argument("--save-dir", type=Path, default=Path("runs/predict"), help="output folder (default: runs/predict)")
    p.add_argument("--exist-ok", action="store_true", help="write into --save-dir if it exists (else: predict2, ...)")
    p.add_argument("--format", dest="fmt", default="json", choices=["json", "coco"], help="detections file format")
    p.add_argument("--no-save-images", dest="save_images", action="store_false", help="only write the JSON")
    _add_tile_options(p)


def _add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX (FP32/INT8), OpenVINO or TorchScript",
                       epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) or run directory (its best.pt)")
    p.add_argument("--format", dest="fmt", default="onnx", choices=["onnx", "openvino", "torchscript"])
    p.add_argument("--output", type=Path, help="output file (OpenVINO: folder), not the weights file "
                                               "(default: next to the weights)")
    p.add_argument("--opset", type=int, default=18,
                   help="ONNX opset (default: 18; lower ones are down-converted when possible)")
    p.add_argument("--dynamic-batch", action="store_true", help="allow any batch size")
    p.add_argument("--nms", action="store_true", help="put score filtering and NMS inside the graph")
    _add_threshold_options(p, PREDICT, "with --nms: ")
    p.add_argument("--int8", action="store_true", help="quantize to INT8, calibrated on --data's training images")
    p.add_argument("--data", help="dataset whose training images calibrate --int8 (data.yaml, folder or COCO JSON)")
    p.add_argument("--calib-images", type=int, help="calibration images for --int8 (default: 300)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the ONNX Runtime parity check")


def _add_benchmark_parser(sub) -> None:
    p = sub.add_parser("benchmark", help="export to every format, score each on the val split and time it",
                       description="Export WEIGHTS to each format into a new run directory, validate each on the "
                                   "dataset's val split and time it; print one table, also written as CSV and JSON.",
                       epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) or run directory (its best.pt)")
    p.add_argument("--data", required=True, help="data.yaml, dataset folder or COCO JSON (val split scored, train "
                                                 "split calibrates INT8)")
    p.add_argument("--formats", help="comma-separated: pytorch, torchscript, onnx, onnx-int8, openvino, openvino-bf16, "
                                     "openvino-int8, opencv (default: all)")
    p.add_argument("--batch-sizes", type=_int_list, default=[1, 8],
                   help="latency at batch 1, images/s at the largest (default: 1,8)")
    p.add_argument("--floor", type=float, help="exit 1 when a format scores mAP50 (points) below this, or fails")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--calib-images", type=int, help="calibration images of the INT8 rows (default: 300 or all)")
    p.add_argument("--runs", type=int, default=30, help="timed images at batch 1 (default: 30)")
    p.add_argument("--skip-invalid", action="store_true", help="score the val split without its invalid objects")
    p.add_argument("--project", type=Path, default=Path("runs/benchmark"), help="default: runs/benchmark")
    p.add_argument("--name", default="exp", help="run directory name (exp, exp2, ... never overwritten)")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    return values


def _add_check_parser(sub) -> None:
    p = sub.add_parser("check", help="report problems in a dataset before training", epilog=EPILOG)
    p.add_argument("data", help="data.yaml, dataset folder or COCO JSON")
    p.add_argument("--model", help="also report default-box coverage for this model (see `ssd train --help`)")
    p.add_argument("--image-size", type=_image_size_option,
                   help="input size of --model: N (square) or HxW, height x width, e.g. 512x288 (default: the model's)")
    p.add_argument("--fit-priors", nargs="?", const="keep", choices=["keep", "free"],
                   help="fit the default boxes of --model to the training split and write them to --priors-out "
                        "(for `ssd train --priors FILE`); --fit-priors=free may also change the number of aspect "
                        "ratios per level (new head shapes: pretrained heads no longer load)")
    p.add_argument("--priors-out", type=Path, default=Path("priors.yaml"),
                   help="where --fit-priors writes (default: priors.yaml)")
    p.add_argument("--json", dest="as_json", action="store_true", help="machine-readable output")


def _add_demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="generate a synthetic dataset, train, evaluate and draw predictions",
                       epilog="No download, no arguments needed; about 5 minutes on a 2-core CPU.")
    p.add_argument("--project", type=Path, default=Path("runs"), help="where the demo writes (default: runs)")
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


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparser = parser._subparsers._group_actions[0].choices.get(args.command, parser)
        raise UsageError(_suggest(subparser, unknown))
    return args


def _cmd_train(args: argparse.Namespace) -> int:
    from ssd.settings import ConfigError
    from ssd.training.config import TrainConfig
    from ssd.training.trainer import train

    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "version", "config_file")}
    try:  # every option and --config key checked by type and range before a run directory exists
        config = TrainConfig.from_yaml(args.config_file) if args.config_file else TrainConfig()
        config.update(**overrides)
    except ConfigError as e:
        raise UsageError(f"ssd train: {e}") from None
    result = train(config, **overrides)  # separately: on --resume / --weights, options given explicitly are checked
    print(f"run directory: {result.run_dir}")
    return 0


def _cmd_val(args: argparse.Namespace) -> int:
    from ssd.evaluation.evaluator import evaluate, format_table
    from ssd.evaluation.report import format_report
    from ssd.evaluation.results import evaluate_detections

    saving = dict(report=True, project=args.project if args.save else None, name=args.name)
    if args.detections is not None:
        result = evaluate_detections(args.detections, args.data, metric=args.metric, split=args.split, **saving)
    else:
        result = evaluate(args.weights, args.data, metric=args.metric, split=args.split, batch_size=args.batch_size,
                          workers=args.workers, device=args.device, **_thresholds(args), save_json=args.save_json,
                          tile=args.tile, tile_overlap=_overlap(args), **saving)
    print(format_table(result, result["class_names"]))
    print(format_report(result["report"]))
    if args.save:
        print(f"report: {result['run_dir'] / 'report.html'}")
    return 0


def _overlap(args: argparse.Namespace) -> float:
    """``--tile-overlap``, checked (a command-line mistake when out of range)."""
    from ssd.inference.tiling import check_tile

    try:
        check_tile(None, args.tile_overlap)
    except ValueError as e:
        raise UsageError(f"ssd {args.command}: {str(e).replace('tile_overlap', '--tile-overlap', 1)}") from None
    return args.tile_overlap


def _cmd_predict(args: argparse.Namespace) -> int:
    from ssd.inference.pipeline import load
    from ssd.inference.sources import predict_source

    options = _thresholds(args)
    overlap = _overlap(args)
    detector = load(args.weights, device=args.device, half=args.half)
    summary = predict_source(detector, args.source, args.save_dir, **options, batch_size=args.batch_size,
                             save_images=args.save_images,
                             fmt=args.fmt, exist_ok=args.exist_ok, tile=args.tile, tile_overlap=overlap)
    print(summary)
    if summary.skipped and not (summary.images or summary.videos):
        print(f"error: none of the {len(summary.skipped)} inputs could be read", file=sys.stderr)
        return 1
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ssd.export.formats import export

    out = export(args.weights, fmt=args.fmt, out_path=args.output, opset=args.opset, dynamic_batch=args.dynamic_batch,
                 nms=args.nms, check=args.check, int8=args.int8, data=args.data, calib_images=args.calib_images,
                 **_thresholds(args))
    print(f"exported: {out}")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from ssd.export.benchmark import below_floor, format_benchmark, parse_formats, run_benchmark
    from ssd.files import make_run_dir
    from ssd.weights.resolve import resolve_weights

    formats = parse_formats(args.formats)  # these checks before the run directory is made
    if args.runs < 1:
        raise UsageError(f"ssd benchmark: --runs must be a positive integer, got {args.runs}")
    weights = resolve_weights(args.weights)
    if not Path(args.data).exists():
        raise ValueError(f"dataset {args.data} does not exist (--data: a data.yaml, dataset folder or COCO JSON)")
    run_dir = make_run_dir(args.project, args.name)
    rows = run_benchmark(weights, args.data, run_dir, formats=formats, batch_sizes=args.batch_sizes,
                         device=args.device, calib_images=args.calib_images, runs=args.runs,
                         skip_invalid=args.skip_invalid)
    print(format_benchmark(rows))
    print(f"written: {run_dir}/benchmark.csv, benchmark.json")
    if args.floor is not None:
        low = below_floor(rows, args.floor)
        if low:
            print(f"error: below the mAP50 floor of {args.floor}: {', '.join(low)}", file=sys.stderr)
            return 1
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from ssd.data.check import check_dataset
    from ssd.data.load import load_dataset

    data = args.data
    if args.fit_priors and not args.model:
        raise UsageError("ssd check: --fit-priors needs --model NAME (the model whose default boxes to fit)")
    if args.fit_priors:
        from ssd.files import check_output

        data = load_dataset(args.data)  # once, for the check and the fit
        check_output(args.priors_out, inputs=[args.data, *data.input_files()], what="--priors-out")
    report = check_dataset(data, model=args.model, image_size=args.image_size)
    output = report.to_dict() if args.as_json else report.format_table()
    if args.fit_priors:
        from ssd.data.priors import fit_for_model
        from ssd.priors.io import save_priors, train_command

        fit = fit_for_model(data, args.model, args.image_size, free=args.fit_priors == "free")
        path = save_priors(args.priors_out, fit, args.model, source=args.data)
        if args.as_json:
            output["prior_fit"] = {**fit.to_dict(), "file": str(path)}
        else:
            output += f"\n\n{fit.format_table()}\nwritten: {path} ({train_command(args.model, fit.image_size, path)})"
    print(json.dumps(output, indent=2) if args.as_json else output)
    return 0 if report.ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from ssd.settings import ConfigError
    from ssd.training.demo import run_demo

    options = {"epochs": args.epochs} if args.epochs is not None else {}  # --epochs 0 is refused, never ignored
    try:
        run_demo(project=args.project, device=args.device, quiet=args.quiet, **options)
    except ConfigError as e:
        raise UsageError(f"ssd demo: {e}") from None
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from ssd.files import check_output
    from ssd.weights.checkpoint import save_checkpoint
    from ssd.weights.importers import import_model

    check_output(args.output, inputs=[args.source, args.classes], what="--output")
    model = import_model(args.source, format=args.fmt, class_names=args.classes)
    out = save_checkpoint(args.output, model)
    print(f"wrote {out} ({model.config.name}, {model.num_classes} classes); predict with: "
          f"ssd predict --weights {out} --source IMAGES")
    return 0


def _with_library_messages(command, args: argparse.Namespace) -> int:
    """Run ``command`` with what the library reports on the ``ssd`` logger (the format of imported weights, the
    classes carried over when fine-tuning, ...) shown on stderr: part of the command's output; the library's own
    warnings (``ssd.data.images.ImageWarning``, ...) as one ``warning: ...`` line each, once."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("ssd")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if not category.__module__.startswith("ssd."):
            return default_show(message, category, filename, lineno, file, line)
        if str(message) not in shown:
            shown.add(str(message))
            print(f"warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        default_show, warnings.showwarning = warnings.showwarning, show
        try:
            return command(args)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)


COMMANDS = {"train": _cmd_train, "val": _cmd_val, "predict": _cmd_predict, "export": _cmd_export,
            "benchmark": _cmd_benchmark, "check": _cmd_check, "demo": _cmd_demo, "import": _cmd_import}


def _one_line(error: Exception) -> str:
    """The message of a library error, or ``strerror: path`` for an OSError raised on a user's path."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        target = f" -> {error.filename2}" if error.filename2 is not None else ""
        return f"{error.strerror}: {error.filename}{target}"
    return str(error)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = os.environ.get("SSD_DEBUG") == "1"
    try:
        parser = _build_parser()
        args = _parse(parser, argv)
        if args.version:
            from ssd._version import __version__

            print(__version__)
            return 0
        if not args.command:
            parser.print_help()
            return 2
        code = _with_library_messages(COMMANDS[args.command], args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
        return code
    except BrokenPipeError:  # `ssd check D | head -3`: the reader has what it wanted; exit quietly as POSIX tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141
    except UsageError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, FileExistsError,  # the user's paths
            IsADirectoryError, MissingDependencyError) as e:
        if debug:
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
