"""Nothing non-finite is ever saved: the errors of a step with a NaN/inf loss and of a run that diverged."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ssd._utils import few

__all__ = ["NonFiniteLossError", "NONFINITE_SHARE", "nonfinite_loss_error", "check_finite"]

NONFINITE_SHARE = 0.05
"""With ``skip_nonfinite``, a run stops once more than this share of its steps (and more than one) were skipped,
or when every step of an epoch was."""


class NonFiniteLossError(ValueError):
    """The loss or the weights became NaN/inf (the message says where, what was saved and what to try)."""


def nonfinite_loss_error(where: str, loss: float, paths: Sequence[str]) -> NonFiniteLossError:
    """The error of a step whose loss is ``loss`` (not finite) at ``where``, listing the batch's image ``paths``."""
    files = "\n".join(f"  {p}" for p in paths)
    return NonFiniteLossError(
        f"non-finite loss ({loss}) at {where}; nothing was saved for this step. The batch's images:\n"
        f"{files}\nCheck these files' boxes (`ssd check`), lower lr, or set skip_nonfinite to skip such steps.")


def check_finite(model: nn.Module, epoch: int, steps: int, skipped: int, nonfinite: int) -> None:
    """Stop before anything is saved for ``epoch`` (0-based) when it skipped every one of its ``steps``, the run
    skipped (``nonfinite`` in all) more than :data:`NONFINITE_SHARE` of its steps and more than one, or ``model``'s
    weights hold NaN/inf (the same on every rank)."""
    done = (epoch + 1) * steps
    kept = f"weights/last.pt holds epoch {epoch}" if epoch else "nothing was saved"
    if skipped == steps or nonfinite > max(1, NONFINITE_SHARE * done):
        which = (f"every step of epoch {epoch + 1} ({skipped})" if skipped == steps else
                 f"more than the {NONFINITE_SHARE:.0%} skip_nonfinite tolerates")
        raise NonFiniteLossError(
            f"training diverged: {nonfinite} of {done} steps ({nonfinite / done:.1%}) had a non-finite "
            f"loss and were skipped, {which}. The run stopped before saving epoch {epoch + 1} ({kept}). Lower "
            "lr, check the data (`ssd check`), or train without amp.")
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise NonFiniteLossError(
            f"training diverged: after epoch {epoch + 1} the weights hold NaN/inf ({few(bad)}). Nothing was saved "
            f"for this epoch ({kept}). Lower lr, keep gradient clipping on (grad_clip), or check the data "
            "(`ssd check`).")
