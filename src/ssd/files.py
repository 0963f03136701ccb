"""Every file the library writes goes through here: one output guard, one atomic writer, fresh run directories.

- :func:`check_output` (:func:`check_outputs` for many) refuses, before any work is done, an output that is the same
  file as one of the inputs (compared by device and inode, as :func:`os.path.samefile` does, so hard links and
  symlinks are caught), a directory where a file is due, or a file where a directory is due.
- :func:`atomic_write` writes to a temporary file next to the target and renames it into place, so a crash, a full
  disk or a file-size limit never leaves a partial file; the previous file, if any, stays intact. An ``OSError``
  while writing becomes an :class:`OutputError` with one line naming the file and the cause.
- :func:`make_run_dir` creates the output folder of a run (``ssd train``, ``ssd val``, ``ssd predict``), never
  reusing one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, ClassVar, Literal

from ssd.errors import OutputError

__all__ = ["check_output", "check_outputs", "atomic_write", "write_text", "write_bytes", "is_temporary",
           "remove_stale_temporaries", "describe_os_error", "make_run_dir", "DirectoryLock", "LOCK_FILE", "NAME_MAX",
           "fitted_name", "safe_name", "LockHeld"]

# Temporaries are ".<name>.<8 characters>.ssdtmp" next to the target: a suffix of the library's own, so that cleaning
# up never touches a user's ".notes.txt.mynotes1.tmp".
LOCK_FILE = ".ssd.lock"
"""The file a :class:`DirectoryLock` holds a lock on, inside the folder it protects."""

NAME_MAX = 255
"""Most bytes in one file name (Linux, macOS and Windows file systems alike)."""

_TEMP_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_TEMP_EXTRA = len("..12345678.ssdtmp")  # what a temporary adds to its target's name
_TEMP_PATTERN = re.compile(r"\.(.+)\.[a-z0-9]{8}\.ssdtmp")
_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file-size limit",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "file name too long",
}


def describe_os_error(error: OSError, path: str | os.PathLike, *, action: str = "writing") -> str:
    """One line for a failed file operation: ``disk full while writing out.pt (ENOSPC)``."""
    code = errno.errorcode.get(error.errno or 0, "")
    cause = _CAUSES.get(error.errno or 0, error.strerror or str(error))
    return f"{cause} while {action} {path}" + (f" ({code})" if code else "")


def _identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file ``path`` names (links followed), or ``None`` when there is none (yet)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):  # missing, a dangling link, a name the OS refuses: it cannot be an input
        return None
    return info.st_dev, info.st_ino


def _check_kind(path: Path, kind: Literal["file", "dir"], what: str) -> None:
    if kind == "file" and path.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file name")
    if kind == "dir" and path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is an existing file; give a directory")
    if kind == "file" and path.parent.exists() and not path.parent.is_dir():
        raise OutputError(f"{what} {path}: {path.parent} is a file, not a directory")


def check_outputs(paths: Iterable[str | os.PathLike], *, inputs: Iterable[str | os.PathLike | None] = (),
                  kind: Literal["file", "dir"] = "file", what: str = "output") -> list[Path]:
    """:func:`check_output` for many outputs against the same inputs, each input looked at once.

    ``inputs`` may hold files and directories (compared by their own identity); ``None`` entries are skipped.

    Raises:
        OutputError: naming the output, the input it would overwrite, or the kind it should have.
    """
    protected: dict[tuple[int, int], Path] = {}
    for given in inputs:
        if given is not None and (key := _identity(Path(given))) is not None:
            protected.setdefault(key, Path(given))
    checked = []
    for path in map(Path, paths):
        _check_kind(path, kind, what)
        source = protected.get(_identity(path))  # type: ignore[arg-type]
        if source is not None:
            raise OutputError(f"{what} {path} is the input {source} (the same file); choose another {what} so the "
                              "input is kept")
        checked.append(path)
    return checked


def check_output(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = (),
                 kind: Literal["file", "dir"] = "file", what: str = "output") -> Path:
    """Refuse an output ``path`` that is one of ``inputs`` (same device and inode, so hard links and symlinks are
    caught) or has the wrong kind; return it as a Path.

    For ``kind="dir"``, an existing file at ``path`` is refused; for ``kind="file"``, an existing directory is (and
    a parent that is a file). ``what`` names the output in the message (``"--save-json"``).

    Raises:
        OutputError: naming the output, the input it would overwrite, or the kind it should have.
    """
    return check_outputs([path], inputs=inputs, kind=kind, what=what)[0]


def _name_bytes(text: str) -> int:
    # surrogatepass: a name read from disk may hold undecodable bytes (surrogate escapes); 3 bytes each is an upper
    # bound on what they take there
    return len(text.encode("utf-8", "surrogatepass"))


def fitted_name(stem: str, suffix: str = "", *, limit: int = NAME_MAX) -> str:
    """``stem + suffix`` as a file name that fits ``limit`` bytes (UTF-8): when it is longer, ``stem`` is cut and
    tagged with a hash of all of it (``<cut stem>~<12 hex>``), so distinct long names stay distinct. Every file
    name the library derives from a user's name (an image's stem, a class name) is made here."""
    if _name_bytes(stem + suffix) <= limit:
        return stem + suffix
    tag = "~" + hashlib.sha256(stem.encode("utf-8", "surrogatepass")).hexdigest()[:12] + suffix
    room = limit - _name_bytes(tag)
    if room < 0:
        raise OutputError(f"file name suffix {suffix[:40]!r} is longer than {limit} bytes")
    cut = stem[:room]  # a character takes at least one byte
    while _name_bytes(cut) > room:
        cut = cut[:-1]
    return cut + tag


def safe_name(text: str, suffix: str = "", *, fallback: str = "_") -> str:
    """``text`` (a class name, a stream's address: any text) as a file name, then ``suffix``: every character but
    letters, digits, ``_ . -`` and spaces replaced by ``_``, spaces, dots and ``_`` at its ends stripped (no ``..``,
    no hidden name; ``fallback`` when nothing is left), fitted by :func:`fitted_name`."""
    return fitted_name(re.sub(r"[^\w.\- ]", "_", text).strip(" ._") or fallback, suffix)


def _temporary_for(path: Path) -> tuple[int, Path]:
    for _ in range(100):
        token = "".join(secrets.choice(_TEMP_ALPHABET) for _ in range(8))
        tmp = path.with_name(f".{fitted_name(path.name, limit=NAME_MAX - _TEMP_EXTRA)}.{token}.ssdtmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path}")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary of :func:`atomic_write` (``.<name>.<8 characters>.ssdtmp``)."""
    return _TEMP_PATTERN.fullmatch(name) is not None


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporaries a killed writer left in ``directory`` (only the library's own names); return them."""
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in Path(directory).iterdir():
            if is_temporary(entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


class _WriteRecorder:
    """The file :func:`atomic_write` yields: it keeps the ``OSError`` a write raised, because some writers re-raise
    it as another type (``torch.save``: "unexpected pos 704 vs 598" for a full disk)."""

    def __init__(self, file: IO) -> None:
        self._file, self.error = file, None

    def write(self, data: bytes | str) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> object:  # everything else is the file's own
        return getattr(self._file, name)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: Literal["wb", "w"] = "wb", *,
                 encoding: str = "utf-8", newline: str | None = None, sync: bool = True) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; on success it is synced and renamed over ``path``.

    ``sync=False`` skips the fsync (the rename stays: never half a file, but a power cut may leave an empty one):
    for the many small per-image outputs of a run (drawn copies, crops, labels), whose fsync each cost more than the
    write; a run's own files (checkpoints, the results file) keep it.

    ``encoding`` / ``newline``: as for :func:`open` in text mode. Parent directories are created. A replaced
    file's permissions are kept; a new file gets ``0o666`` less the umask. On any error the temporary file is removed
    and ``path`` is untouched; an ``OSError`` (also one a write raised that the caller turned into another exception,
    as ``torch.save`` does) is raised again as :class:`OutputError` with :func:`describe_os_error`'s line (the
    previous file, if any, is said to be intact).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            keep_mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            keep_mode = None
        fd, tmp = _temporary_for(path)
    except OSError as error:
        raise OutputError(describe_os_error(error, path)) from error
    recorder = None
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": encoding, "newline": newline})) as f:
            if keep_mode is not None:
                os.chmod(tmp, keep_mode)
            recorder = _WriteRecorder(f)
            yield recorder
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        cause = error if isinstance(error, OSError) else getattr(recorder, "error", None)
        if cause is None or not isinstance(error, Exception):
            raise
        intact = ": the previous file is intact" if path.exists() else ""
        raise OutputError(describe_os_error(cause, path) + intact) from error


def write_text(path: str | os.PathLike, text: str, *, sync: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (``sync``: see :func:`atomic_write`); return the path."""
    with atomic_write(path, "w", sync=sync) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


def make_run_dir(project: str | Path, name: str, exist_ok: bool = False) -> Path:
    """``project/name``, or ``name2``, ``name3``, ... when taken (created here, so concurrent runs never share one)."""
    project = check_output(project, kind="dir", what="project folder")
    project.mkdir(parents=True, exist_ok=True)
    index = 1
    while True:
        path = project / (name if index == 1 else f"{name}{index}")
        if exist_ok:  # reusing project/name: a file there is refused, not stepped over to name2
            check_output(path, kind="dir", what="run directory")
        try:
            path.mkdir(exist_ok=exist_ok)
            return path
        except FileExistsError:
            index += 1


class LockHeld(OutputError):
    """A :class:`DirectoryLock` another process (or another open lock in this one) holds."""


class DirectoryLock:
    """An exclusive lock on a folder that one process writes into (a training run directory), held until
    :meth:`release`: a second run into the same folder (``--exist-ok``) is refused instead of mixing its files.

    The lock is a POSIX record lock (``fcntl.lockf``) on :data:`LOCK_FILE` inside the folder: the system drops it
    when the holder dies (a killed run never leaves the folder locked), and, unlike ``flock``, the holder's forked
    children (data-loader workers still shutting down) do not keep it. Record locks do not exclude the holder itself,
    so the folders this process holds are also remembered here.

    The lock file is opened without following a symbolic link (one that dangles would create its target elsewhere)
    and must be a regular file: a link, a folder or a FIFO in its place is refused, named.

    Raises:
        LockHeld: the folder is locked by another process (or another open lock in this one).
        OutputError: the lock file cannot be opened, or is not a regular file.
    """

    _held: ClassVar[set[str]] = set()

    def __init__(self, directory: str | os.PathLike, *, what: str = "run directory") -> None:
        import fcntl

        self.path = Path(directory) / LOCK_FILE
        self._key: str | None = None
        self._fd: int | None = None
        key = os.path.realpath(self.path)
        if key in DirectoryLock._held:
            raise self._in_use(directory, what)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        except OSError as error:
            kind = "a symbolic link" if self.path.is_symlink() else "a folder" if self.path.is_dir() else None
            raise OutputError(f"{self.path} is {kind}, not a lock file: remove it" if kind else
                              describe_os_error(error, self.path, action="locking")) from error
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(f"{self.path} is not a regular file (a FIFO or a device?), not a lock file: remove it")
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EACCES or EAGAIN: another process holds it
            os.close(fd)
            raise self._in_use(directory, what) from None
        self._fd, self._key = fd, key
        DirectoryLock._held.add(key)

    def _in_use(self, directory: str | os.PathLike, what: str) -> LockHeld:
        return LockHeld(f"{what} {directory} is in use by another run (it holds {self.path}); wait for it to "
                           "finish or choose another --name")

    def release(self) -> None:
        """Give the lock up (the lock file stays, unlocked); calling it again does nothing."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the record lock
            DirectoryLock._held.discard(self._key)
            self._fd = self._key = None
