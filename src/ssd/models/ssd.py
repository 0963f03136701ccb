"""The SSD detector module: a multi-scale backbone, one box head per level, the default boxes and the class names.

Head outputs are laid out in the order of :func:`ssd.priors.default_boxes`: level by level, then row ``i``, column
``j`` of the feature map, then the boxes of that location (each head's channels are ``[A * C]`` with the box index
major), so ``loc[:, p]`` and ``logits[:, p]`` belong to ``priors[p]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ssd.card import ModelCard, check_category_ids, check_operating_point
from ssd.detect import detect_batch, model_input
from ssd.errors import CheckpointError, ConfigError
from ssd.models.config import ModelConfig
from ssd.preprocess import preprocess
from ssd.settings import PREDICT
from ssd.sizes import as_hw

__all__ = ["SSD", "LevelHead"]


class LevelHead(nn.Module):
    """The two predictors of one feature level: ``loc`` (``A * 4`` channels) and ``cls`` (``A * (K+1)`` channels)."""

    def __init__(self, loc: nn.Module, cls: nn.Module, num_outputs: int):
        super().__init__()
        self.loc = loc
        self.cls = cls
        self.num_outputs = num_outputs  # K + 1

    def forward(self, feature: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, C, H, W]`` -> ``(loc [B, H*W*A, 4], logits [B, H*W*A, K+1])`` in (row, column, box) order."""
        batch = feature.shape[0]
        loc = self.loc(feature).permute(0, 2, 3, 1).reshape(batch, -1, 4)
        logits = self.cls(feature).permute(0, 2, 3, 1).reshape(batch, -1, self.num_outputs)
        return loc, logits


class SSD(nn.Module):
    """Single Shot MultiBox Detector.

    Args:
        backbone: module mapping normalized images ``[B, 3, S, S]`` to a list of feature maps (one per level).
        heads: one :class:`LevelHead` per feature map.
        priors: default boxes ``[P, 4]`` ``(cx, cy, w, h)`` normalized (a persistent buffer, saved with the weights).
        config: the :class:`ModelConfig` that rebuilds the model (see :func:`ssd.models.build_model`).
        class_names: the K object class names; label ``k`` of every output is ``class_names[k]``.

    ``category_ids`` (the dataset's id of each label) and ``operating_point`` (the stored best-F1 point: the default
    confidence of :meth:`predict`) are ``None`` unless the model was read from a checkpoint that stores them; they
    are part of its :attr:`card`.
    """

    def __init__(self, backbone: nn.Module, heads: nn.ModuleList, priors: Tensor, config: ModelConfig,
                 class_names: Sequence[str]):
        super().__init__()
        if len(class_names) != config.num_classes:
            raise ConfigError(f"{len(class_names)} class names given for num_classes={config.num_classes}")
        self.backbone = backbone
        self.heads = heads
        self.register_buffer("priors", priors)
        self.register_load_state_dict_pre_hook(_check_loaded_priors)
        self.config = config
        self.class_names = list(class_names)
        self.category_ids: list[int] | None = None
        self.operating_point: dict | None = None

    @property
    def num_classes(self) -> int:
        """K, the number of object classes (the heads have K+1 outputs, index 0 is background)."""
        return self.config.num_classes

    @property
    def image_size(self) -> int | tuple[int, int]:
        """The network input size: an int (square side) or ``(height, width)`` (``ssd.sizes.as_hw`` reads both)."""
        return self.config.image_size

    @property
    def card(self) -> ModelCard:
        """The :class:`ssd.card.ModelCard` of this model (unsealed): its name, classes, input, normalization,
        variances, category ids and operating point."""
        config = self.config
        return ModelCard(
            model_name=config.name, class_names=tuple(self.class_names),
            category_ids=None if self.category_ids is None else tuple(
                check_category_ids(self.category_ids, self.num_classes, "category_ids")),
            image_size=as_hw(config.image_size), mean=tuple(config.mean), std=tuple(config.std),
            variances=tuple(config.variances),
            operating_point=check_operating_point(self.operating_point, "operating_point"))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``images [B, 3, H, W]`` normalized (``(H, W)`` the input size) -> ``(loc [B, P, 4], logits [B, P, K+1])``
        in prior order."""
        features = self.backbone(images)
        locs = []
        logits = []
        for i, head in enumerate(self.heads):
            loc, cls = head(features[i])
            locs.append(loc)
            logits.append(cls)
        return torch.cat(locs, dim=1), torch.cat(logits, dim=1)

    def preprocess(self, images: Sequence[Tensor] | Tensor) -> tuple[Tensor, Tensor]:
        """:func:`ssd.preprocess.preprocess` with this model's input size and normalization, on its device:
        ``images`` (``[3, H, W]`` uint8 or float in ``[0, 1]``) -> ``(batch [B, 3, S, S], sizes [B, 2] (h, w))``."""
        return preprocess(images, self.image_size, self.config.mean, self.config.std, device=self.priors.device)

    @torch.no_grad()
    def predict(self, images: Sequence[Tensor] | Tensor, score_threshold: float | None = None,
                iou_threshold: float = PREDICT.iou_threshold,
                max_detections: int = PREDICT.max_detections) -> list[dict]:
        """Detections in original-image pixels: :meth:`preprocess`, then :func:`ssd.detect.detect_batch` (the
        pipeline of every inference backend). Thresholds default to :data:`ssd.settings.PREDICT`, but
        ``score_threshold=None`` is the card's default confidence (:meth:`ssd.card.ModelCard.confidence`: the stored
        operating point when there is one), as :class:`ssd.inference.detector.Detector`.

        Runs in eval mode (the previous mode is restored). ``images`` as for :meth:`preprocess`.

        Returns:
            One dict per image: ``boxes [N, 4]`` float32 pixel xyxy of the original image, ``scores [N]``,
            ``labels [N]`` int64 in ``0..K-1``, ``names`` list of N class names; sorted by decreasing score.
        """
        batch, sizes = self.preprocess(images)
        was_training = self.training
        self.eval()
        try:
            detections = detect_batch(self, model_input(batch, self.config.channels_last), sizes,
                                      score_threshold=self.card.confidence(score_threshold)[0],
                                      iou_threshold=iou_threshold, max_detections=max_detections)
        finally:
            self.train(was_training)
        for detection in detections:
            detection["names"] = [self.class_names[k] for k in detection["labels"].tolist()]
        return detections


def _check_loaded_priors(module: SSD, state: dict, prefix: str, *_: object) -> None:
    """The default boxes are stored twice (``config.priors`` and the ``priors`` buffer): weights whose buffer is not
    the configuration's boxes (an edited or mixed-up checkpoint) are refused before anything is copied."""
    given, expected = state.get(prefix + "priors"), module.priors
    if given is None or expected.is_meta or given.shape != expected.shape:
        return  # missing or misshapen entries: load_state_dict reports them itself
    difference = float((given.detach().to(expected.device, torch.float64) - expected.double()).abs().max())
    if difference > max(1e-6, torch.finfo(expected.dtype).eps):  # boxes lie in [0, 1]: a half model rounds them
        raise CheckpointError(f"the default boxes stored with these weights differ from those of their "
                              f"configuration (by up to {difference:.3g}; {module.config.name} at image_size "
                              f"{module.config.image_size}): the checkpoint was edited or its parts come from "
                              "different models")
