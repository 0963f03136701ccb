"""Box conversions, batched IoU and the SSD offset encoding.

Conventions: boxes are ``xyxy`` (corners) or ``cxcywh`` (centre and size), normalized to ``[0, 1]`` of the
network input. Default boxes (priors) are ``cxcywh`` ``[P, 4]``. Offsets follow the original SSD encoding with
variances ``(v0, v1)``::

    ((cx_g - cx_p) / (v0 * w_p), (cy_g - cy_p) / (v0 * h_p), log(w_g / w_p) / v1, log(h_g / h_p) / v1)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import box_convert

from ssd.errors import ConfigError

__all__ = ["VARIANCES", "xyxy_to_cxcywh", "cxcywh_to_xyxy", "box_iou_batched", "encode", "decode", "pixel_scale"]

VARIANCES: tuple[float, float] = (0.1, 0.2)
"""The original SSD's offset variances ``(v0, v1)`` (centre, size): the default of every function that encodes or
decodes, and of every model configuration."""


def xyxy_to_cxcywh(boxes: Tensor) -> Tensor:
    """Corners ``[..., 4]`` ``(x1, y1, x2, y2)`` -> centre form ``[..., 4]`` ``(cx, cy, w, h)``."""
    return box_convert(boxes, "xyxy", "cxcywh")


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """Centre form ``[..., 4]`` ``(cx, cy, w, h)`` -> corners ``[..., 4]`` ``(x1, y1, x2, y2)``."""
    return box_convert(boxes, "cxcywh", "xyxy")


def box_iou_batched(a: Tensor, b: Tensor) -> Tensor:
    """IoU of every box of every image in ``a`` ``[B, G, 4]`` with every box in ``b`` ``[P, 4]`` (both xyxy).

    Returns ``[B, G, P]``. ``b`` is shared by the batch (the priors in point form). Same formula and bits as
    ``torchvision.ops.box_iou`` (``inter / (area_a + area_b - inter)``), computed on coordinate columns instead of
    ``[N, M, 2]`` corner pairs (cheaper for ``P`` in the thousands; see benchmarks/README.md).
    """
    batch, num_gt, _ = a.shape
    ax1, ay1, ax2, ay2 = a.reshape(batch * num_gt, 4, 1).unbind(1)  # each [B*G, 1]
    bx1, by1, bx2, by2 = b.T.contiguous()  # each [P]
    inter = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp_(min=0)
    inter *= (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp_(min=0)
    union = ((ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1)).sub_(inter)
    return inter.div_(union).view(batch, num_gt, b.shape[0])


def encode(
    matched: Tensor, priors: Tensor, variances: tuple[float, float] = VARIANCES, *, box_format: str = "xyxy"
) -> Tensor:
    """Encode matched ground-truth boxes as offsets from the priors.

    Args:
        matched: ``[..., P, 4]``, one ground-truth box per prior, xyxy (or cxcywh with ``box_format="cxcywh"``).
        priors: ``[P, 4]`` cxcywh.
        variances: ``(v0, v1)`` scaling of the centre and the size offsets.

    Returns:
        ``[..., P, 4]`` offsets ``(dx, dy, dw, dh)`` (see the module docstring).
    """
    if box_format not in ("xyxy", "cxcywh"):
        raise ConfigError(f'box_format must be "xyxy" or "cxcywh", got {box_format!r}')
    g = xyxy_to_cxcywh(matched) if box_format == "xyxy" else matched
    centre = (g[..., :2] - priors[:, :2]) / (variances[0] * priors[:, 2:])
    size = torch.log(g[..., 2:] / priors[:, 2:]) / variances[1]
    return torch.cat((centre, size), dim=-1)


def decode(offsets: Tensor, priors: Tensor, variances: tuple[float, float] = VARIANCES) -> Tensor:
    """Inverse of :func:`encode`: offsets ``[..., P, 4]`` and priors ``[P, 4]`` cxcywh -> boxes ``[..., P, 4]`` xyxy."""
    centre = priors[:, :2] + offsets[..., :2] * variances[0] * priors[:, 2:]
    size = priors[:, 2:] * torch.exp(offsets[..., 2:] * variances[1])
    return cxcywh_to_xyxy(torch.cat((centre, size), dim=-1))


def pixel_scale(sizes: Tensor) -> Tensor:
    """``[B, 2]`` image sizes as ``(h, w)`` -> ``[B, 4]`` float32 factors ``(w, h, w, h)``: normalized xyxy boxes
    times a row are in that image's pixels."""
    return sizes.flip(-1).repeat(1, 2).to(torch.float32)
