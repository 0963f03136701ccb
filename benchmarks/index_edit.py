"""One edited annotation (issue 35): the training gate cold, warm, and on the start after one annotation file changed.

Makes the synthetic VOC set of ``scale.py`` (``--images`` 96 px JPEGs, 8 boxes each) under ``--root`` (default
``/tmp/ssd-index-edit``, never the repository), then times ``load_training_data`` (the call alone, imports apart) in a
fresh process for ``--before`` (a copy of an older ``src``, e.g. ``git archive <commit> src | tar -x -C /tmp/before``)
and for this checkout, each with its own cache folder: cold (no index) once, then ``--repeats`` rounds of a start
after one annotation was edited (a box moved by one pixel, its modification time restored: the status change time
tells it) and a warm start, the two versions interleaved so that both meet the same load. Medians of the rounds.

Run: ``.venv/bin/python benchmarks/index_edit.py --before /tmp/before/src --images 5000``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from scale import REPO, make_pictures, make_voc, run


def cpu() -> str:
    """The CPU's model name and whether it has AVX2 and AVX-512 (Linux; "unknown" elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return f"{model}, {os.cpu_count()} cores, avx2 {'avx2' in flags}, avx512f {'avx512f' in flags}"


def edit(path: Path, round_: int) -> None:
    """Move the first box of ``path`` by one pixel (alternately), its size and modification time kept."""
    st = os.stat(path)
    text = path.read_text()
    old, new = ("<xmin>2</xmin>", "<xmin>3</xmin>") if round_ % 2 == 0 else ("<xmin>3</xmin>", "<xmin>2</xmin>")
    if old not in text:
        raise RuntimeError(f"{path}: no {old} to edit")
    path.write_text(text.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="an older src folder (the code before)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "ssd-index-edit")
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    args.root.mkdir(parents=True)
    data = make_voc(args.root / "voc", args.images, make_pictures(args.root / "pictures"))
    past = 10**9 * (int(os.stat(data / "classes.txt").st_mtime) - 3600)  # files changed seconds ago are never trusted
    for folder, _, files in os.walk(args.root):
        for name in files:
            os.utime(os.path.join(folder, name), ns=(past, past))
    versions = {"before": args.before, "after": REPO / "src"}
    times: dict[str, dict[str, list[float]]] = {v: {"cold": [], "warm": [], "edit": []} for v in versions}
    for label, src in versions.items():
        times[label]["cold"].append(run("gate", data, src, args.root / f"cache-{label}")["seconds"])
    annotation = data / "Annotations" / "img0000000.xml"  # its first box starts at x 2
    for round_ in range(args.repeats):
        for label, src in versions.items():
            edit(annotation, 2 * round_ + (label == "after"))  # one file changed since this version's last start
            times[label]["edit"].append(run("gate", data, src, args.root / f"cache-{label}")["seconds"])
            times[label]["warm"].append(run("gate", data, src, args.root / f"cache-{label}")["seconds"])
    print(f"{args.images:,} VOC images of 96 px, 8 boxes each; the gate's seconds, medians of {args.repeats} "
          f"rounds ({cpu()})\n\n| | cold | warm | after one edit | edit / warm |\n|---|---|---|---|---|")
    for label in versions:
        cold, warm, edited = (statistics.median(times[label][k]) for k in ("cold", "warm", "edit"))
        print(f"| {label} | {cold:.2f} | {warm:.2f} | {edited:.2f} | {edited / warm:.1f}x |")


if __name__ == "__main__":
    main()
