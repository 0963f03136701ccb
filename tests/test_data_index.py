"""The dataset index: built once, equal to the readers' records, reused while the files are unchanged, re-reading
exactly the files that changed, rebuilt (with a notice) when its file is damaged, and never a pickle."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from builders import make_dataset
from ssd.cli import main
from ssd.data import DetectionDataset, build_dataloader
from ssd.data.check import check_dataset
from ssd.data.gate import load_training_data
from ssd.data.index import INDEX_FILE, cache_root, index_dataset
from ssd.data.load import load_dataset
from ssd.data.table import RecordTable
from ssd.errors import ConfigError, DataError

LINUX_FORK = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker processes are forked on Linux "
                                "only (elsewhere map_in_processes runs the steps in the process itself)")


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ssd"]


def settle(root: Path) -> Path:
    """Date the files of ``root`` changed in the last half minute a minute back (a time of their own): files changed
    within the last seconds are never trusted, so a test would read them every time."""
    now = time.time_ns()
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if os.stat(path).st_mtime_ns > now - 30 * 10**9:
                os.utime(path, ns=(now - 60 * 10**9, now - 60 * 10**9))
    return root


def voc(tmp_path: Path, train: int = 6) -> Path:
    return settle(make_dataset("voc", tmp_path / "voc", train=train, val=2, size=64, classes=3, seed=1))


def reads(data, **options) -> list[tuple[str, str]]:
    """The files one indexed read of ``data`` read, as ``(kind, file name)`` sorted."""
    return sorted((kind, Path(path).name) for kind, path in index_dataset(data, **options).reads)


def index_file(data, class_names=None) -> Path:
    (found,) = [p for p in (cache_root() / "datasets").glob(f"*/{INDEX_FILE.format('*')}")
                if json.loads(np.load(p)["meta"].tobytes())["key"]["data"] == os.path.abspath(data)
                and json.loads(np.load(p)["meta"].tobytes())["key"]["class_names"] == class_names]
    return found


def assert_same_records(expected, table: RecordTable) -> None:
    assert len(table) == len(expected)
    for want, got in zip(expected, table):
        assert (got.path, got.annotation, got.width, got.height, got.image_id) == \
               (want.path, want.annotation, want.width, want.height, want.image_id)
        assert len(got.objects) == len(want.objects)
        for a, b in zip(want.objects, got.objects):
            assert b.box == tuple(float(v) for v in np.float32(a.box))  # stored as training reads them
            assert (b.label, b.name, b.difficult, b.iscrowd, b.line, b.source, b.where, b.raw) == \
                   (a.label, a.name, a.difficult, a.iscrowd, a.line, a.source, a.where, a.raw)


def write_coco(root: Path) -> Path:  # not make_dataset's: images of three widths, and crowd objects to store
    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    for i in range(3):
        Image.new("RGB", (40 + 8 * i, 30), (20 * i, 90, 90)).save(root / "images" / f"{i}.jpg")
        images.append({"id": 10 + i, "file_name": f"{i}.jpg", "width": 40 + 8 * i, "height": 30})
        annotations += [{"id": 100 + 2 * i + j, "image_id": 10 + i, "category_id": 1 + j, "bbox": [2, 3, 10.5, 7],
                         "iscrowd": j} for j in range(2)]
    categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    path = root / "annotations" / "instances_train.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return settle(root) / "annotations" / "instances_train.json"


@pytest.mark.parametrize("kind", ["voc", "yolo", "coco"])
def test_index_equals_the_readers_records_and_is_reused_reading_nothing(kind, tmp_path):
    data = {"voc": lambda: voc(tmp_path), "yolo": lambda: settle(make_dataset("yolo", tmp_path).parent) / "data.yaml",
            "coco": lambda: write_coco(tmp_path)}[kind]()
    first = index_dataset(data, splits=("train", "val"))
    assert first.stored and first.reads
    again = index_dataset(data, splits=("train", "val"))
    assert again.reads == [] and again.stored  # nothing parsed, nothing decoded
    expected = load_dataset(data)
    assert list(again.spec.splits) == list(expected.splits)
    for split, records in expected.splits.items():
        assert_same_records(records, again.spec.splits[split])
    assert (again.spec.root, again.spec.format, again.spec.class_names, again.spec.category_ids,
            again.spec.sources) == (expected.root, expected.format, expected.class_names, expected.category_ids,
                                    expected.sources)
    assert again.issues == first.issues


@pytest.mark.slow
def test_index_equals_the_records_of_the_real_datasets(shared_data):
    for name in ("bccd", "aquarium"):
        data = shared_data / name
        expected = load_dataset(data)
        indexed = index_dataset(data, splits=tuple(expected.splits))
        for split, records in expected.splits.items():
            assert_same_records(records, indexed.spec.splits[split])


def test_changed_files_are_the_only_files_read_again(tmp_path):
    data = voc(tmp_path)
    index_dataset(data)
    assert reads(data) == []
    xml = data / "Annotations" / "synth_000001.xml"  # an edited annotation: the file alone
    xml.write_text(xml.read_text().replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1) + " ")
    settle(data)
    assert reads(data) == [("voc", "synth_000001.xml")]
    image = data / "JPEGImages" / "synth_000002.jpg"  # an edited image: its header, its decode, its record's file
    Image.new("RGB", (64, 64), (1, 2, 3)).save(image)
    settle(data)
    assert reads(data) == [("decode", "synth_000002.jpg"), ("size", "synth_000002.jpg"), ("voc", "synth_000002.xml")]
    for suffix in ("jpg", "xml"):  # a renamed pair: read under the new name
        folder = data / ("JPEGImages" if suffix == "jpg" else "Annotations")
        (folder / f"synth_000003.{suffix}").rename(folder / f"renamed.{suffix}")
    train = data / "ImageSets" / "Main" / "train.txt"
    train.write_text(train.read_text().replace("synth_000003", "renamed"))
    settle(data)
    assert reads(data) == [("decode", "renamed.jpg"), ("size", "renamed.jpg"), ("voc", "renamed.xml")]
    train.write_text(train.read_text().replace("renamed\n", ""))  # deleted from the split: nothing to read
    settle(data)
    assert reads(data) == []
    assert "renamed" not in {r.path.stem for r in index_dataset(data).spec.records("train")}
    shutil.copy(data / "JPEGImages" / "synth_000000.jpg", data / "JPEGImages" / "added.jpg")  # an added pair
    shutil.copy(data / "Annotations" / "synth_000000.xml", data / "Annotations" / "added.xml")
    train.write_text(train.read_text() + "added\n")
    settle(data)
    assert reads(data) == [("decode", "added.jpg"), ("size", "added.jpg"), ("voc", "added.xml")]
    assert reads(data) == []


def test_a_changed_class_list_reads_what_depends_on_it(tmp_path):
    data = voc(tmp_path)
    index_dataset(data)
    (data / "classes.txt").write_text("square\ncircle\ntriangle\nextra\n")  # VOC names: labels only, no file read
    settle(data)
    assert reads(data) == []
    assert index_dataset(data).spec.class_names[-1] == "extra"
    given = ["square", "circle", "triangle", "extra"]  # another reader option: an index of its own, which reads
    assert reads(data, class_names=given) == []  # nothing: each file's results are those of the other index
    assert index_file(data, given) != index_file(data) and reads(data) == []


def test_a_changed_class_list_rereads_the_yolo_label_files(tmp_path):
    yaml = settle(make_dataset("yolo", tmp_path).parent) / "data.yaml"
    index_dataset(yaml, splits=("train", "val"))
    yaml.write_text(yaml.read_text().replace("names: [a, b", "names: [A, b"))
    settle(tmp_path)
    again = index_dataset(yaml, splits=("train", "val"))
    assert sorted({kind for kind, _ in again.reads}) == ["yolo"] and len(again.reads) == 16
    assert again.spec.class_names[0] == "A" and again.spec.splits["train"][0].objects[0].name in ("A", "b", "d")


@pytest.mark.parametrize("damage", ["truncated", "edited", "foreign", "not a zip"])
def test_a_damaged_index_is_rebuilt_with_a_notice(damage, tmp_path, caplog):
    data = voc(tmp_path)
    index_dataset(data)
    path = index_file(data)
    content = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(content[:len(content) // 2])
    elif damage == "edited":  # one box value changed inside the file, the zip still valid
        z = dict(np.load(path))
        z["split0.boxes"] = z["split0.boxes"] + 1
        np.savez(path, **z)
    elif damage == "foreign":
        other = voc(tmp_path / "other")
        index_dataset(other)
        shutil.copy(index_file(other), path)
    else:
        path.write_bytes(b"\x80\x04pickled")
    rebuilt = index_dataset(data)
    notices = [m for m in messages(caplog) if "dataset cache" in m]
    assert len(notices) == 1 and "is not a valid index" in notices[0] and "rebuilding" in notices[0]
    assert rebuilt.stored and rebuilt.reads  # read again: nothing of the damaged file is trusted
    assert_same_records(load_dataset(data).records("train"), rebuilt.spec.records("train"))
    assert reads(data) == []


def test_an_unwritable_cache_folder_is_said_once(tmp_path, monkeypatch, caplog):
    data = voc(tmp_path)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "file" / "cache"))
    first, second = index_dataset(data), index_dataset(data)
    assert not first.stored and not second.stored and second.reads  # works, without a cache
    notices = [m for m in messages(caplog) if "dataset cache" in m]
    assert len(notices) == 1 and "working without a cache" in notices[0] and "SSD_CACHE_DIR" in notices[0]


def test_recheck_reads_and_decodes_everything_again(tmp_path):
    data = voc(tmp_path)
    everything = reads(data)
    assert reads(data) == [] and reads(data, recheck=True) == everything and reads(data) == []
    assert {kind for kind, _ in everything} == {"decode", "size", "voc"}


@LINUX_FORK
def test_the_decode_check_on_worker_processes_finds_and_remembers_what_it_does_here(tmp_path, monkeypatch):
    import ssd.data.check as check

    data = voc(tmp_path, train=8)
    image = data / "JPEGImages" / "synth_000002.jpg"
    image.write_bytes(image.read_bytes()[:-400])  # truncated: its header reads, its decode fails
    settle(data)
    here = index_dataset(data, splits=("train", "val"))
    monkeypatch.setattr(check, "PROCESS_MIN_IMAGES", 1)  # 10 images: 2 processes, chunks of 3
    monkeypatch.setattr(check, "DECODE_CHUNK", 3)
    monkeypatch.setattr(check, "usable_cores", lambda: 2)
    forked = index_dataset(data, splits=("train", "val"), recheck=True)
    assert forked.issues == here.issues and sorted(forked.reads) == sorted(here.reads)
    assert [(i.code, i.message) for i in forked.issues if i.code == "corrupt_image"] == [
        ("corrupt_image", "JPEGImages/synth_000002.jpg: image does not decode (OSError: image file is truncated "
                          "(120 bytes not processed))")]
    assert reads(data, splits=("train", "val")) == []  # the workers' decodes came back and were stored


def test_the_memo_joined_for_the_index_is_what_json_dumps_writes():
    from ssd.data.memo import FileMemo

    memo = FileMemo()
    memo.used = {"size\0/d/é.jpg\0k": [1, 2, 3, [64, 48]], "voc\0/d/a.xml\0k": b'[4, 5, 6, {"raise": ["x", null]}]',
                 "decode\0/d/b\\c.png\0k": [7, 2**70, 9, None], "size\0/d/inf\0k": [1, 2, 3, float("inf")]}
    expected = {k: json.loads(v) if isinstance(v, bytes) else v for k, v in memo.used.items()}
    assert memo.used_json() == json.dumps(expected).encode()
    memo.used = {}
    assert memo.used_json() == b"{}"


def _warn_and_square(values: list[int]) -> tuple[list[int], int]:
    import warnings

    from ssd.data.images import ImageWarning

    warnings.warn(ImageWarning(f"chunk {values[0]}"), stacklevel=1)
    return [v * v for v in values], os.getpid()


@LINUX_FORK
def test_steps_on_worker_processes_give_their_results_in_order_and_their_warnings_here():
    from ssd.data.images import ImageWarning
    from ssd.data.memo import map_in_processes

    with pytest.warns(ImageWarning) as caught:
        results = list(map_in_processes(_warn_and_square, [[1, 2], [3], [4, 5]], 2))
    assert [squares for squares, _ in results] == [[1, 4], [9], [16, 25]]
    assert os.getpid() not in {pid for _, pid in results}  # each ran in a worker
    assert [str(w.message) for w in caught] == ["chunk 1", "chunk 3", "chunk 4"]


def _in_a_pool_worker(chunks: list) -> list:
    from ssd.data.memo import map_in_processes

    return list(map_in_processes(_warn_and_square, chunks, 2))


@LINUX_FORK
def test_steps_run_in_the_process_itself_inside_a_daemonic_worker_which_may_not_start_processes():
    with multiprocessing.get_context("fork").Pool(1) as pool:  # its worker is daemonic
        (results,) = pool.map(_in_a_pool_worker, [[[1], [2]]])
    assert [squares for squares, _ in results] == [[1], [4]] and len({pid for _, pid in results}) == 1


def test_the_gate_refuses_and_skips_the_same_from_the_index(tmp_path):
    data = voc(tmp_path)
    xml = data / "Annotations" / "synth_000001.xml"
    xml.write_text(xml.read_text().replace("<xmax>", "<xmax>-", 1))  # an inverted box
    settle(data)
    messages = []
    for _ in range(2):  # built, then from the index
        with pytest.raises(DataError) as refused:
            load_training_data(data)
        messages.append(str(refused.value))
    assert messages[0] == messages[1] and "synth_000001.xml object 1" in messages[0]
    expected = load_dataset(data)
    cold, warm = (load_training_data(data, skip_invalid=True, recheck=recheck) for recheck in (True, False))
    kept = expected.records("train")
    kept[1].objects = kept[1].objects[1:]
    for spec in (cold, warm):
        assert_same_records(kept, spec.records("train"))


def test_training_batches_are_identical_with_and_without_the_index(synthetic_voc):
    records = load_dataset(synthetic_voc).records("train")
    table = load_training_data(synthetic_voc).records("train")
    assert isinstance(table, RecordTable)
    batches = []
    for source in (records, table):
        loader = build_dataloader(source, ["a", "b", "c"], 64, (0.5,) * 3, (0.25,) * 3, train=True, batch_size=4,
                                  seed=3, mosaic=0.5, keep_difficult=False)
        batches.append(list(itertools.islice(loader, 2)))
    for a, b in zip(*batches):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]


def _build(data: str, barrier, results) -> None:
    barrier.wait()
    results.put(index_dataset(data).stored)


def test_two_processes_building_at_once_leave_one_valid_index(tmp_path):
    data = voc(tmp_path, train=40)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    procs = [context.Process(target=_build, args=(str(data), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    stored = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0] and True in stored
    assert reads(data) == []  # the index left is whole and valid


def test_cache_images_beyond_the_memory_bound_is_downscaled_and_said(synthetic_voc, monkeypatch, caplog):
    records = load_dataset(synthetic_voc).records("val")  # 16 images: 16 * 3 * 64 * 64 bytes at 64 px
    monkeypatch.setattr("ssd.data.loader.MAX_CROP_CACHE_BYTES", 16 * 3 * 64 * 64 // 4)
    plain = DetectionDataset(records, ["a", "b", "c"], image_size=64)
    cached = DetectionDataset(records, ["a", "b", "c"], image_size=64, cache_images=True)
    (notice,) = [m for m in messages(caplog) if m.startswith("cache_images")]
    assert notice.startswith("cache_images: 16 images at 64 would take 0 MB, more than ssd.limits."
                             "MAX_CROP_CACHE_BYTES (0 MB): cached downscaled by 0.500")
    image, target = cached[3]
    assert image.shape == (3, 32, 32) and plain[3][0].shape == (3, 64, 64)
    assert torch.equal(target["boxes"] * 2, plain[3][1]["boxes"])  # the boxes follow the smaller image
    monkeypatch.setattr("ssd.data.loader.MAX_CROP_CACHE_BYTES", 16 * 3 * 64 * 64 // 100)
    with pytest.raises(ConfigError, match=r"downscaled by 0\.100, below 0\.25; train without cache_images"):
        DetectionDataset(records, ["a", "b", "c"], image_size=64, cache_images=True)


def test_ssd_check_reports_from_the_index_what_it_finds_reading_everything(tmp_path, capsys):
    data = voc(tmp_path)
    xml = data / "Annotations" / "synth_000001.xml"
    xml.write_text(xml.read_text().replace("<xmax>", "<xmax>-", 1))
    settle(data)
    for _ in range(2):  # built, then read from the index
        assert main(["check", str(data), "--json"]) == 1
        assert json.loads(capsys.readouterr().out) == check_dataset(data).to_dict()
    assert index_dataset(data, splits=None).reads == []
    assert main(["check", str(data), "--recheck"]) == 1
    assert reads(data, splits=None) == []


DDP_SCRIPT = """
import os, sys
import torch.distributed as dist
from ssd.data.index import index_dataset
import ssd.data.index
dist.init_process_group("gloo")
if dist.get_rank() == 0:  # changed just now: -1 in rank 0's index
    os.utime(os.path.join(sys.argv[1], "Annotations", "synth_000001.xml"))
else:  # rank 1 as if it came more than RACY_NS later: it must take rank 0's index as it is all the same
    ssd.data.index.RACY_NS = 0
dist.barrier()
reads = len(index_dataset(sys.argv[1]).reads)
with open(os.path.join(sys.argv[2], os.environ["RANK"]), "w") as f:
    f.write(str(reads))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks_build_the_index_once(tmp_path):
    data, out = voc(tmp_path), tmp_path / "out"
    out.mkdir()
    script = tmp_path / "index.py"
    script.write_text(DDP_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(data), str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0: 8 headers and annotations, the 6 train images decoded; rank 1 found its index
    assert int((out / "0").read_text()) == 2 * 8 + 6 and int((out / "1").read_text()) == 0


def test_a_rank_after_the_first_takes_the_index_rank_0_wrote_even_with_a_file_changed_just_now(tmp_path,
                                                                                               monkeypatch):
    data = voc(tmp_path)
    os.utime(data / "Annotations" / "synth_000001.xml")  # too recent to be trusted: -1 in rank 0's index
    first = index_dataset(data)
    assert first.stored and first.digest and len(first.reads) == 2 * 8 + 6
    monkeypatch.setattr("ssd.distributed.rank", lambda: 1)
    monkeypatch.setattr("ssd.distributed.broadcast_object", lambda obj: first.digest)  # what rank 0 sent
    monkeypatch.setattr("ssd.data.index.RACY_NS", 0)  # this rank came later: the file's state is known now
    other = index_dataset(data)
    assert other.reads == [] and other.digest == first.digest and other.spec.records("train")[1].path == \
        first.spec.records("train")[1].path


def test_training_tables_leave_the_message_columns_in_the_index_file(tmp_path):
    data = voc(tmp_path)
    train = load_training_data(data).records("train")
    assert train.detail._columns is None  # what a DataLoader worker shares: paths, sizes, boxes, labels, flags
    loader = build_dataloader(train, ["a", "b", "c"], 64, (0.5,) * 3, (0.25,) * 3, train=True, batch_size=2)
    next(iter(loader))
    assert train.detail._columns is None
    spawned = pickle.loads(pickle.dumps(train.take([1])))  # as a worker started by spawn receives it
    assert spawned[0].objects[0].where == load_dataset(data).records("train")[1].objects[0].where
    index_dataset(data, recheck=True)  # the file rewritten, the split's message columns unchanged: still read
    assert train.take([1])[0].objects[0].where == spawned[0].objects[0].where
    extra = "<object><name>circle</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax></bndbox>"
    for xml in (data / "Annotations").glob("*.xml"):  # one more object each: the message columns change
        xml.write_text(xml.read_text().replace("</annotation>", extra + "</object></annotation>"))
    settle(data)
    index_dataset(data)  # the file replaced under a table that has not read its details yet
    with pytest.raises(DataError, match="changed while this run used it"):
        train[0]


def test_an_evaluation_rank_caches_only_the_images_it_reads(synthetic_voc):
    records = load_dataset(synthetic_voc).records("val")  # 16 images, rank 1 of 2 reads 1, 3, ..., 15
    options = dict(image_size=64, mean=(0.5,) * 3, std=(0.25,) * 3, train=False, batch_size=4, rank=1, world_size=2)
    cached = build_dataloader(records, ["a", "b", "c"], cache_images=True, **options)
    plain = build_dataloader(records, ["a", "b", "c"], **options)
    assert sorted(cached.dataset.dataset._cache) == list(range(1, 16, 2))
    for a, b in zip(cached, plain, strict=True):
        assert torch.equal(a["images"], b["images"]) and a["paths"] == b["paths"]

