"""What each ``ssd`` subcommand does with its parsed arguments: each imports its modules inside its function, so
that ``ssd --help`` loads none of them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssd.cli.options import thresholds
from ssd.errors import UsageError


def _cmd_train(args: argparse.Namespace) -> int:
    from ssd.errors import ConfigError
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
                          workers=args.workers, device=args.device, **thresholds(args), save_json=args.save_json,
                          tile=args.tile, tile_overlap=_overlap(args), recheck=args.recheck, **saving)
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
    from ssd.inference.detector import load
    from ssd.inference.sources import predict_source

    options = thresholds(args)
    overlap = _overlap(args)
    detector = load(args.weights, device=args.device, half=args.half)
    options["score_threshold"], origin = detector.confidence(options["score_threshold"], "--conf")
    print(f"conf {options['score_threshold']:g} ({origin})")
    summary = predict_source(detector, args.source, args.save_dir, **options, batch_size=args.batch_size,
                             save_images=args.save_images,
                             fmt=args.fmt, exist_ok=args.exist_ok, tile=args.tile, tile_overlap=overlap,
                             save_txt=args.save_txt, save_conf=args.save_conf, save_crop=args.save_crop,
                             classes=args.classes, workers=args.workers, track=args.track, tracker=args.tracker,
                             show=args.show)
    print(summary)
    if summary.stopped == "Ctrl-C":
        print("stopped by Ctrl-C; the results so far are written", file=sys.stderr)
        return 130
    if summary.stopped is not None:
        print(f"error: {summary.stopped}", file=sys.stderr)
        return 1
    if summary.skipped and not (summary.images or summary.videos):
        print(f"error: none of the {len(summary.skipped)} inputs could be read", file=sys.stderr)
        return 1
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from ssd.serve.server import serve

    serve(args.weights, host=args.host, port=args.port, device=args.device, half=args.half, **thresholds(args),
          max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, samples=args.samples, threads=args.threads or None)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ssd.export import export

    out = export(args.weights, fmt=args.fmt, out_path=args.output, opset=args.opset, dynamic_batch=args.dynamic_batch,
                 nms=args.nms, check=args.check, int8=args.int8, data=args.data, calib_images=args.calib_images,
                 exist_ok=args.exist_ok, **thresholds(args))
    print(f"exported: {out}")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from ssd.export.benchmark import artifact_rows, below_floor, format_benchmark, parse_formats, run_benchmark
    from ssd.files import make_run_dir
    from ssd.weights.resolve import resolve_weights

    # these checks before the run directory is made; with --artifacts, only what is asked is exported
    formats = parse_formats("pytorch" if args.formats is None and args.artifacts else args.formats)
    artifact_rows(args.artifacts)
    if args.runs < 1:
        raise UsageError(f"ssd benchmark: --runs must be a positive integer, got {args.runs}")
    if args.calib_images is not None and args.calib_images < 1:
        raise UsageError(f"ssd benchmark: --calib-images must be a positive integer, got {args.calib_images}")
    weights = resolve_weights(args.weights)
    if not Path(args.data).exists():
        raise ValueError(f"dataset {args.data} does not exist (--data: a data.yaml, dataset folder or COCO JSON)")
    run_dir = make_run_dir(args.project, args.name)
    rows = run_benchmark(weights, args.data, run_dir, formats=formats, batch_sizes=args.batch_sizes,
                         device=args.device, calib_images=args.calib_images, runs=args.runs,
                         skip_invalid=args.skip_invalid, artifacts=args.artifacts)
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
    from ssd.errors import ConfigError
    from ssd.training.demo import run_demo

    options = {"epochs": args.epochs} if args.epochs is not None else {}  # --epochs 0 is refused, never ignored
    try:
        run_demo(project=args.project, device=args.device, quiet=args.quiet, **options)
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


COMMANDS = {"train": _cmd_train, "val": _cmd_val, "predict": _cmd_predict, "serve": _cmd_serve, "export": _cmd_export,
            "benchmark": _cmd_benchmark, "check": _cmd_check, "demo": _cmd_demo, "import": _cmd_import,
            "weights": _cmd_weights}
