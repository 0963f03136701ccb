"""``ssd predict`` under ``torchrun``: each process predicts a contiguous slice of the inputs, and rank 0 merges.

:meth:`Shard.join` joins torchrun's process group (gloo: only small objects travel), :meth:`Shard.take` deals the
inputs out in contiguous slices (a video whole; with ``--track``, a folder's images as one sequence, on one rank),
and every rank writes its results as they come, as one process does: drawn copies, YOLO labels and crops under
their final names (they depend on the input only), its ``predictions.jsonl`` in a part folder
(:meth:`Shard.part_dir`). At the end (:meth:`Shard.merge`) rank 0 appends the other ranks' JSONL to its own in rank
order, which is the input order, and assembles the ``--format`` file from it: every output is the one a single
process writes, and no rank ever holds more than its own current batch. Crops are named after their record's line
in the JSONL, which a rank learns only once the ranks before it are done: ranks other than 0 write theirs in their
part folder and move them into place then (:meth:`ssd.inference.crop_files.CropWriter.place`).

Live streams and cameras are not sharded: every process would read the same camera.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import ssd.distributed as ddp
from ssd.errors import ConfigError
from ssd.log import LOGGER

if TYPE_CHECKING:
    from ssd.inference.results import PredictSummary
    from ssd.inference.writers import PredictionWriter

__all__ = ["Shard"]

T = TypeVar("T")


@dataclass(frozen=True)
class Shard(ddp.DistInfo):
    """This process's place in a sharded ``ssd predict``: ``rank`` of ``world_size`` (``0`` of ``1`` alone)."""

    @classmethod
    def join(cls, live: bool) -> Shard:
        """This process's shard under torchrun, else the one shard of a single process. Under torchrun the process
        joins the process group and stays in it until it exits: torchrun's store does not reliably take a second
        ``init_process_group`` after a ``destroy_process_group`` (a script that predicts, then validates).
        ``live``: the inputs are cameras or streams, which cannot be sharded (``ConfigError`` under torchrun)."""
        info = ddp.DistInfo.from_env()
        if not info.enabled:
            return cls()
        if live:
            raise ConfigError(f"live sources (cameras, streams) are not sharded: under torchrun each of the "
                              f"{info.world_size} processes would read the same frames; run ssd predict on them "
                              "without torchrun")
        ddp.setup("cpu")  # files and counts only travel: gloo, whatever the model's device
        return cls(info.rank, info.world_size, info.local_rank)

    def take(self, units: list[T]) -> list[T]:
        """This rank's contiguous slice of ``units`` (their order kept; sizes differ by at most one)."""
        return units[self.rank * len(units) // self.world_size:(self.rank + 1) * len(units) // self.world_size]

    def run_dir(self, make) -> Path:
        """``make()`` (the run's fresh save folder) called on rank 0 only, its result on every rank; its error (an
        output refused) raised on every rank, which would otherwise wait for a folder until the timeout."""
        outcome = None
        if self.is_main:
            try:
                outcome = make()
            except (OSError, ValueError) as e:
                outcome = e
        outcome = ddp.broadcast_object(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def part_dir(self, save_dir: Path) -> Path | None:
        """Where a rank other than 0 writes what rank 0 merges at the end (``None`` on rank 0, which writes in
        ``save_dir`` itself)."""
        return _part_dir(save_dir, self.rank) if self.rank else None

    def merge(self, writer: PredictionWriter, summary: PredictSummary) -> None:
        """After every rank wrote its results (a collective: every rank calls it): crops moved into place, and on
        rank 0 the other ranks' JSONL appended to its own in rank order, their part folders removed, and
        ``writer`` and ``summary`` counting the whole run. The other ranks keep their own counts."""
        if not self.enabled:
            return
        gathered = ddp.all_gather_objects((writer.counts(), summary.counts()))
        stats = [written for written, _ in gathered]
        before = stats[:self.rank]
        if writer.crops is not None:
            writer.crops.place(offset=sum(s["results"] for s in before),
                               room=writer.crops.max_crops - sum(s["crops"] for s in before))
        ddp.barrier()  # every rank's crops are in place: its part folder may go
        if not self.is_main:
            return
        with open(writer.jsonl_file, "a", encoding="utf-8") as out:
            for rank in range(1, self.world_size):
                folder = _part_dir(writer.save_dir, rank)
                with open(folder / writer.jsonl_file.name, encoding="utf-8") as part:
                    shutil.copyfileobj(part, out)
                shutil.rmtree(folder)
        writer.set_totals(stats)
        summary.add_counts([counted for _, counted in gathered[1:]])


    def salvage(self, writer: PredictionWriter) -> None:
        """On rank 0 of a sharded run stopped before :meth:`merge` (Ctrl-C, a rank killed and the collective
        failing): append the whole lines of every part JSONL that exists, in rank order, so that the ``--format``
        file the writer then assembles holds every result written, and say plainly what is missing (a part with
        none, crops left in a part folder). The other ranks and a single process do nothing."""
        if not (self.enabled and self.is_main):
            return
        writer.close()
        said = []
        with open(writer.jsonl_file, "a", encoding="utf-8") as out:
            for rank in range(1, self.world_size):
                folder = _part_dir(writer.save_dir, rank)
                try:
                    part = open(folder / writer.jsonl_file.name, encoding="utf-8")  # noqa: SIM115 (closed below)
                except FileNotFoundError:
                    said.append(f"rank {rank} wrote no results (its share is missing)")
                    continue
                with part:
                    whole = sum(1 for line in part if line.endswith("\n") and out.write(line))  # a torn one is none
                said.append(f"rank {rank}'s {whole} results appended")
                if (folder / "crops").is_dir():
                    said.append(f"rank {rank}'s crops left in {folder / 'crops'} (never placed)")
        LOGGER.warning(f"the sharded run stopped before its ranks merged: {'; '.join(said)}; the results of a rank "
                       "that was still predicting end where it stopped")


def _part_dir(save_dir: Path, rank: int) -> Path:
    """The folder in ``save_dir`` where rank ``rank`` (not 0) writes its part of a sharded run."""
    return save_dir / f".rank{rank}"
