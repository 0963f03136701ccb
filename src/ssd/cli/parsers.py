"""The ``ssd`` argument parser: one small builder per subcommand, and :func:`parse` (unknown options answered with
the closest valid ones)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ssd.artifacts import BENCHMARK_ROWS, EXPORT_FORMATS
from ssd.cli.options import (
    EPILOG,
    Parser,
    add_config_options,
    add_threshold_options,
    add_tile_options,
    crop_scale_option,
    image_size_option,
    int_list,
    points_option,
    suggest,
    workers_option,
)
from ssd.errors import UsageError
from ssd.settings import EVALUATE, PREDICT


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ssd", description="SSD object detection that just works on your own data.", epilog=EPILOG)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=Parser,
                                metavar="{train,val,predict,serve,export,benchmark,check,demo,import,weights}")
    for add in (_add_train_parser, _add_val_parser, _add_predict_parser, _add_serve_parser, _add_export_parser,
                _add_benchmark_parser, _add_check_parser, _add_demo_parser, _add_import_parser, _add_weights_parser):
        add(sub)
    for command in sub.choices.values():  # one spelling of "no progress bars" on every command
        if "--quiet" not in command._option_string_actions:
            command.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _add_train_parser(sub) -> None:
    from ssd.training.config import TrainConfig, option_name

    p = sub.add_parser("train", help="train a detector on a dataset", epilog=EPILOG,
                       description="Validate the data (the `ssd check` rules), then train. "
                                   "DATA is a data.yaml (YOLO), a dataset folder (VOC/YOLO, detected) or a COCO JSON.")
    p.add_argument("--config", dest="config_file", type=Path, help="YAML file of training options")
    add_config_options(p, TrainConfig, option_name)


def _add_val_parser(sub) -> None:
    p = sub.add_parser("val", help="evaluate a checkpoint or an exported model on a dataset split", epilog=EPILOG)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", type=Path,
                        help="what to evaluate: checkpoint (.pt), run directory, .onnx (FP32 or INT8), OpenVINO .xml "
                             "or its folder, .pt2 (torch.export)")
    source.add_argument("--detections", type=Path,
                        help="score this COCO results JSON (the dataset's image and category ids) instead of a model")
    p.add_argument("--data", required=True, help="data.yaml, dataset folder or COCO JSON")
    p.add_argument("--split", default="val", help="dataset split (default: val)")
    p.add_argument("--metric", default="voc07", choices=["voc07", "voc", "coco"],
                   help="voc07: VOC2007 11-point AP@0.5; voc: VOC2010+ area AP@0.5; coco: AP@[.5:.95] (default: voc07)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=workers_option, default=0)
    p.add_argument("--recheck", action="store_true",
                   help="read and decode the whole dataset again instead of trusting its index (rebuilt)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    add_threshold_options(p, EVALUATE, "")
    p.add_argument("--save-json", type=Path, help="also write the detections as COCO-format JSON here")
    p.add_argument("--project", type=Path, default=Path("runs/val"),
                   help="where the report's run directory goes (default: runs/val)")
    p.add_argument("--name", default="exp", help="run directory name; exp2, exp3, ... when taken (default: exp)")
    p.add_argument("--no-save", dest="save", action="store_false",
                   help="print the report only (no run directory, no report.html)")
    add_tile_options(p)


def _add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="detect objects in images, folders, globs or videos", epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path,
                   help="checkpoint (.pt), run directory, .onnx (FP32 or INT8), OpenVINO .xml or its folder, "
                        ".pt2")
    p.add_argument("--source", required=True,
                   help="image, folder (subfolders included), glob, video file, camera index (0), rtsp:// or "
                        "http(s):// stream, or a .streams file (one camera or URL a line)")
    add_threshold_options(p, PREDICT, "", model_conf=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--half", action="store_true", help="half precision (CUDA only)")
    p.add_argument("--save-dir", type=Path, default=Path("runs/predict"), help="output folder (default: runs/predict)")
    p.add_argument("--exist-ok", action="store_true", help="write into --save-dir if it exists (else: predict2, ...)")
    p.add_argument("--format", dest="fmt", default="json", choices=["json", "coco", "csv", "labelstudio"],
                   help="detections file assembled at the end from predictions.jsonl (written as results come)")
    p.add_argument("--no-save-images", dest="save_images", action="store_false", help="only write the JSON")
    p.add_argument("--save-txt", action="store_true",
                   help="YOLO labels per image in SAVE_DIR/yolo, with data.yaml: a dataset ssd train reads")
    p.add_argument("--save-conf", action="store_true", help="add each detection's confidence to --save-txt labels")
    p.add_argument("--save-crop", action="store_true", help="one image per detection in SAVE_DIR/crops/CLASS")
    p.add_argument("--classes", nargs="+", metavar="CLASS", help="keep only these classes (names or labels 0..K-1)")
    p.add_argument("--workers", type=workers_option, default=2,
                   help="threads decoding images ahead (0: in the main thread)")
    p.add_argument("--track", action="store_true",
                   help="track objects across video and stream frames (ByteTrack): ids in every output and drawn "
                        "with a trail; a folder of images is tracked as one sequence in name order")
    p.add_argument("--tracker", type=Path, metavar="YAML",
                   help="ByteTrack settings for --track (keys: see ssd.inference.tracking)")
    p.add_argument("--show", action="store_true", help="show the drawn frames in a window (needs a display)")
    add_tile_options(p)


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP: POST /predict, /model, /metrics and a page at /",
                       epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path, help="anything ssd predict takes")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--half", action="store_true", help="half precision (CUDA only)")
    add_threshold_options(p, PREDICT, "requests' default ", model_conf=True)
    p.add_argument("--max-batch", type=int, default=8,
                   help="most concurrent requests run as one batch (default: 8; 1: no batching)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long the first request of a batch waits for others, in ms (default: 5)")
    p.add_argument("--samples", type=Path, help="folder of example images the page at / offers")
    p.add_argument("--threads", type=int, default=1,
                   help="PyTorch threads of the server: pre-/post-processing, a .pt network (default: 1; 0: one per "
                        "core)")


def _add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX (FP32/INT8), OpenVINO or torch.export",
                       epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) or run directory (its best.pt)")
    p.add_argument("--format", dest="fmt", default="onnx", choices=EXPORT_FORMATS,
                   help="onnx (ONNX Runtime, OpenCV DNN), openvino or pt2 (torch.export, TorchScript's successor)")
    p.add_argument("--output", type=Path, help="output file (OpenVINO: folder), not the weights file "
                                               "(default: next to the weights)")
    p.add_argument("--opset", type=int, default=18,
                   help="ONNX opset (default: 18; lower ones are down-converted when possible)")
    p.add_argument("--dynamic-batch", action="store_true", help="allow any batch size")
    p.add_argument("--nms", action="store_true", help="put score filtering and NMS inside the graph")
    add_threshold_options(p, PREDICT, "with --nms: ")
    p.add_argument("--int8", action="store_true", help="quantize to INT8, calibrated on --data's training images")
    p.add_argument("--data", help="dataset whose training images calibrate --int8 (data.yaml, folder or COCO JSON)")
    p.add_argument("--calib-images", type=int,
                   help="calibration images for --int8 (default: 300, or every training image when fewer)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the ONNX Runtime parity check")
    p.add_argument("--exist-ok", action="store_true",
                   help="replace an OpenVINO export of ssd in an existing --output folder (other folders are refused)")


def _add_benchmark_parser(sub) -> None:
    p = sub.add_parser("benchmark", help="export to every format, score each on the val split and time it",
                       description="Export WEIGHTS to each format into a new run directory, validate each on the "
                                   "dataset's val split and time it; print one table, also written as CSV and JSON.",
                       epilog=EPILOG)
    p.add_argument("--weights", required=True, type=Path, help="checkpoint (.pt) or run directory (its best.pt)")
    p.add_argument("--data", required=True, help="data.yaml, dataset folder or COCO JSON (val split scored, train "
                                                 "split calibrates INT8)")
    p.add_argument("--formats", help=f"comma-separated: {', '.join(BENCHMARK_ROWS)} (default: all; with --artifacts: "
                                     "pytorch)")
    p.add_argument("--artifacts", nargs="+", type=Path, default=[], metavar="PATH",
                   help="also benchmark these exported models as they are (.onnx, OpenVINO .xml or folder, "
                        ".pt2): a row each, named kind:file")
    p.add_argument("--batch-sizes", type=int_list, default=[1, 8],
                   help="latency at batch 1, images/s at the largest (default: 1,8)")
    p.add_argument("--floor", type=points_option,
                   help="exit 1 when a format scores mAP50 (points) below this, or fails")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--calib-images", type=int, help="calibration images of the INT8 rows (default: 300 or all)")
    p.add_argument("--runs", type=int, default=30, help="timed images at batch 1 (default: 30)")
    p.add_argument("--skip-invalid", action="store_true", help="score the val split without its invalid objects")
    p.add_argument("--project", type=Path, default=Path("runs/benchmark"), help="default: runs/benchmark")
    p.add_argument("--name", default="exp", help="run directory name (exp, exp2, ... never overwritten)")



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


def _add_weights_parser(sub) -> None:
    p = sub.add_parser("weights", help="list the pretrained weights known by name, and download them",
                       description="Known names work wherever a weights file does: --weights NAME (detectors: train, "
                                   "predict, val, export, import) and --backbone-weights NAME (backbones; imagenet is "
                                   "the model's ImageNet one). Files are downloaded once into the torch hub cache, "
                                   "checksum verified.", epilog=EPILOG)
    p.add_argument("--download", nargs="+", default=[], metavar="NAME",
                   help="download these now (e.g. before going offline); already cached ones are kept")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparser = parser._subparsers._group_actions[0].choices.get(args.command, parser)
        raise UsageError(suggest(subparser, unknown))
    return args
