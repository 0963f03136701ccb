"""One training configuration from the command line, a YAML file or Python: :class:`TrainConfig`.

Every field is a command-line option of ``ssd train`` (``batch_size`` is ``--batch-size``, see :func:`option_name`)
and a key of the YAML file; ``TrainConfig.update(**overrides)`` applies either and answers an unknown key with the
closest valid names.
Fields left at ``None`` are resolved per model by :meth:`TrainConfig.resolved` (optimizer, learning rate, weight
decay) from the architecture's ``train_defaults``, so the defaults suit both the small CPU model and the
VGG/MobileNet configurations.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from ssd.errors import ConfigError
from ssd.files import write_text
from ssd.limits import MAX_EPOCHS, MAX_TRAIN_MINUTES, MAX_WORKERS, is_real, is_whole, value_text
from ssd.names import did_you_mean
from ssd.schemas import option, option_flag, run_name_problem
from ssd.settings import EVALUATE, check_thresholds
from ssd.sizes import parse_image_size
from ssd.yamlfile import safe_load

__all__ = ["TrainConfig", "option_name", "default_milestones"]


# The paper's SGD recipe unless the architecture says otherwise (Architecture.train_defaults).
OPTIMIZER_DEFAULTS: dict[str, dict[str, float]] = {
    "sgd": {"lr": 1e-3, "weight_decay": 5e-4},
    "adamw": {"lr": 1e-3, "weight_decay": 0.01},
}


MAX_LR = 10.0
"""Largest peak learning rate accepted (SGD's usual ones are 1e-3 to 1e-1; beyond this every step diverges)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; written to ``config.yaml`` in the run directory to reproduce it."""

    data: str | None = option("data.yaml (YOLO), dataset folder (VOC/YOLO) or COCO JSON", default=None)
    model: str = option("model name (see ssd.models.list_models())", default="ssdlite320_mobilenet_v3_large")
    epochs: int = option("number of training epochs", default=50)
    batch_size: int = option("images per batch (per process under torchrun)", default=16)
    optimizer: Literal["sgd", "adamw"] | None = option("sgd or adamw (default: per model)", default=None)
    lr: float | None = option("peak learning rate (default: per model and optimizer)", default=None)
    momentum: float = option("SGD momentum / AdamW beta1", default=0.9)
    weight_decay: float | None = option("weight decay, not applied to norms and biases (default: per optimizer)",
                                       default=None)
    warmup_epochs: float = option("linear warmup length in epochs", default=1.0)
    warmup_iters: int | None = option("linear warmup length in iterations (wins over --warmup-epochs)", default=None)
    scheduler: Literal["cosine", "multistep"] = option("decay after warmup", default="cosine")
    milestones: list[int] = option("multistep: epochs where the lr is multiplied by --gamma (default: 2/3 and 8/9 of "
                                   "the epochs)", default_factory=list)
    gamma: float = option("multistep decay factor", default=0.1)
    final_lr_ratio: float = option("cosine: final lr as a fraction of the peak", default=0.01)
    schedule_epochs: int | None = option("length of the lr schedule in epochs (default: epochs); later epochs keep "
                                        "its final lr (set when a resumed run is extended)", default=None)
    grad_clip: float = option("max gradient norm (0 disables clipping)", default=10.0)
    device: str = option("cpu, cuda, cuda:N, mps or auto", default="auto")
    amp: bool = option("mixed precision: CUDA bf16 where supported, else fp16 with a gradient scaler; "
                      "CPU bf16 where it has native bf16 kernels (AVX512-BF16/AMX)", default=False)
    channels_last: bool | None = option("channels_last memory format (default: as the model configuration says)",
                                       default=None)
    compile: bool = option("torch.compile the model", default=False)
    workers: int = option("data loading worker processes", default=2)
    seed: int = option("random seed (data order, augmentation, initialization)", default=0)
    image_size: int | str | None = option("network input size: N (square) or HxW, height x width, e.g. 512x288 "
                                         "(default: the model's)", default=None)
    priors: str | None = option("default boxes: a YAML file written by `ssd check DATA --model NAME --fit-priors`, "
                               "or auto to fit them to the training split (default: the model's)", default=None)
    augment: Literal["ssd", "light", "none"] = option("training augmentation: ssd (photometric, zoom out, IoU crop, "
                                                     "flip), light (flip, mild jitter) or none", default="ssd")
    mosaic: float = option("probability that a training image becomes a mosaic of it and three others (0: off)",
                          default=0.0)
    close_mosaic: int | None = option("switch --mosaic off for the last N epochs (default: a tenth of --epochs, "
                                     "rounded)", default=None)
    crop_scale: str | None = option("native-resolution training crops: native (crops from the whole image down to "
                                   "the network input's size in original pixels), MIN or MIN,MAX (crop side as a "
                                   "fraction of the image side, in (0, 1], MAX 1 by default); replaces the zoom out "
                                   "and IoU crop of --augment ssd; predict / val with --tile to match (default: off)",
                                   default=None)
    cache_images: Literal["ram", "disk"] | None = option(
        "decode every image once: ram keeps them in memory (the option alone), disk in one memory-mapped file of the "
        "cache folder ($SSD_CACHE_DIR), reused by later runs; off (default) decodes each image when read", None,
        const="ram", choices=("ram", "disk", "off"))
    class_weights: Literal["none", "auto"] = option(
        "weights of the classification loss per class: auto gives rare classes more (inverse frequency of the "
        "training objects, mean 1 per object, at most 10; background 1); none: all 1", default="none")
    skip_invalid: bool = option("drop invalid objects/images (reported) instead of refusing the data", default=False)
    recheck: bool = option("read and decode the whole dataset again instead of trusting its index (rebuilt)",
                          default=False)
    skip_nonfinite: bool = option("skip and count steps with a non-finite loss instead of stopping", default=False)
    val_fraction: float | None = option("for data without a val split: hold out this share of the training images "
                                       "(seeded by --seed, reported) to validate on", default=None)
    val_interval: int = option("validate every N epochs (and always after the last)", default=1)
    metric: Literal["voc07", "voc", "coco"] = option("validation metric: voc07 11-point, voc area, coco",
                                                    default="voc07")
    score_threshold: float = option("validation score threshold in [0, 1]", default=EVALUATE.score_threshold)
    iou_threshold: float = option("validation NMS IoU threshold in [0, 1]", default=EVALUATE.iou_threshold)
    project: str = option("parent folder of run directories", default="runs/train")
    name: str = option("run directory name (auto-incremented: exp, exp2, ...)", default="exp")
    exist_ok: bool = option("reuse PROJECT/NAME instead of incrementing", default=False)
    resume: str | None = option("run directory or last.pt to continue", default=None)
    weights: str | None = option("checkpoint to start from: an ssd checkpoint or run directory (its best.pt), an "
                                "ssd.pytorch / torchvision / lufficc detector, or a known name (`ssd weights`, e.g. "
                                "ssd300_vgg16_coco, downloaded once); classes named as the data's carry over, "
                                "the others start afresh", default=None)
    backbone_weights: str | None = option("backbone weights: imagenet (torchvision's, downloaded once), a known name "
                                         "(`ssd weights`) or a torchvision backbone state dict file (.pth)",
                                         default=None)
    freeze: Literal["none", "backbone"] = option("backbone: freeze the base network (VGG16 up to conv7, the "
                                                "MobileNet / ssd_tiny stages); extra layers and heads train",
                                                default="none")
    freeze_epochs: int | None = option("with --freeze backbone: epochs it stays frozen, then everything trains "
                                      "(default: all epochs)", default=None)
    sync_bn: bool = option("SyncBatchNorm under torchrun", default=False)
    quiet: bool = option("no progress bars, one line per epoch", default=False)
    num_plot_images: int = option("validation images drawn with predictions", default=4)
    ema: bool = option("evaluate and save an exponential moving average of the weights (last.pt keeps the raw "
                      "weights too, for --resume)", default=False)
    ema_decay: float = option("EMA decay, reached after a warm-up of a few thousand steps", default=0.9999)
    patience: int = option("stop after N epochs without a better validation mAP (0: never)", default=0)
    time: float | None = option("training budget in minutes, validation included: after every epoch the epochs "
                               "that fit are estimated (overriding --epochs) and the lr schedule is sized to them; "
                               "the run stops when the next epoch would not fit. With --resume the time already "
                               "trained counts (a new --time sets the run's whole budget)", default=None)
    mlflow: str | None = option("log the options, per-epoch metrics, model card and files to MLflow: a tracking URI "
                                "or folder (the option alone: ./mlruns; the mlflow extra)", default=None,
                                const="mlruns", metavar="URI")

    def __post_init__(self) -> None:
        if self.image_size is not None:  # stored as an int when square, else "HxW" (YAML and command line alike)
            object.__setattr__(self, "image_size", parse_image_size(self.image_size))
        if isinstance(self.cache_images, bool) or self.cache_images == "off":  # true: ram (configs of older runs)
            object.__setattr__(self, "cache_images", "ram" if self.cache_images is True else None)
        if self.crop_scale is not None:  # stored as its canonical text: native, MIN or MIN,MAX
            from ssd.data.crops import parse_crop_scale  # torch only when crops are asked for: `ssd --help` stays light

            object.__setattr__(self, "crop_scale", parse_crop_scale(self.crop_scale).text)
        self._check()

    # ----------------------------------------------------------------------------------------------- building
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def update(self, **overrides: typing.Any) -> TrainConfig:
        """A copy with ``overrides`` applied; an unknown key raises :class:`ConfigError` naming the closest fields."""
        _reject_unknown(overrides, "option")
        return dataclasses.replace(self, **{k: _coerce(k, v) for k, v in overrides.items()})

    @classmethod
    def from_dict(cls, values: dict[str, typing.Any], source: str = "option") -> TrainConfig:
        _reject_unknown(values, source)
        return cls(**{k: _coerce(k, v) for k, v in values.items()})

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Read a YAML mapping of fields (as written by :meth:`to_yaml`)."""
        path = Path(path)
        try:
            values = safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of option: value, got {type(values).__name__}")
        return cls.from_dict(values, source=f"key in {path}")

    def to_dict(self) -> dict[str, typing.Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The YAML text of every field; also written to ``path`` when given."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            write_text(path, text)
        return text

    def resolved(self) -> TrainConfig:
        """A copy with the per-model defaults filled in (optimizer, lr, weight decay, multistep milestones)."""
        from ssd.models import MODEL_CONFIGS  # the architectures (and torch) only when a run is set up

        model_defaults = MODEL_CONFIGS[self.model].train_defaults if self.model in MODEL_CONFIGS else {}
        optimizer = self.optimizer or model_defaults.get("optimizer", "sgd")
        from_model = model_defaults if model_defaults.get("optimizer", optimizer) == optimizer else {}
        defaults = {**OPTIMIZER_DEFAULTS[optimizer], **{k: v for k, v in from_model.items() if k != "optimizer"}}
        milestones = self.milestones
        if self.scheduler == "multistep" and not milestones and self.time is None:  # --time: at the estimated length
            milestones = default_milestones(self.schedule_epochs or self.epochs)
        return dataclasses.replace(
            self,
            optimizer=optimizer,
            lr=self.lr if self.lr is not None else defaults["lr"],
            weight_decay=self.weight_decay if self.weight_decay is not None else defaults["weight_decay"],
            milestones=list(milestones),
        )

    # --------------------------------------------------------------------------------------------- checking
    def _check(self) -> None:
        _check_types(self)
        for name in ("epochs", "batch_size", "val_interval"):
            _require(self, name, getattr(self, name) >= 1, "must be at least 1")
        if self.schedule_epochs is not None:
            _require(self, "schedule_epochs", self.schedule_epochs >= 1, "must be at least 1")
        for name in ("warmup_epochs", "grad_clip", "gamma", "workers", "num_plot_images", "patience"):
            _require(self, name, getattr(self, name) >= 0, "must be >= 0")
        for name in ("epochs", "schedule_epochs", "warmup_epochs", "freeze_epochs", "close_mosaic", "patience",
                     "val_interval"):  # counted in epochs: bounded so that schedules and clocks stay finite sums
            value = getattr(self, name)
            _require(self, name, value is None or value <= MAX_EPOCHS,
                     f"must be at most {MAX_EPOCHS} epochs (ssd.limits.MAX_EPOCHS)")
        _require(self, "workers", self.workers <= MAX_WORKERS, f"must be at most {MAX_WORKERS} processes "
                 "(ssd.limits.MAX_WORKERS)")
        _require(self, "gamma", self.gamma <= 1, "must be in [0, 1] (the lr is multiplied by it at each milestone)")
        _require(self, "momentum", 0 <= self.momentum < 1, "must be in [0, 1) (SGD momentum / AdamW beta1)")
        _require(self, "ema_decay", 0 < self.ema_decay < 1, "must be in (0, 1), e.g. 0.9999")
        _require(self, "final_lr_ratio", 0 <= self.final_lr_ratio <= 1, "must be in [0, 1] (a fraction of the peak lr)")
        check_thresholds(self.score_threshold, self.iou_threshold, EVALUATE.max_detections, self.batch_size,
                         names={k: f"{k} ({option_name(k)})" for k in ("score_threshold", "iou_threshold")})
        if self.lr is not None:
            _require(self, "lr", 0 < self.lr <= MAX_LR, f"must be in (0, {MAX_LR:g}]")
        if self.weight_decay is not None:
            _require(self, "weight_decay", 0 <= self.weight_decay <= 1, "must be in [0, 1]")
        _require(self, "mosaic", 0 <= self.mosaic <= 1, "must be a probability in [0, 1]")
        # a mosaic canvas has no original resolution for a native-resolution crop to be drawn at
        _require(self, "mosaic", not (self.mosaic and self.crop_scale), "is a different recipe from --crop-scale "
                 "(native-resolution crops of one image); use one of them")
        for name in ("freeze_epochs", "warmup_iters", "close_mosaic"):
            if getattr(self, name) is not None:
                _require(self, name, getattr(self, name) >= 0, "must be >= 0")
        _require(self, "seed", 0 <= self.seed < 2**63, "must be in [0, 2**63)")
        if self.time is not None:
            _require(self, "time", 0 < self.time <= MAX_TRAIN_MINUTES, "must be a number of minutes in (0, "
                     f"{MAX_TRAIN_MINUTES}] (a year; ssd.limits.MAX_TRAIN_MINUTES)")
        if self.val_fraction is not None:
            _require(self, "val_fraction", 0 < self.val_fraction < 1, "must be in (0, 1), e.g. 0.1")
        _require(self, "name", run_name_problem(self.name) is None, run_name_problem(self.name) or "")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            _require(self, name, value is None or value in choices, f"choose one of {', '.join(choices)}")
        _require(self, "milestones", all(m >= 1 for m in self.milestones)
                 and list(self.milestones) == sorted(self.milestones), "must be increasing epochs >= 1")


def _require(config: TrainConfig, name: str, ok: bool, rule: str) -> None:
    """Raise :class:`ConfigError` naming the field, its command-line option, the value and the rule."""
    if not ok:
        raise ConfigError(f"{name}={value_text(getattr(config, name))} is invalid: {rule} "
                          f"({option_name(name)})")


def _type_rule(hint: typing.Any) -> tuple[Callable[[typing.Any], bool], str] | None:
    """The test of a field's value type and the words for it (``None`` for Literal fields, checked by choice)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    if any(typing.get_origin(a) is Literal for a in args):
        return None
    if list[int] in args:
        return lambda v: isinstance(v, list), "a list of whole numbers"
    if str in args:
        return lambda v: isinstance(v, (str, os.PathLike)), "text"
    return {int: (is_whole, "a whole number"), float: (functools.partial(is_real, finite=True), "a finite number"),
            bool: (lambda v: isinstance(v, bool), "true or false")}[args[0]]


def _check_types(config: TrainConfig) -> None:
    """Refuse a value of the wrong type (``epochs: ten``, ``batch_size: [4]``) or a non-finite number, by field."""
    for name, hint in typing.get_type_hints(TrainConfig).items():
        value, rule = getattr(config, name), _type_rule(hint)
        if value is None or rule is None or name in ("image_size", "crop_scale"):  # their parsers' rules
            continue
        test, words = rule
        ok = test(value)
        if ok and name == "milestones":
            ok = all(map(is_whole, value))
        _require(config, name, ok, f"must be {words}")


def default_milestones(length: int) -> list[int]:
    """The multistep milestones of a ``length``-epoch schedule when none are given: 2/3 and 8/9 of it."""
    return sorted({max(1, round(length * 2 / 3)), max(1, round(length * 8 / 9))})


def option_name(field_name: str) -> str:
    """The ``ssd train`` option of a field, as its ``--help`` spells it (:func:`ssd.schemas.option_flag`, the rule of
    every command): ``--batch-size`` for ``batch_size``; ``--conf`` and ``--iou`` for the thresholds."""
    return option_flag(TrainConfig.__dataclass_fields__[field_name])


_CHOICES = {name: typing.get_args(typing.get_args(hint)[0] if typing.get_origin(hint) is not Literal else hint)
            for name, hint in typing.get_type_hints(TrainConfig).items() if "Literal" in str(hint)}


def _reject_unknown(values: dict[str, typing.Any], what: str) -> None:
    valid = TrainConfig.field_names()
    for key in values:
        if key not in valid:
            raise ConfigError(f"unknown {what} {key!r}{did_you_mean(key, valid)}")


def _coerce(name: str, value: typing.Any) -> typing.Any:
    """Paths become strings (so the config stays YAML-able); a tuple of milestones becomes a list."""
    if isinstance(value, Path):
        return str(value)
    if name == "milestones" and isinstance(value, tuple):
        return list(value)
    return value
