"""What a run does, before it starts: ``config`` reconciled with the checkpoints it names (``resume``, ``weights``).

``plan_run`` refuses contradictions with messages that name the options: a resumed run continues as it was
configured (only the dataset's location and the number of epochs may change), and weights decide the architecture
and input size, so ``config.yaml`` records what really runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ssd.data.records import DatasetSpec
from ssd.errors import CheckpointError, ConfigError, DataError
from ssd.log import LOGGER
from ssd.models import build_model
from ssd.models.config import ModelConfig
from ssd.models.load import model_from_checkpoint, read_weights
from ssd.training.config import TrainConfig, option_name
from ssd.training.priors import resolve_priors
from ssd.training.state import TRAINING_STATE
from ssd.weights.checkpoint import load_checkpoint
from ssd.weights.resolve import resolve_weights

__all__ = ["RunPlan", "plan_run", "given_fields", "check_resumed_data", "build_run_model"]

# Options a resumed run may change when given; device, workers, quiet and the MLflow store always come from the
# resuming call (where the run computes and reports, not what it trains).
_RESUMABLE = ("data", "epochs", "time")
_CURRENT = ("device", "workers", "quiet", "mlflow")


@dataclass(frozen=True)
class RunPlan:
    """What a run does: ``config`` (resolved; what ``config.yaml`` records); on resume the checkpoint ``state``,
    its ``checkpoint`` path and the ``run_dir`` it continues; with ``weights``, the checkpoint dict they hold
    (``pretrained``, read once)."""

    config: TrainConfig
    state: dict[str, Any] | None = None
    checkpoint: Path | None = None
    run_dir: Path | None = None
    pretrained: dict[str, Any] | None = None


def given_fields(config: TrainConfig, overrides: Iterable[str] = ()) -> set[str]:
    """Fields the caller set: ``overrides`` plus every field of ``config`` that differs from its default."""
    given = set(overrides)
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if getattr(config, f.name) != default:
            given.add(f.name)
    return given


def plan_run(config: TrainConfig, given: set[str]) -> RunPlan:
    """Reconcile ``config`` with the checkpoints it names, refusing contradictions.

    ``resume``: the run continues as it was configured; ``data`` (a moved dataset), ``epochs`` (longer or
    shorter, the lr schedule keeping its length) and ``time`` (the run's whole budget, the time already trained
    counting) may change, anything else given that differs is refused.
    ``weights``: the checkpoint decides the architecture and input size; a different ``model`` or
    ``image_size`` given explicitly (or ``backbone_weights``) is refused, else adopted with a message.
    """
    if config.resume:
        return _plan_resume(config, given)
    if config.weights:
        return _adopt_weights(config, given)
    return RunPlan(config.resolved())


def _plan_resume(config: TrainConfig, given: set[str]) -> RunPlan:
    path = resolve_weights(config.resume, "resume")
    state = load_checkpoint(path)
    missing = [key for key in TRAINING_STATE if key not in state]
    if missing:
        raise CheckpointError(
            f"cannot resume from {path}: it holds model weights but no training state (missing "
            f"{', '.join(missing)}): it was not written by `ssd train` (e.g. by ssd.save_checkpoint(path, model)). "
            f"Start a new run from these weights instead: --weights {path} (optimizer and lr schedule start afresh)")
    saved = TrainConfig.from_dict(state["train_config"], source=f"key in {path} train_config")
    run_dir = path.parent.parent if path.parent.name == "weights" else path.parent
    changed = {k for k in given - {"resume", *_CURRENT} if getattr(config, k) != getattr(saved, k)}
    refused = sorted(changed - set(_RESUMABLE))
    if refused:
        shown = "; ".join(f"{option_name(k)} {getattr(config, k)} (the run has {getattr(saved, k)})" for k in refused)
        raise ConfigError(f"--resume continues {run_dir} as it was configured, but {shown}: only --data, --epochs, "
                          "--time, --device, --workers, --quiet and --mlflow may change on resume. To train with other "
                          f"settings, start a new run from its weights: --weights {path}")
    updates: dict[str, Any] = {"resume": str(path), **{k: getattr(config, k) for k in _CURRENT}}
    if "data" in changed:
        LOGGER.info(f"resume: reading the dataset from {config.data} (the run started on {saved.data})")
        updates["data"] = config.data
    if "epochs" in changed:
        done, length = int(state["epoch"]) + 1, saved.schedule_epochs or saved.epochs
        if config.epochs < done:
            raise ConfigError(f"--epochs {config.epochs} is fewer than the {done} epochs {path} has already done")
        if config.epochs > length:
            LOGGER.info(f"resume: training to {config.epochs} epochs; the lr schedule keeps its {length}-epoch "
                        f"length, epochs {length + 1}-{config.epochs} use its final lr")
        updates.update(epochs=config.epochs, schedule_epochs=length)
    if "time" in changed:
        LOGGER.info(f"resume: a time budget of {config.time:g} minutes for the whole run (it was {saved.time}); "
                    "the time already trained counts")
        updates["time"] = config.time
    LOGGER.info(f"resuming {run_dir} from {path} ({int(state['epoch']) + 1} epoch(s) done)")
    return RunPlan(saved.update(**updates).resolved(), state, path, run_dir)


def _adopt_weights(config: TrainConfig, given: set[str]) -> RunPlan:
    pretrained = read_weights(resolve_weights(config.weights))  # a file, a run directory or a known name
    model = ModelConfig.from_dict(pretrained["config"], source=str(config.weights))
    conflicts = []
    if "model" in given and config.model != model.name:
        conflicts.append(f"--model {config.model}")
    if "image_size" in given and config.image_size not in (None, model.image_size):
        conflicts.append(f"--image-size {config.image_size}")
    if "backbone_weights" in given and config.backbone_weights:
        conflicts.append(f"--backbone-weights {config.backbone_weights}")
    if conflicts:
        raise ConfigError(f"--weights {config.weights} holds a {model.name} model for {model.image_size} px "
                          f"inputs, which {' and '.join(conflicts)} contradict: the weights decide the architecture "
                          "and input size. Leave those options out, or leave out --weights to train from scratch")
    if (config.model, config.image_size) != (model.name, model.image_size):
        LOGGER.info(f"weights: {config.weights} holds a {model.name} model for {model.image_size} px inputs: "
                    "training that")
    return RunPlan(config.update(model=model.name, image_size=model.image_size).resolved(), pretrained=pretrained)


def check_resumed_data(plan: RunPlan, class_names: list[str], num_train: int) -> None:
    """Refuse resuming on a dataset other than the run's: other class names, or another number of train images."""
    state, data = plan.state, plan.config.data
    trained = list(state["class_names"])
    if list(class_names) != trained:
        raise DataError(f"cannot resume {plan.run_dir}: the dataset {data} has the classes {class_names} but the "
                        f"run was trained on {trained}. Give the run's dataset (--data, if it moved), or start a new "
                        f"run on this dataset from its weights: --weights {plan.checkpoint}")
    expected = state.get("train_images")
    if expected is not None and expected != num_train:
        raise DataError(f"cannot resume {plan.run_dir}: the train split of {data} has {num_train} images but the "
                        f"run was trained on {expected}; a resumed run continues on the same data. Start a new "
                        f"run from its weights instead: --weights {plan.checkpoint}")


def build_run_model(plan: RunPlan, spec: DatasetSpec) -> nn.Module:
    """The run's model: the resumed checkpoint's own (neither ``weights`` nor ``backbone_weights`` files are read
    again, and its default boxes are kept), ``weights`` with new class heads where the classes differ, or a new one
    (``backbone_weights``); ``priors`` (a file, or ``auto``: fitted to ``spec``'s training boxes) replaces the
    default boxes of the last two."""
    config, class_names = plan.config, list(spec.class_names)
    if plan.state is not None:
        return model_from_checkpoint(plan.state)
    if plan.pretrained is not None:
        LOGGER.info(f"weights: started from {config.weights}")
        priors = resolve_priors(spec, config.model, config.image_size, config.priors, seed=config.seed)
        return model_from_checkpoint(plan.pretrained, class_names=class_names, reinit_heads=True, priors=priors)
    priors = resolve_priors(spec, config.model, config.image_size, config.priors, seed=config.seed)
    return build_model(config.model, class_names=class_names, backbone_weights=config.backbone_weights,
                       image_size=config.image_size, priors=priors)

