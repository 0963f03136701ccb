"""The TFLite converter process of :func:`ssd.export.tflite.in_converter_process`: ``python -m
ssd.export.tflite_convert FOLDER [--int8] [--fp16]`` reads ``FOLDER/model.pt`` (a checkpoint of this library) and,
with ``--int8``, ``FOLDER/calibration.json`` (a list of image paths), and writes ``FOLDER/model.tflite``. An error is
one line on stderr, after :data:`ssd.export.tflite.CONVERTER_ERROR`, and exit code 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssd.errors import SSDError
from ssd.export.tflite import CONVERTER_ERROR, converter_error, flatbuffer
from ssd.models.load import model_from_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssd.export.tflite_convert")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args(argv)
    model = model_from_checkpoint(args.folder / "model.pt").eval()
    calibration = ([Path(p) for p in json.loads((args.folder / "calibration.json").read_text())]
                   if args.int8 else None)
    try:
        data = flatbuffer(model, calibration, args.fp16)
    except SSDError as e:
        print(f"{CONVERTER_ERROR}{' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else the converter raises: its reason in one line
        print(f"{CONVERTER_ERROR}{converter_error(e, model.config.name)}", file=sys.stderr)
        return 1
    (args.folder / "model.tflite").write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
