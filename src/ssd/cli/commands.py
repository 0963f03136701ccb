"""What each ``ssd`` subcommand does with its parsed arguments: each imports its modules inside its function, so
that ``ssd --help`` loads none of them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssd.cli.data import run_data
from ssd.errors import ConfigError, MissingInputError, UsageError
from ssd.schemas import BenchmarkConfig, ExportConfig, PredictConfig, ServeConfig, ValConfig


def _cmd_train(args: argparse.Namespace) -> int:
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


def _config(schema, args: argparse.Namespace):
    """The command's schema (:mod:`ssd.schemas`) of the options given; a bad value is a command-line mistake."""
    try:
        return schema.from_options(vars(args))
    except ConfigError as e:
        raise UsageError(f"ssd {args.command}: {e}") from None


def _cmd_val(args: argparse.Namespace) -> int:
    from ssd.distributed import DistInfo
    from ssd.evaluation.evaluator import evaluate, format_table
    from ssd.evaluation.report import format_report
    from ssd.evaluation.results import evaluate_detections

    config = _config(ValConfig, args)
    if config.track:
        from ssd.evaluation.tracking import format_tracking, validate_tracking

        figures, saved = validate_tracking(config)
        print(format_tracking(figures))
        if saved is not None:
            print(f"figures: {saved}")
        return 0
    saving = dict(report=True, project=config.project if config.save else None, name=config.name,
                  exist_ok=config.exist_ok)
    if config.detections is not None:
        if not DistInfo.from_env().is_main:  # a file of detections is scored once, by rank 0 under torchrun
            return 0
        result = evaluate_detections(config.detections, config.data, metric=config.metric, split=config.split,
                                     **saving)
    else:
        result = evaluate(**config.values("detections", "save", "track", "tracker", *saving), **saving)
    if "report" not in result:  # a rank other than 0 under torchrun: rank 0 reports the whole split
        return 0
    print(format_table(result, result["class_names"]))
    print(format_report(result["report"]))
    if config.save:
        print(f"report: {result['run_dir'] / 'report.html'}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from ssd.distributed import DistInfo, rank_device
    from ssd.inference.detector import load
    from ssd.inference.signals import Terminated, sigterm_as_ctrl_c
    from ssd.inference.sources import predict_source

    config = _config(PredictConfig, args)
    info = DistInfo.from_env()
    if config.track:  # a bad or huge settings file is refused before the model loads
        from ssd.inference.tracking import tracker_settings

        tracker_settings(config.tracker)
    detector = load(config.weights, device=rank_device(config.device, info), half=config.half)
    conf, origin = detector.confidence(config.score_threshold, "--conf")
    if info.is_main:  # under torchrun, rank 0 speaks for the run
        print(f"conf {conf:g} ({origin})")
    try:
        with sigterm_as_ctrl_c():  # docker stop, systemctl stop, kill: the outputs completed as on Ctrl-C
            summary = predict_source(config, detector)
    except Terminated:  # a run of files: stopped where it was, its results written
        print("stopped by SIGTERM; the results so far are written", file=sys.stderr)
        return 143
    if not summary.main:  # a rank other than 0 under torchrun: rank 0 reports the whole run
        return 0
    print(summary)
    if summary.stopped in ("Ctrl-C", "SIGTERM"):
        print(f"stopped by {summary.stopped}; the results so far are written", file=sys.stderr)
        return 130 if summary.stopped == "Ctrl-C" else 143
    if summary.stopped is not None:
        print(f"error: {summary.stopped}", file=sys.stderr)
        return 1
    if summary.skipped and not (summary.images or summary.videos):
        print(f"error: none of the {len(summary.skipped)} inputs could be read", file=sys.stderr)
        return 1
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from ssd.serve.server import serve

    serve(_config(ServeConfig, args))  # every option checked (exit 2) before the model is opened
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ssd.export import run_export

    out = run_export(_config(ExportConfig, args))
    print(f"exported: {out}")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from ssd.export.benchmark import artifact_rows, below_floor, format_benchmark, parse_formats, run_benchmark
    from ssd.files import make_run_dir
    from ssd.weights.resolve import resolve_weights

    config = _config(BenchmarkConfig, args)
    # these checks before the run directory is made; with --artifacts, only what is asked is exported
    formats = parse_formats("pytorch" if config.formats is None and config.artifacts else config.formats)
    artifact_rows(config.artifacts)
    weights = resolve_weights(config.weights)
    if not Path(config.data).exists():
        raise MissingInputError(f"dataset {config.data} does not exist (--data: a data.yaml, dataset folder or "
                                "COCO JSON)")
    run_dir = make_run_dir(config.project, config.name, config.exist_ok)
    rows = run_benchmark(weights, config.data, run_dir, formats=formats,
                         **config.values("weights", "data", "formats", "floor", "project", "name"))
    print(format_benchmark(rows))
    print(f"written: {run_dir}/benchmark.csv, benchmark.json")
    if config.floor is not None:
        low = below_floor(rows, config.floor)
        if low:
            print(f"error: below the mAP50 floor of {config.floor}: {', '.join(low)}", file=sys.stderr)
            return 1
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from ssd.data.check import check_dataset
    from ssd.data.index import index_dataset
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    data = args.data
    if args.fit_priors and not args.model:
        raise UsageError("ssd check: --fit-priors needs --model NAME (the model whose default boxes to fit)")
    if args.crop_scale and not args.model:
        raise UsageError("ssd check: --crop-scale needs --model NAME (coverage is of its default boxes)")
    try:  # read and decoded through the dataset index: once, then only the files that changed
        indexed = index_dataset(args.data, splits=None, recheck=args.recheck)
        data = indexed.spec
    except DataError:
        indexed = None  # check_dataset reports why the dataset cannot be read
    if args.fit_priors:
        from ssd.files import check_output

        data = data if indexed else load_dataset(args.data)  # once, for the check and the fit
        check_output(args.priors_out, inputs=[args.data, *data.input_files()], what="--priors-out")
    report = check_dataset(data, model=args.model, image_size=args.image_size, crop_scale=args.crop_scale,
                           issues=indexed.issues if indexed else None)
    output = report.to_dict() if args.as_json else report.format_table()
    if args.fit_priors:
        from ssd.data.coverage import fit_for_model
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
    from ssd.training.demo import run_demo

    given = {k: getattr(args, k) for k in ("project", "name", "epochs") if getattr(args, k) is not None}
    try:  # run_demo's defaults for the options not given; --epochs 0 is refused, never ignored
        run_demo(device=args.device, quiet=args.quiet, exist_ok=args.exist_ok, **given)
    except ConfigError as e:
        raise UsageError(f"ssd demo: {e}") from None
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from ssd.files import check_output
    from ssd.models.importers import import_model
    from ssd.weights.checkpoint import save_checkpoint

    check_output(args.output, inputs=[args.source, args.classes], what="--output")
    model = import_model(args.source, format=args.fmt, class_names=args.classes)
    out = save_checkpoint(args.output, model)
    print(f"wrote {out} ({model.config.name}, {model.num_classes} classes); predict with: "
          f"ssd predict --weights {out} --source IMAGES")
    return 0


def _cmd_weights(args: argparse.Namespace) -> int:
    from ssd.names import did_you_mean
    from ssd.weights.hub import catalog, fetch, format_catalog

    known = catalog()
    for name in args.download:  # every name checked before the first download
        if name not in known:
            raise UsageError(f"ssd weights --download {name}: not a known name{did_you_mean(name, known)}")
    for name in args.download:
        print(f"{name}: {fetch(known[name])}")
    print(format_catalog())
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from ssd.files import make_run_dir
    from ssd.training.runs import read_run, write_comparison

    runs = [read_run(run) for run in args.runs]  # every run read before an output folder is made
    output = args.output if args.output is not None else make_run_dir("runs/compare", "exp")
    table, csv_path, png_path = write_comparison(runs, output)
    print(table)
    print(f"written: {csv_path}, {png_path}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from ssd.training.tune import tune
    from ssd.tune_schema import TuneConfig

    result = tune(_config(TuneConfig, args))
    states = ", ".join(f"{count} {state.lower()}" for state, count in sorted(result.states.items()))
    print(f"trials: {states}; best trial mAP {result.best_map:.4f} with {result.best_params}")
    print(f"final training: mAP {result.final.best_map:.4f}; {result.minutes:.1f} minutes in all")
    print(f"run directory: {result.run_dir} (weights/best.pt, config.yaml, trials.csv, trials.png)")
    return 0


COMMANDS = {"train": _cmd_train, "val": _cmd_val, "predict": _cmd_predict, "serve": _cmd_serve, "export": _cmd_export,
            "benchmark": _cmd_benchmark, "check": _cmd_check, "demo": _cmd_demo, "import": _cmd_import,
            "weights": _cmd_weights, "runs": _cmd_runs, "tune": _cmd_tune, "data": run_data}
