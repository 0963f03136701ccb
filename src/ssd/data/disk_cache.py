"""``--cache-images disk``: decoded uint8 images in one memory-mapped file in the cache folder (:class:`DiskImages`,
made by :func:`disk_images`), holding exactly the arrays :class:`ssd.data.loader.DetectionDataset` would decode (the
same sizes), so training batches are bit-identical with the cache off, in RAM (:mod:`ssd.data.image_cache`) or on
disk.

The disk cache is ``images.bin`` in ``<cache folder>/images/<key>/`` (the cache folder of the dataset index,
:func:`ssd.data.index.cache_root`; ``key`` a hash of :data:`IMAGE_CACHE_VERSION`, the versions of ssd, PIL,
torchvision and torch (they decode and resize), the decoding sizes' description and the image paths). It holds
every image's pixels (``uint8 [3, h, w]``, one after another), then a header (an ``.npz`` of plain arrays, read
with ``allow_pickle=False``, never a pickle: each image's offset, shape, CRC-32, requested size and its source
file's ``(size, mtime_ns, inode, ctime_ns)``), then a 16-byte trailer (header length, magic).

- **Written once, reused**: built under the folder's :class:`~ssd.files.DirectoryLock` and replaced atomically
  (temporary file and rename), so two processes never corrupt it; a later run maps it as it is. An image whose
  source file changed (or whose requested size did) is decoded again when the file is rewritten, the others are
  copied (checked against their CRC: a damaged one is decoded again too). Under torchrun rank 0 builds it while
  the other ranks wait, then every rank maps the same file.
- **Shared, not copied**: DataLoader workers read the mapping (forked workers inherit it, spawned ones map the file
  again and refuse one replaced meanwhile); each read copies one image out of the page cache.
- **Checked**: a file whose trailer or header does not read (truncated, edited) is rebuilt with a one-line notice;
  an image whose pixels fail their CRC when first read is decoded again, used and written back (one-line notice).
- **Bounded**: a cache larger than :data:`ssd.limits.MAX_DISK_CACHE_BYTES` is refused (:class:`ConfigError` naming
  both). A cache folder that cannot be written, a disk without the room, or a file another process is building
  right now: this run decodes the images when it reads them, and says so once.

Trade-off: a file is one split's list of paths at one decoding size; another list (an image added) or another input
size makes another file, and old files stay until the cache folder is cleared.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, nullcontext
from pathlib import Path
from typing import BinaryIO

import numpy as np
import PIL
import torch
import torchvision
from torch import Tensor

import ssd.distributed as ddp
from ssd._version import __version__
from ssd.data.image_cache import Decode
from ssd.data.index import cache_lock, cache_root, json_hash, stable_state, state_array
from ssd.data.index_file import INDEX_ERRORS, damage_reason, load_npz, open_regular
from ssd.data.memo import RACY_NS
from ssd.device import usable_cores
from ssd.errors import ConfigError, DataError, OutputError
from ssd.files import atomic_write
from ssd.limits import MAX_DISK_CACHE_BYTES
from ssd.log import LOGGER
from ssd.pools import map_ahead

__all__ = ["IMAGE_CACHE_VERSION", "CACHE_FILE", "DiskImages", "disk_images"]

IMAGE_CACHE_VERSION = 2
"""Changes whenever the file's layout changes: a file of another version is rebuilt."""
CACHE_FILE = "images.bin"
_MAGIC = b"SSDIMG01"
_TRAILER = struct.Struct("<Q8s")  # header length, magic
_HEADER = ("shapes", "offsets", "crc", "sizes", "states", "meta")
_AHEAD = 4
"""Decodes a rebuild runs ahead of the writer, per thread: what waits to be written stays bounded."""



class DiskImages:
    """The images of one cache file, mapped read-only (see the module docstring).

    Attributes:
        path: the file. inode: its inode (the file this process maps). decoded: the images this process decoded
        to build it (0: the file was reused as it was).
    """

    def __init__(self, path: Path, header: dict[str, np.ndarray], decoded: int = 0, file: BinaryIO | None = None
                 ) -> None:
        """``file``: ``path`` open, the file ``header`` was read from (mapped, whatever ``path`` names now)."""
        self.path, self.decoded = path, decoded
        self.shapes, self.offsets, self.crc = header["shapes"], header["offsets"], header["crc"]
        self.sizes, self.states = header["sizes"], header["states"]
        self._verified = np.zeros(len(self.shapes), bool)
        self._map: np.ndarray | None = None
        with open(path, "rb") if file is None else nullcontext(file) as f:
            self.inode = os.fstat(f.fileno()).st_ino
            self._mapped(f)

    def __len__(self) -> int:
        return len(self.shapes)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}  # a spawned worker maps the file again, never receives its pixels

    def _mapped(self, file: BinaryIO | None = None) -> np.ndarray:
        """The pixels, mapped from ``file`` (open) or else from the path (refused when it names another file)."""
        if self._map is None:
            with open(self.path, "rb") if file is None else nullcontext(file) as f:
                if os.fstat(f.fileno()).st_ino != self.inode:
                    raise DataError(f"the image cache {self.path} changed while this run used it (rebuilt by "
                                    "another run?): run again")
                total = int(self.offsets[-1])
                self._map = np.memmap(f, np.uint8, "r", shape=(total,)) if total else np.zeros(0, np.uint8)
        return self._map

    def pixels(self, index: int) -> np.ndarray:
        """Item ``index``'s stored bytes (a view of the mapping)."""
        return self._mapped()[self.offsets[index]:self.offsets[index + 1]]

    def read(self, index: int, decode: Decode) -> Tensor:
        """Item ``index``'s image ``uint8 [3, h, w]`` (a copy); checked against its CRC-32 on its first read in this
        process, and decoded again with ``decode`` and written back when it does not match."""
        pixels = np.array(self.pixels(index))
        if not self._verified[index]:
            if zlib.crc32(pixels) != self.crc[index]:
                return self._repair(index, decode)
            self._verified[index] = True
        return torch.from_numpy(pixels).reshape(3, *self.shapes[index].tolist())

    def _repair(self, index: int, decode: Decode) -> Tensor:
        image = decode(index)
        data = image.contiguous().numpy().tobytes()
        try:
            with open(self.path, "r+b") as f:  # the file this run mapped (a rebuilt one is another inode): in place
                if os.fstat(f.fileno()).st_ino == self.inode and len(data) == len(self.pixels(index)):
                    os.pwrite(f.fileno(), data, int(self.offsets[index]))
                    done = "written back"
                else:
                    done = "not written back (the file was replaced since this run mapped it)"
        except OSError as e:
            done = f"not written back ({e.strerror or e})"
        LOGGER.warning(f"image cache: image {index} of {self.path} does not match its checksum (damaged): decoded "
                       f"from its source again and {done}")
        self._verified[index] = True
        return image

    def fresh(self, sizes: np.ndarray, states: np.ndarray) -> np.ndarray:
        """``[N]`` bool: the stored images that are still right for ``sizes [N, 2]`` and source ``states [N, 4]``
        (a state of ``-1``, a file changed too recently to be told from a later edit, is never right)."""
        if len(sizes) != len(self):
            return np.zeros(len(sizes), bool)
        return (self.sizes == sizes).all(axis=1) & (self.states == states).all(axis=1) & (states[:, 0] >= 0)


def disk_images(paths: Sequence[str], sizes: np.ndarray, tag: str, decode: Decode) -> DiskImages | None:
    """The disk cache of the images ``paths`` decoded at ``sizes [N, 2]`` (h, w) by ``decode``: reused when
    fresh, else built (only the changed images decoded); None when this run cannot have one (said once).

    ``tag`` describes how the sizes were chosen (the input size, the crops): each description has its own file.
    Raises :class:`ConfigError` when the images take more than :data:`ssd.limits.MAX_DISK_CACHE_BYTES`, and the
    ``DataError`` of an image that does not decode.
    """
    absolute = [os.path.abspath(p) for p in paths]
    key = json_hash([IMAGE_CACHE_VERSION, _decoders(), tag, absolute])
    folder = cache_root() / "images" / key
    sizes = np.asarray(sizes, np.int64).reshape(-1, 2)
    nbytes = int(3 * sizes.prod(axis=1).sum())
    if nbytes > MAX_DISK_CACHE_BYTES:
        raise ConfigError(f"cache_images=disk: {len(sizes):,} images ({tag}) take {nbytes / 2**20:,.2f} MB, more "
                          f"than ssd.limits.MAX_DISK_CACHE_BYTES ({MAX_DISK_CACHE_BYTES / 2**20:,.2f} MB); use "
                          "--cache-images off, a smaller input or fewer images")
    # the other ranks map rank 0's file as it is (an image changed just now is -1 there, not fresh here)
    return ddp.leader_first(lambda: _built_or_fresh(folder, key, absolute, sizes, decode), lambda images: images.inode,
                            lambda inode: None if inode is None else _stored(folder / CACHE_FILE, key, inode))


def _built_or_fresh(folder: Path, key: str, paths: list[str], sizes: np.ndarray, decode: Decode) -> DiskImages | None:
    """The cache file in ``folder``: reused when fresh for ``paths`` and ``sizes``, else built under its lock."""
    since = time.time_ns() - RACY_NS
    states = state_array((stable_state(p, since) for p in paths), len(paths))
    stored = _stored(folder / CACHE_FILE, key)
    if stored is not None and stored.fresh(sizes, states).all():
        return stored
    lock = cache_lock(folder, "image cache", busy=f"image cache: {folder} is being built by another process; this "
                      "run decodes the images when it reads them", notice="image cache",
                      without="this run decodes the images when it reads them")
    if lock is None:
        return None
    try:  # read again under the lock (another process may have just built it); a damaged file was said above
        stored = _stored(folder / CACHE_FILE, key, say=False)
        if stored is not None and stored.fresh(sizes, states).all():
            return stored
        return _build(folder / CACHE_FILE, key, sizes, states, decode, stored)
    finally:
        lock.release()


def _decoders() -> dict[str, str]:
    """The versions of what decodes and resizes the images: another one may give other pixels (another file)."""
    return {"ssd": __version__, "PIL": PIL.__version__, "torchvision": torchvision.__version__,
            "torch": torch.__version__}


def _stored(path: Path, key: str, inode: int | None = None, say: bool = True) -> DiskImages | None:
    """The cache file at ``path`` if it reads as one of ``key`` (and is the file ``inode`` when given); None when
    absent, or invalid (said when ``say``: rebuilt)."""
    try:
        with open_regular(path) as f:
            if inode is not None and os.fstat(f.fileno()).st_ino != inode:
                return None  # replaced since rank 0 validated it: this rank decodes the images when it reads them
            end = f.seek(0, os.SEEK_END)
            if end < _TRAILER.size:
                raise ValueError(f"{end} bytes, shorter than its trailer")
            f.seek(end - _TRAILER.size)
            length, magic = _TRAILER.unpack(f.read(_TRAILER.size))
            if magic != _MAGIC or length > end - _TRAILER.size:
                raise ValueError("no cache trailer at its end (truncated or not a cache file)")
            f.seek(end - _TRAILER.size - length)
            with load_npz(io.BytesIO(f.read(length))) as z:
                header = {name: z[name] for name in _HEADER}
            meta = json.loads(header["meta"].tobytes())
            if meta != {"version": IMAGE_CACHE_VERSION, "key": key}:
                raise ValueError("it was built for other images or by another version")
            n = len(header["crc"])
            for name, shape in (("shapes", (n, 2)), ("offsets", (n + 1,)), ("crc", (n,)), ("sizes", (n, 2)),
                                ("states", (n, 4))):
                if header[name].shape != shape or header[name].dtype.kind not in "iu":
                    raise ValueError(f"its {name} are not {n} rows of integers")
            shapes, offsets = header["shapes"], header["offsets"]
            if offsets[-1] != end - _TRAILER.size - length or not np.array_equal(np.diff(offsets),
                                                                                 3 * shapes.prod(1)):
                raise ValueError("its offsets do not match its images")
            return DiskImages(path, header, file=f)  # the file read: one that replaced it since is not mapped
    except (FileNotFoundError, NotADirectoryError):  # none yet, or no cache folder at all (said by cache_lock)
        return None
    except INDEX_ERRORS as e:  # npz, npy and JSON errors
        if say:
            LOGGER.warning(f"image cache: {path} is not a valid cache ({damage_reason(e)}): rebuilding it")
        return None


def _build(path: Path, key: str, sizes: np.ndarray, states: np.ndarray, decode: Decode,
           stored: DiskImages | None) -> DiskImages | None:
    """Write the cache file: the images of ``stored`` still fresh copied, the others decoded (one thread per core)."""
    kept = np.zeros(len(sizes), bool) if stored is None else stored.fresh(sizes, states)
    needed = int(3 * sizes.prod(axis=1).sum())  # the new file (a previous one is on the disk already)
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        LOGGER.warning(f"image cache: {path.parent} has {free / 2**20:,.0f} MB free, the cache needs "
                       f"{needed / 2**20:,.0f} MB; this run decodes the images when it reads them")
        return None
    shapes, crc = np.zeros((len(sizes), 2), np.int64), np.zeros(len(sizes), np.uint32)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    todo = np.flatnonzero(~kept).tolist()
    damaged = 0  # kept images whose stored pixels fail their CRC: decoded again, never copied with a new CRC
    workers = usable_cores()
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool, atomic_write(path) as f, \
                closing(map_ahead(pool, decode, todo, _AHEAD * workers)) as decoded:
            for i in range(len(sizes)):
                data = stored.pixels(i) if kept[i] else next(decoded).contiguous().numpy()
                crc[i], shapes[i] = zlib.crc32(data), stored.shapes[i] if kept[i] else data.shape[-2:]
                if kept[i] and crc[i] != stored.crc[i]:
                    data, damaged = decode(i).contiguous().numpy(), damaged + 1
                    crc[i], shapes[i] = zlib.crc32(data), data.shape[-2:]
                offsets[i + 1] = offsets[i] + data.size
                f.write(memoryview(data).cast("B"))
            header = io.BytesIO()
            meta = np.frombuffer(json.dumps({"version": IMAGE_CACHE_VERSION, "key": key}).encode(), np.uint8)
            np.savez(header, shapes=shapes, offsets=offsets, crc=crc, sizes=sizes, states=states, meta=meta)
            f.write(header.getbuffer())
            f.write(_TRAILER.pack(header.tell(), _MAGIC))
    except OutputError as e:
        LOGGER.warning(f"image cache: {e}; this run decodes the images when it reads them")
        return None
    LOGGER.info(f"image cache: {len(todo) + damaged:,} of {len(sizes):,} images decoded into {path} "
                f"({offsets[-1] / 2**20:,.1f} MB)")
    return DiskImages(path, {"shapes": shapes, "offsets": offsets, "crc": crc, "sizes": sizes, "states": states},
                      decoded=len(todo) + damaged)

