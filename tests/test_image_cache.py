"""The image caches of ``--cache-images``: ram and disk give the batches of no cache, the disk
file is reused, rebuilt where its sources changed or it is damaged, bounded and shared; under DDP the RAM cache holds
the rank's shard."""

import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from builders import make_dataset
from ssd.cli.parsers import build_parser, parse
from ssd.data.crops import CropScale
from ssd.data.disk_cache import CACHE_FILE, DiskImages
from ssd.data.load import load_dataset
from ssd.data.loader import DetectionDataset, build_dataloader
from ssd.errors import ConfigError, DataError
from ssd.files import DirectoryLock
from ssd.pools import map_ahead
from ssd.training.config import TrainConfig

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
OLD_NS = 1_600_000_000 * 10**9  # source files older than the cache: a later edit is told apart by its mtime


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    """12 training records of 96 px synthetic VOC images (old mtimes), with a cache folder of the test's own."""
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    root = make_dataset("voc", tmp_path / "voc", train=12, val=2, classes=3)
    for path in root.rglob("*"):
        os.utime(path, ns=(OLD_NS, OLD_NS))
    spec = load_dataset(root)
    return spec.records("train"), spec.class_names


def _batches(records, names, cache, **options) -> list[dict]:
    loader = build_dataloader(records, names, 64, MEAN, STD, train=True, batch_size=4, seed=3, augment="light",
                              cache_images=cache, **options)
    return list(loader)


def _disk(records, names, **options) -> DiskImages:
    return DetectionDataset(records, names, **{"image_size": 48, **options}, cache_images="disk")._cache


def test_batches_are_bit_identical_with_the_cache_off_in_ram_and_on_disk(dataset):
    records, names = dataset
    for options in ({"mosaic": 0.5}, {"crop_scale": CropScale(0.5)}):  # resized to the input; decoded larger
        off = _batches(records, names, None, **options)
        for cache in ("ram", "disk"):
            batches = _batches(records, names, cache, **options)
            assert len(batches) == len(off) == 3
            for a, b in zip(off, batches):
                assert torch.equal(a["images"], b["images"]) and torch.equal(a["boxes"], b["boxes"])
                assert torch.equal(a["labels"], b["labels"]) and a["paths"] == b["paths"]


def test_the_disk_cache_is_reused_and_decodes_again_only_a_changed_image(dataset, ssd_messages):
    records, names = dataset
    first = _disk(records, names)
    assert first.decoded == 12 and first.path.name == CACHE_FILE and first.path.stat().st_size > 12 * 3 * 48 * 48
    assert [m for m in ssd_messages() if m.startswith("image cache")] == [
        f"image cache: 12 of 12 images decoded into {first.path} (0.1 MB)"]
    again = _disk(records, names)
    assert again.decoded == 0 and again.path == first.path and again.path.stat().st_ino == first.path.stat().st_ino
    changed = records[5].path
    Image.new("RGB", (96, 96), (200, 10, 10)).save(changed)
    os.utime(changed, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    rebuilt = _disk(records, names)
    assert rebuilt.decoded == 1
    image = rebuilt.read(5, lambda i: pytest.fail("read from the file"))
    assert torch.equal(image, DetectionDataset(records, names, image_size=48)._decode(5))
    assert (image[:, 10, 10] - torch.tensor([200, 10, 10])).abs().max() < 8  # the new picture (a JPEG)
    assert _disk(records, names, image_size=40) is not None  # another size: another file, the first one kept
    assert len(list(first.path.parent.parent.iterdir())) == 2 and _disk(records, names).decoded == 0


def test_a_truncated_or_edited_cache_file_is_rebuilt_with_a_notice(dataset, ssd_messages):
    records, names = dataset
    path = _disk(records, names).path
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    before = len(ssd_messages())
    assert _disk(records, names).decoded == 12
    assert [m for m in ssd_messages()[before:] if m.startswith("image cache")] == [
        f"image cache: {path} is not a valid cache (no cache trailer at its end (truncated or not a cache file)): "
        "rebuilding it", f"image cache: 12 of 12 images decoded into {path} (0.1 MB)"]
    with open(path, "r+b") as f:  # one image's pixels changed by hand: noticed when read, decoded and written back
        f.seek(3 * 48 * 48 * 2 + 7)
        f.write(b"\x00\xff\x00")
    plain = DetectionDataset(records, names, image_size=48)
    cache = _disk(records, names)
    assert cache.decoded == 0 and torch.equal(cache.read(2, plain._decode), plain._decode(2))
    assert ssd_messages()[-1] == (f"image cache: image 2 of {path} does not match its checksum (damaged): decoded "
                                  "from its source again and written back")
    assert torch.equal(_disk(records, names).read(2, lambda i: pytest.fail("decoded")), plain._decode(2))


def test_the_disk_cache_is_bounded_and_shared_with_workers_without_its_pixels(dataset, monkeypatch):
    records, names = dataset
    data = DetectionDataset(records, names, image_size=48, cache_images="disk")
    copy = pickle.loads(pickle.dumps(data))  # what a spawned worker receives: the file is mapped again there
    assert len(pickle.dumps(data._cache)) < 3 * 48 * 48
    for i in (0, 11):
        assert torch.equal(copy[i][0], data[i][0]) and torch.equal(copy[i][1]["boxes"], data[i][1]["boxes"])
    monkeypatch.setattr("ssd.data.disk_cache.MAX_DISK_CACHE_BYTES", 2**18)
    with pytest.raises(ConfigError, match=r"^cache_images=disk: 12 images \(native\) take 0\.32 MB, more than ssd\."
                                          r"limits\.MAX_DISK_CACHE_BYTES \(0\.25 MB\); use --cache-images off"):
        DetectionDataset(records, names, cache_images="disk")  # native 96 px: 331,776 bytes


def test_without_a_writable_cache_folder_or_while_another_process_builds_the_images_are_decoded(
        dataset, tmp_path, monkeypatch, ssd_messages):
    records, names = dataset
    folder = _disk(records, names).path.parent
    folder.joinpath(CACHE_FILE).unlink()
    lock = DirectoryLock(folder, what="image cache")
    try:
        data = DetectionDataset(records, names, image_size=48, cache_images="disk")
    finally:
        lock.release()
    assert data._cache is None and data[3][0].shape == (3, 48, 48)
    assert ssd_messages()[-1] == (f"image cache: {folder} is being built by another process; this run decodes the "
                                  "images when it reads them")
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "a file"))
    before = len(ssd_messages())
    for _ in range(2):
        assert DetectionDataset(records, names, image_size=48, cache_images="disk")._cache is None
    (told,) = ssd_messages()[before:]  # said once, and only that
    assert told.startswith("image cache: ") and told.endswith("this run decodes the images when it reads them (set "
                                                               "SSD_CACHE_DIR to a writable folder)")
    assert str(tmp_path / "a file") in told


def test_under_ddp_the_ram_cache_holds_the_rank_shard_which_the_rank_reads_in_a_new_order_each_epoch(dataset):
    records, names = dataset
    cached, read = [], []
    for rank in (0, 1):
        loader = build_dataloader(records, names, 48, MEAN, STD, train=True, batch_size=2, augment="none",
                                  cache_images="ram", rank=rank, world_size=2, mosaic=1.0)
        cached.append(sorted(loader.dataset.dataset._cache))
        epochs = [[i for i, _, _ in loader.sampler] for _ in range(2)]
        assert sorted(epochs[0]) == sorted(epochs[1]) == cached[-1] and epochs[0] != epochs[1]
        read.append(epochs[0])
        loader.dataset.dataset._decode = lambda i: pytest.fail(f"item {i} decoded")  # partners too in the shard
        assert [batch["images"].shape for batch in loader] == [(2, 3, 48, 48)] * 3
    assert cached == [list(range(0, 12, 2)), list(range(1, 12, 2))]
    assert sorted(read[0] + read[1]) == list(range(12))
    disk = build_dataloader(records, names, 48, MEAN, STD, train=True, batch_size=2, cache_images="disk", rank=1,
                            world_size=2)
    assert not disk.sampler.fixed_shard and len(disk.dataset.dataset._cache) == 12  # one file for every rank


DDP_SCRIPT = """
import json, os, sys
import torch.distributed as dist
from ssd.data.load import load_dataset
from ssd.data.loader import build_dataloader
dist.init_process_group("gloo")
spec = load_dataset(sys.argv[1])
if dist.get_rank() == 0:  # changed just now: -1 in rank 0's file, which rank 1 must map as it is all the same
    os.utime(spec.records("train")[3].path)
dist.barrier()
out = {}
for cache in ("disk", "ram"):
    loader = build_dataloader(spec.records("train"), spec.class_names, 48, (0.5,) * 3, (0.25,) * 3, train=True,
                              batch_size=2, cache_images=cache, rank=dist.get_rank(), world_size=2)
    images = loader.dataset.dataset._cache
    out[cache] = images.decoded if cache == "disk" else sorted(images)
    out[cache + " items"] = sorted(i for i, _, _ in loader.sampler)
with open(os.path.join(sys.argv[2], os.environ["RANK"]), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks_build_the_disk_cache_once_and_each_caches_its_shard_in_ram(dataset, tmp_path):
    out = tmp_path / "out"  # the fixture made the dataset (old mtimes) and the cache folder
    out.mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(DDP_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path / "voc"), str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / str(rank)).read_text()) for rank in (0, 1)]
    assert [r["disk"] for r in ranks] == [12, 0]  # rank 0 built the file, rank 1 mapped it
    assert [r["ram"] for r in ranks] == [r["ram items"] for r in ranks] == [list(range(0, 12, 2)),
                                                                             list(range(1, 12, 2))]
    assert sorted(ranks[0]["disk items"] + ranks[1]["disk items"]) == list(range(12))


def test_mosaic_partners_come_from_the_whole_split_without_the_ram_cache_and_from_the_rank_shard_with_it(dataset):
    records, names = dataset
    odd = list(range(1, 12, 2))  # rank 1's shard
    cases = [(None, True, list(range(12)), None), (None, False, list(range(12)), list(range(12))),
             ("ram", True, odd, []), ("ram", False, odd, [])]
    for cache, shuffle, pool, decoded in cases:
        loader = build_dataloader(records, names, 48, MEAN, STD, train=True, batch_size=2, cache_images=cache,
                                  shuffle=shuffle, rank=1, world_size=2, mosaic=1.0)
        data, read = loader.dataset.dataset, set()
        data._decode = lambda i, decode=data._decode, read=read: read.add(i) or decode(i)
        list(loader)  # unshuffled, rank 1 reads the odd items: the even ones it decodes are their partners
        assert data._pool.tolist() == pool and (decoded is None or sorted(read) == decoded), (cache, shuffle)


def test_cache_images_takes_ram_disk_or_off_and_older_configs_true_or_false():
    assert [TrainConfig(cache_images=v).cache_images for v in (True, False, "off", "ram", "disk", None)] == [
        "ram", None, None, "ram", "disk", None]
    assert TrainConfig.from_dict({"cache_images": True}).cache_images == "ram"
    with pytest.raises(ConfigError, match=r"cache_images='dsk' is invalid: choose one of ram, disk \(--cache-images\)"):
        TrainConfig(cache_images="dsk")
    parser = build_parser()
    assert parse(parser, ["train", "--cache-images", "--epochs", "2"]).cache_images == "ram"
    assert parse(parser, ["train", "--cache-images", "disk"]).cache_images == "disk"
    assert parse(parser, ["train", "--cache-images", "off"]).cache_images == "off"


def test_a_rebuild_decodes_again_a_kept_image_whose_pixels_are_damaged(dataset):
    records, names = dataset
    path = _disk(records, names).path
    with open(path, "r+b") as f:  # image 2 damaged, then image 5 changed: the rebuild must not keep image 2
        f.seek(3 * 48 * 48 * 2 + 7)
        f.write(b"\x00\xff\x00")
    Image.new("RGB", (96, 96), (200, 10, 10)).save(records[5].path)
    os.utime(records[5].path, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    rebuilt = _disk(records, names)
    assert rebuilt.decoded == 2
    plain = DetectionDataset(records, names, image_size=48)
    assert torch.equal(rebuilt.read(2, lambda i: pytest.fail("decoded when read")), plain._decode(2))


def test_a_rank_after_the_first_maps_the_file_rank_0_built_even_with_an_image_changed_just_now(dataset, monkeypatch):
    records, names = dataset
    os.utime(records[3].path)  # too recent to be trusted: stored as -1 by rank 0, never fresh for a later check
    first = _disk(records, names)
    assert first.decoded == 12 and first.states[3].tolist() == [-1] * 4
    monkeypatch.setattr("ssd.distributed.rank", lambda: 1)
    monkeypatch.setattr("ssd.distributed.broadcast_object", lambda obj: first.inode)  # what rank 0 sent
    other = _disk(records, names)
    assert other.decoded == 0 and other.inode == first.inode == first.path.stat().st_ino
    monkeypatch.setattr("ssd.distributed.broadcast_object", lambda obj: first.inode + 1)  # replaced meanwhile
    assert _disk(records, names) is None


def test_a_build_decodes_at_most_a_window_ahead_of_the_writer_and_cancels_the_rest_at_an_error():
    started = []

    def decode(i):
        started.append(i)
        if i == 3:
            raise DataError("image 3 does not decode")
        return i
    with ThreadPoolExecutor(max_workers=1) as pool:  # not all 100 submitted at once, nor decoded after the error
        images = map_ahead(pool, decode, list(range(100)), 8)
        assert next(images) == 0
        with pytest.raises(DataError, match="image 3 does not decode"):
            list(images)
    assert started == list(range(len(started))) and 4 <= len(started) <= 11


def test_a_cache_file_whose_header_is_nested_too_deep_or_of_other_lengths_is_rebuilt_not_a_crash(
        dataset, ssd_messages):
    records, names = dataset
    path = _disk(records, names).path
    blob = path.read_bytes()
    length = struct.unpack("<Q8s", blob[-16:])[0]
    pixels = blob[:len(blob) - 16 - length]
    with np.load(io.BytesIO(blob[len(pixels):-16])) as z:
        header = dict(z)
    for change, reason in [({"meta": np.frombuffer(b"[" * 200_000, np.uint8)}, "maximum recursion depth"),
                           ({"offsets": np.zeros(0, np.int64)}, "its offsets are not 12 rows of integers"),
                           ({"crc": header["crc"][:5]}, "its shapes are not 5 rows of integers")]:
        out = io.BytesIO()
        np.savez(out, **{**header, **change})
        path.write_bytes(pixels + out.getvalue() + struct.pack("<Q8s", out.tell(), b"SSDIMG01"))
        before = len(ssd_messages())
        assert _disk(records, names).decoded == 12
        notice = ssd_messages()[before]
        assert notice.startswith(f"image cache: {path} is not a valid cache (") and reason in notice


def test_the_file_mapped_is_the_one_whose_header_was_read(dataset, monkeypatch, tmp_path):
    records, names = dataset
    first = _disk(records, names)
    other = tmp_path / "other"
    shutil.copyfile(first.path, other)
    with open(other, "r+b") as f:  # same header, other pixels
        f.write(bytes(3 * 48 * 48))
    load = np.load

    def replaced_after_reading(*args, **kwargs):  # another run replaces the file between the header and the map
        loaded = load(*args, **kwargs)
        if other.exists():
            os.replace(other, first.path)
        return loaded
    monkeypatch.setattr(np, "load", replaced_after_reading)
    cache = _disk(records, names)
    assert cache.decoded == 0 and cache.inode == first.inode != first.path.stat().st_ino
    plain = DetectionDataset(records, names, image_size=48)
    assert torch.equal(cache.read(0, lambda i: pytest.fail("decoded")), plain._decode(0))


def test_another_decoder_version_makes_another_file(dataset, monkeypatch):
    records, names = dataset
    first = _disk(records, names)
    assert _disk(records, names).path == first.path
    for module in ("PIL", "torchvision", "torch", "ssd.data.disk_cache"):
        monkeypatch.setattr(f"{module}.__version__", "0.0.0-other")
        other = _disk(records, names)
        assert other.decoded == 12 and other.path != first.path


def test_the_disk_cache_takes_the_table_paths_in_one_list(dataset, monkeypatch):
    records, names = dataset
    first = _disk(records, names)
    monkeypatch.setattr("ssd.data.table.RecordTable.path", lambda self, i: pytest.fail("a path made item by item"))
    assert _disk(records, names).path == first.path  # the same key: the same paths
