"""Cache files and messages that once hung, crashed or misled: each test a user's scenario, and the message now."""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ssd.data.index
from builders import write_image
from ssd.data.disk_cache import CACHE_FILE, disk_images
from ssd.data.image_cache import RamImages
from ssd.data.index import index_dataset
from ssd.data.load import load_dataset
from ssd.errors import CheckpointError, ConfigError, DataError
from ssd.files import LOCK_FILE
from ssd.weights.resolve import resolve_weights
from test_data_index import index_file, messages, voc


def _image(tmp_path: Path) -> tuple[list[str], np.ndarray]:
    return [str(write_image(tmp_path / "a.png", 8, 8))], np.array([[8, 8]])


def _decode(i: int) -> torch.Tensor:
    return torch.full((3, 8, 8), 5, dtype=torch.uint8)


def test_an_index_whose_meta_member_is_a_zip_bomb_is_rebuilt_not_a_memory_error(tmp_path, caplog):
    data = voc(tmp_path)
    index_dataset(data)
    path = index_file(data)
    members = dict(np.load(path))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:  # meta inflates to 64 MB (a real one: 3 GiB)
        for name, array in members.items():
            with z.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, np.zeros(2**26, np.uint8) if name == "meta" else array)
    assert path.stat().st_size < 2**20
    rebuilt = index_dataset(data)
    assert rebuilt.stored
    [notice] = [m for m in messages(caplog) if "is compressed" in m]
    assert notice.startswith(f"dataset cache: {path} is not a valid index (its member ") and notice.endswith(
        "which ssd never writes): rebuilding it")


def test_an_image_cache_file_that_is_a_fifo_is_rebuilt_not_a_hang(tmp_path, caplog):
    paths, sizes = _image(tmp_path)
    built = disk_images(paths, sizes, "fifo", _decode)
    built.path.unlink()
    os.mkfifo(built.path)
    caplog.set_level(logging.INFO, logger="ssd")
    again = disk_images(paths, sizes, "fifo", _decode)
    assert again.decoded == 1 and again.path.is_file()
    assert f"image cache: {built.path} is not a valid cache (it is not a regular file (a FIFO or a device?)): " \
           "rebuilding it" in messages(caplog)


def test_a_temporary_left_by_a_killed_image_cache_build_is_removed_by_the_next_build(tmp_path):
    paths, sizes = _image(tmp_path)
    built = disk_images(paths, sizes, "killed", _decode)
    left = built.path.with_name(f".{CACHE_FILE}.k1ll3d00.ssdtmp")  # what kill -9 in the middle of a build leaves
    left.write_bytes(b"\0" * 1000)
    built.path.unlink()
    assert disk_images(paths, sizes, "killed", _decode).decoded == 1
    assert not left.exists()


@pytest.mark.parametrize("kind", ["a dangling symbolic link", "a folder"])
def test_an_index_lock_that_is_a_link_or_a_folder_is_said_and_creates_nothing_outside(tmp_path, caplog, kind,
                                                                                    monkeypatch):
    monkeypatch.setattr(ssd.data.index, "_told", set())  # said once a process: once for each case here
    data = voc(tmp_path)
    index_dataset(data)
    folder = index_file(data).parent
    (folder / LOCK_FILE).unlink()
    target = tmp_path / "elsewhere" / "created"
    if kind == "a folder":
        (folder / LOCK_FILE).mkdir()
    else:
        target.parent.mkdir()
        (folder / LOCK_FILE).symlink_to(target)
    (data / "Annotations" / "synth_000000.xml").touch()  # a change: the index is built again
    indexed = index_dataset(data)
    assert not indexed.stored and not target.exists()
    what = "a symbolic link" if kind != "a folder" else "a folder"
    assert f"dataset cache: {folder / LOCK_FILE} is {what}, not a lock file: remove it; working without a cache " \
           f"(set SSD_CACHE_DIR to a writable folder)" in messages(caplog)


def test_the_ram_cache_running_out_of_memory_below_its_bound_is_one_line():
    def decode(i: int) -> torch.Tensor:
        if i == 2:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                               "tried to allocate 12582912 bytes")
        return torch.zeros(3, 4, 4, dtype=torch.uint8)
    with pytest.raises(ConfigError, match=r"^cache_images=ram: out of memory with \d of 3 images cached \(0 MB; "
                                          r"RuntimeError\): train with --cache-images disk or off, or free memory$"):
        RamImages([0, 1, 2], decode)


def test_resume_of_a_run_killed_before_its_folder_existed_is_not_called_a_weights_file(tmp_path):
    with pytest.raises(CheckpointError) as raised:
        resolve_weights(tmp_path / "runs" / "exp", "resume")
    assert str(raised.value) == (f"cannot resume from {tmp_path / 'runs' / 'exp'}: no run directory or checkpoint is "
                                 "there (a run stopped before it wrote its first checkpoint has nothing to resume: "
                                 "start it again without --resume)")


@pytest.mark.parametrize("doctype, said", [
    ('<!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/hostname">]>', "undefined entity &x;"),
    ('<!DOCTYPE a [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c '
     '"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;"><!ENTITY e '
     '"&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;"><!ENTITY g '
     '"&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;"><!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">]>', "amplification"),
])
def test_voc_xml_with_an_external_entity_or_billion_laughs_says_why_it_is_not_read(tmp_path, doctype, said):
    write_image(tmp_path / "a.jpg", 16, 16)
    name = "&x;" if "&x;" in said else "&h;"
    (tmp_path / "a.xml").write_text(f'<?xml version="1.0"?>{doctype}<annotation><object><name>{name}</name><bndbox>'
                                    "<xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>"
                                    "</annotation>")
    with pytest.raises(DataError) as raised:
        load_dataset(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path}: no class names") and said in message
    assert message.endswith("XML entities are not read (an external entity is never fetched, nor an entity "
                            "expansion made): write the values themselves, without <!ENTITY> declarations")
