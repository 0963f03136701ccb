"""DistributedDataParallel helpers for runs launched by ``torchrun`` (env ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

Without those variables every helper degrades to the single-process behaviour, so the trainer has one code path.

The process group waits :data:`TIMEOUT_ENV` seconds (default :data:`DEFAULT_TIMEOUT_S`, 3 hours as Ultralytics
sets) for a collective: a large dataset's first run builds its index (and disk cache) on rank 0 while the other ranks
wait in one, far longer than NCCL's default of 10 minutes allows.

torch is imported by the helpers that need it: a process that never imported ``torch.distributed`` is in no
process group (the runtime install without PyTorch predicts through :class:`DistInfo` and :func:`rank_device`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ssd.errors import ConfigError
from ssd.log import quiet_other_ranks
from ssd.optional import has_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "DistInfo", "rank_device", "process_group_timeout", "setup",
           "cleanup", "steps_per_epoch", "rank", "broadcast_object", "all_gather_objects", "any_true",
           "broadcast_buffers", "barrier", "gather_objects", "gather_tensors", "leader_first", "is_distributed"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Only the main process writes files, prints progress bars and logs."""
        return self.rank == 0

    @classmethod
    def from_env(cls) -> DistInfo:
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


TIMEOUT_ENV = "SSD_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 3 * 3600


def process_group_timeout() -> timedelta:
    """How long a rank waits in a collective: ``$SSD_DIST_TIMEOUT`` seconds, else :data:`DEFAULT_TIMEOUT_S`.
    Raises :class:`~ssd.errors.ConfigError` for a value that is not a number of seconds in ``(0, 7 days]``."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 7 * 86400:  # NaN too
        raise ConfigError(f"{TIMEOUT_ENV}={text[:40]!r}: must be a number of seconds in (0, 604800] (default "
                          f"{DEFAULT_TIMEOUT_S}, 3 hours)")
    return timedelta(seconds=seconds)


def rank_device(device_name: str, info: DistInfo) -> torch.device | str:
    """This process's device (:func:`ssd.device.resolve_device`): under torchrun plain ``cuda`` (or ``auto`` on a
    CUDA machine) is ``cuda:LOCAL_RANK``, each rank on its own GPU; a device with an index is taken as it is.
    Without PyTorch, the name as it is (``auto``: ``cpu``) for the exported model's runtime."""
    if not has_torch():
        return "cpu" if device_name == "auto" else device_name
    from ssd.device import resolve_device

    return resolve_device(device_name, info.local_rank if info.enabled else None)


def setup(device_name: str) -> tuple[DistInfo, torch.device, bool]:
    """Read the torchrun environment, silence the messages of ranks other than 0 (:func:`ssd.log.quiet_other_ranks`),
    pick the device (:func:`ssd.device.resolve_device`) and join the process group (gloo on CPU, nccl on CUDA),
    whose collectives wait :func:`process_group_timeout`.

    Returns ``(info, device, created)``; ``created`` says this call initialized the group (so :func:`cleanup`
    should destroy it).
    """
    import torch.distributed as dist

    info = DistInfo.from_env()
    quiet_other_ranks(info.rank)
    device = rank_device(device_name, info)
    created = False
    if info.enabled and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=info.rank,
                                world_size=info.world_size, timeout=process_group_timeout())
        created = True
    return info, device, created


def cleanup(created: bool) -> None:
    import torch.distributed as dist

    if created and dist.is_initialized():
        dist.destroy_process_group()


def steps_per_epoch(num_images: int, batch_size: int, world_size: int) -> int:
    """Full batches of the smallest rank's share (every rank runs the same number of steps, as DDP requires)."""
    return (num_images // world_size) // batch_size


def is_distributed() -> bool:
    """Whether this process is one of several in a process group (False alone, or in a group of one)."""
    if "torch.distributed" not in sys.modules:  # no group without it; do not import torch to say so
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank in the process group (0 without one)."""
    return sys.modules["torch.distributed"].get_rank() if is_distributed() else 0


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (picklable objects)."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


T = TypeVar("T")


def leader_first(build: Callable[[], T], token: Callable[[T], Any], follow: Callable[[Any], T]) -> T:
    """Rank 0 makes something the other ranks then reuse (a file it builds or validates under its lock).

    Rank 0 runs ``build()`` while the other ranks wait, then sends them ``token(result)`` (picklable: what they need
    to find that result, e.g. a digest or an inode), or None when ``build`` returned None or raised: the token is sent
    even then, so the other ranks never hang, and rank 0 raises after sending it. Every other rank returns
    ``follow(token)``. Rank 0 (or the only process, without a process group) returns ``build()``'s result.
    """
    made = None
    try:
        if rank() == 0:
            made = build()
    finally:
        sent = broadcast_object(None if made is None else token(made))
    return made if rank() == 0 else follow(sent)


def all_gather_objects(obj: Any) -> list[Any]:
    """One entry per rank, in rank order (``[obj]`` without a process group)."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_objects(obj: Any, dst: int = 0) -> list[Any] | None:
    """One entry per rank, in rank order, on rank ``dst`` only (``None`` on the others; ``[obj]`` without a process
    group): the other ranks never hold what they did not make."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def gather_tensors(tensors: dict[str, Tensor], dst: int = 0) -> list[dict[str, Tensor]] | None:
    """Every rank's ``tensors`` (name -> ``[N, ...]``, ``N`` may differ between ranks; the same names, dtypes and
    trailing shapes on every rank) on rank ``dst``, one dict per rank in rank order, on the CPU; ``None`` on the other
    ranks, ``[tensors]`` without a process group. They travel as tensors (one gather each, padded to the largest
    ``N``), not pickled."""
    if not is_distributed():
        return [tensors]
    import torch
    import torch.distributed as dist

    world, main = dist.get_world_size(), dist.get_rank() == dst
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    names = sorted(tensors)
    counts = torch.tensor([len(tensors[name]) for name in names], device=device)
    every = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every, counts)
    out: list[dict[str, Tensor]] = [{} for _ in range(world)]
    for i, name in enumerate(names):
        tensor = tensors[name]
        wire = tensor.to(device, torch.uint8 if tensor.dtype == torch.bool else tensor.dtype)  # gloo has no bool
        padded = wire.new_zeros((max(1, *(int(c[i]) for c in every)), *wire.shape[1:]))
        padded[:len(wire)] = wire
        bucket = [torch.empty_like(padded) for _ in range(world)] if main else None
        dist.gather(padded, bucket, dst=dst)
        for part, rank_counts, got in zip(out, every, bucket or []):
            part[name] = got[:int(rank_counts[i])].to("cpu", tensor.dtype)
    return out if main else None


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any rank (keeps ranks in step when one must skip a step)."""
    if not is_distributed():
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_buffers(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (BatchNorm running statistics) to every rank: DDP syncs them only at the start
    of each forward, so after an epoch each rank holds the statistics of its own last batch."""
    if is_distributed():
        for buffer in model.buffers():
            sys.modules["torch.distributed"].broadcast(buffer, src=src)


def barrier() -> None:
    if is_distributed():
        sys.modules["torch.distributed"].barrier()
