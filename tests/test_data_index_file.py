"""The dataset index's file: each group of members checked when it is read (a warm start reads only what training
uses), an older version or a damaged group rebuilt with a one-line notice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import ssd.data.fingerprint as fingerprint_module
import ssd.data.memo as memo_module
from builders import make_dataset
from ssd.data.disk_cache import disk_images
from ssd.data.index import INDEX_VERSION, index_dataset, json_hash, stable_state
from ssd.data.index_file import _digest, damage_reason, memo_path
from ssd.errors import DataError
from test_data_index import index_file, messages, reads, settle, voc


def rewrite(path: Path, change) -> None:
    """Rewrite the index file ``path`` with ``change(members)`` applied to its arrays (a dict), the zip valid."""
    members = dict(np.load(path))
    change(members)
    np.savez(path, **members)


def test_an_index_of_an_older_version_is_rebuilt_with_a_notice(tmp_path, caplog):
    data = voc(tmp_path)
    index_dataset(data)
    path = index_file(data)

    def version_1(members):  # as version 1 wrote it: one digest of every member
        meta = json.loads(members["meta"].tobytes())
        meta["key"]["version"] = 1
        members["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        members["digest"] = members.pop("digests")
    rewrite(path, version_1)
    rebuilt = index_dataset(data)
    (notice,) = [m for m in messages(caplog) if "dataset cache" in m]
    assert notice == (f"dataset cache: {path} is not a valid index (it was written for index version 1, this ssd "
                      f"reads version {INDEX_VERSION}): rebuilding it")
    assert rebuilt.stored and len(rebuilt.reads) == 2 * 8 + 6 and reads(data) == []


def warm_with_val_messages_damaged(tmp_path):
    """``(data, index file, val's split number, the warm start)`` of a VOC set whose stored index had val's message
    columns reversed before that warm start."""
    data = voc(tmp_path)
    index_dataset(data, splits=("train", "val"))
    path = index_file(data)
    val = json.loads(np.load(path)["meta"].tobytes())["splits"].index("val")
    rewrite(path, lambda m: m.__setitem__(f"split{val}.where.blob", m[f"split{val}.where.blob"][::-1].copy()))
    return data, path, val, index_dataset(data, splits=("train", "val"))


def test_the_message_columns_of_a_split_are_read_and_checked_alone_when_used(tmp_path, caplog):
    data, path, val, warm = warm_with_val_messages_damaged(tmp_path)
    assert warm.reads == [] and not messages(caplog)  # a warm start does not read the message columns
    assert warm.spec.records("train")[0].objects[0].where.startswith("Annotations/")  # train's own, intact
    assert warm.spec.records("val")[0].objects[0].where.startswith("Annotations/")  # rebuilt in this run
    assert messages(caplog) == [f"dataset cache: {path} is not a valid index (its message columns of split {val} do "
                                "not match their digest (edited or damaged)): rebuilding it now"]
    assert path.exists() and reads(data, splits=("train", "val")) == []


def test_message_columns_damaged_while_the_dataset_changed_tell_the_run_to_run_again(tmp_path, caplog):
    data, _, _, warm = warm_with_val_messages_damaged(tmp_path)
    (data / "JPEGImages" / "synth_000006.jpg").unlink()  # a val image gone: the rebuilt split is another one
    with pytest.raises(DataError, match="changed while this run used it"):
        warm.spec.records("val")[0]


def test_damaged_per_file_results_are_not_trusted_when_rebuilding(tmp_path, caplog):
    data = voc(tmp_path)
    index_dataset(data)
    path = index_file(data)
    memo = memo_path(path)  # the per-file results' own file
    rewrite(memo, lambda m: m.__setitem__("memo", np.concatenate([m["memo"], np.frombuffer(b" ", np.uint8)])))
    assert reads(data) == [] and not messages(caplog)  # a warm start does not read them
    xml = data / "Annotations" / "synth_000001.xml"
    xml.write_text(xml.read_text() + " ")
    settle(data)
    assert reads(data) == [("voc", xml.name)] and not messages(caplog)  # patched: copied, with their digest
    (data / "notes.txt").write_text("a file added: rebuilt\n")
    settle(data)
    assert len(reads(data)) == 2 * 8 + 6  # every file read again, not only the changed one
    assert messages(caplog) == [f"dataset cache: {path} is not a valid index (its per-file results do not match "
                                "their digest (edited or damaged)): rebuilding it"]
    assert reads(data) == []


def test_a_new_set_of_splits_walks_the_dataset_folder_once(tmp_path, monkeypatch):
    data = voc(tmp_path)
    index_dataset(data, splits=("train",))
    walks, walk = [], fingerprint_module.walk
    monkeypatch.setattr(fingerprint_module, "walk", lambda root, *rest: walks.append(root) or walk(root, *rest))
    both = index_dataset(data, splits=("train", "val"))  # unchanged files, a check not stored yet: val decoded
    assert walks == [data] and both.stored and sorted(kind for kind, _ in both.reads) == ["decode", "decode"]


def test_the_per_file_results_name_their_arguments_by_a_digest(tmp_path):
    yaml = settle(make_dataset("yolo", tmp_path).parent) / "data.yaml"
    index_dataset(yaml, splits=("train", "val"))
    memo = json.loads(np.load(memo_path(index_file(yaml)))["memo"].tobytes())
    keys = [key.split("\0") for key in memo if key.startswith("yolo\0")]
    assert len(keys) == 16 and all(len(parts) == 3 and len(parts[2]) == 24 for parts in keys)  # no class list



def test_the_per_file_results_are_written_as_json_dumps_writes_them(tmp_path, monkeypatch):
    data = voc(tmp_path)
    index_dataset(data, splits=("train", "val"))
    xml = data / "Annotations" / "synth_000001.xml"
    xml.write_text(xml.read_text() + " ")
    settle(data)
    stats, stat = [], memo_module.file_state
    for module in (memo_module, fingerprint_module):
        monkeypatch.setattr(module, "file_state", lambda path: stats.append(os.fspath(path)) or stat(path))
    index_dataset(data, splits=("train", "val"))  # entries kept from the file and new ones, in one memo
    stored = np.load(memo_path(index_file(data)))["memo"].tobytes()
    assert stored == json.dumps(json.loads(stored)).encode()
    # each file stat'ed once in the run: by the file list, before any read; never again by the steps that read it
    assert len(stats) == len(set(stats)) == len(list(data.rglob("*.*")))

def test_the_index_and_the_image_cache_share_their_names_file_states_and_notices(tmp_path):
    assert disk_images.__globals__["json_hash"] is json_hash and disk_images.__globals__["damage_reason"] is \
        damage_reason
    assert json_hash(["a", 1]) == json_hash(["a", 1]) != json_hash(["a", 2]) and len(json_hash(None)) == 32
    assert damage_reason(ValueError("first line\nsecond")) == "first line" and damage_reason(EOFError()) == "EOFError"
    assert damage_reason(ValueError("x" * 300)) == "x" * 120
    file = tmp_path / "f"
    file.write_text("ab")
    st = file.stat()
    assert stable_state(str(file), st.st_mtime_ns + 1) == (2, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    assert stable_state(str(file), st.st_mtime_ns) == stable_state(str(tmp_path / "none"), 0) == (-1,) * 4


def test_meta_data_or_per_file_results_nested_too_deep_are_rebuilt_not_a_crash(tmp_path, caplog):
    data = voc(tmp_path)
    index_dataset(data)
    path = index_file(data)
    deep = np.frombuffer(b"[" * 200_000, np.uint8)  # json.loads raises RecursionError
    rewrite(path, lambda m: m.__setitem__("meta", deep))
    rebuilt = index_dataset(data)
    (notice,) = [m for m in messages(caplog) if "dataset cache" in m]
    assert notice.startswith(f"dataset cache: {path} is not a valid index (") and notice.endswith("): rebuilding it")
    assert rebuilt.stored and len(rebuilt.reads) == 2 * 8 + 6

    def deep_memo(members):  # their digest made to match: read when a file changed
        digests = json.loads(members["digests"].tobytes()) | {"memo": _digest({"memo": deep}, ["memo"])}
        members["digests"] = np.frombuffer(json.dumps(digests).encode(), np.uint8)
    rewrite(memo_path(path), lambda members: members.__setitem__("memo", deep))
    rewrite(path, deep_memo)
    (data / "notes.txt").write_text("a file added: rebuilt\n")
    settle(data)
    assert len(reads(data)) == 2 * 8 + 6 and reads(data) == []  # not trusted: every file read again
