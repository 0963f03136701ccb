"""``ssd tune``: the search space refused key by key with the closest names, a budget too small for one trial said
before anything runs, a corrupt or foreign study database refused and left as it was, failed and pruned trials
recorded while the study goes on, an interrupted tune resumed, and two processes sharing one SQLite study.
The trial function is a fake where the trainer itself is not what is tested."""

import csv
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builders import TINY_TRAIN
from ssd.errors import ConfigError, NonFiniteLossError, StudyError
from ssd.training import tune as tune_module
from ssd.training.config import TrainConfig
from ssd.training.trainer import TrainResult
from ssd.training.tune import TrialPruning, tune
from ssd.training.tune_space import Param, default_params, default_space, parse_space, sample, space_to_yaml
from ssd.training.tune_study import check_sqlite, open_study, sqlite_url
from ssd.tune_schema import TuneConfig

optuna = pytest.importorskip("optuna")


# --- the search space -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("space, message", [
    ({"lrr": {"low": 0.001, "high": 0.1}}, "space.yaml: lrr: not an option ssd tune searches; did you mean 'lr'"),
    ({"epochs": {"low": 1, "high": 9}}, "epochs: not an option ssd tune searches (set it in --config: it is not "
                                        "searched)"),
    ({"lr": {"low": 0.001, "hihg": 0.1}}, "lr: unknown key 'hihg'; did you mean 'high'"),
    ({"lr": {"low": 0.1, "high": 0.01}}, "lr: low 0.1 must be below high 0.01"),
    ({"lr": {"low": 0, "high": 0.01, "log": True}}, "lr: a log range must start above 0, got low 0"),
    ({"lr": {"low": "small", "high": 0.01}}, "lr: low must be one of finite numbers, got 'small'"),
    ({"lr": {"low": 0.001}}, "lr: a range needs low and high (missing high), or give choices"),
    ({"lr": {"low": 0.001, "high": 0.1, "log": "yes"}}, "lr: log must be true or false, got 'yes'"),
    ({"close_mosaic": {"low": 0.5, "high": 3}}, "close_mosaic: low must be one of whole numbers, got 0.5"),
    ({"ema": {"low": 0, "high": 1}}, "ema: takes choices only ({choices: [...]}), not a range"),
    ({"augment": {"choices": ["ssd", "heavy"]}}, "augment: 'heavy': augment='heavy' is invalid: choose one of ssd, "
                                                 "light, none"),
    ({"mosaic": {"low": 0, "high": 2}}, "mosaic: 2: mosaic=2 is invalid"),
    ({"augment": {"choices": []}}, "augment: choices must be a non-empty list, got []"),
    ({"augment": {"choices": ["ssd", "ssd"]}}, "augment: choices ['ssd', 'ssd'] repeat a value"),
    ({"augment": {"choices": ["ssd"], "low": 1}}, "augment: choices comes alone, without low"),
    ({"lr": 0.01}, "lr: expected {low: A, high: B} or {choices: [...]}, got 0.01"),
    ([1, 2], "space.yaml: expected a mapping of option"),
])
def test_a_bad_search_space_is_refused_by_key(space, message):
    with pytest.raises(ConfigError) as error:
        parse_space(space, "space.yaml")
    assert message in str(error.value)


def test_the_default_space_fits_the_model_and_reads_back():
    space = default_space("ssd_tiny")  # AdamW at 3e-3, weight decay 0.01, 256 px
    assert space[:4] == [Param("lr", 0.0006, 0.015, log=True), Param("weight_decay", 0.001, 0.1, log=True),
                         Param("augment", choices=("ssd", "light")), Param("image_size", choices=(256, 320))]
    assert [p.name for p in space] == ["lr", "weight_decay", "augment", "image_size", "mosaic", "close_mosaic",
                                       "crop_scale", "ema", "priors"]
    assert parse_space(yaml.safe_load(space_to_yaml(space))) == space
    assert all(name in TrainConfig.field_names() for name in (p.name for p in space))


@pytest.mark.parametrize("crops, mosaic, sampled", [
    ("native", None, {"crop_scale": "native"}),  # mosaic is refused with crops: neither it nor its epochs asked
    (None, 0.0, {"crop_scale": None, "mosaic": 0.0}),  # no mosaic: its closing epochs would not act
    (None, 0.5, {"crop_scale": None, "mosaic": 0.5, "close_mosaic": 2}),
])
def test_a_trial_samples_only_options_that_act(crops, mosaic, sampled):
    space = [p for p in default_space("ssd_tiny") if p.name in ("mosaic", "close_mosaic", "crop_scale")]
    fixed = {"crop_scale": crops, "close_mosaic": 2, **({} if mosaic is None else {"mosaic": mosaic})}
    assert sample(space, optuna.trial.FixedTrial(fixed), TrainConfig()) == sampled


def test_a_budget_too_small_for_one_trial_is_said_before_starting():
    with pytest.raises(ConfigError, match=r"--time 0.5 is too short: with --final-share 0.3 and --trials 10 each "
                                          r"trial gets 0.035 minutes, under the 0.1 a trial needs; give --time 1.4 "
                                          r"or more or fewer --trials"):
        TuneConfig(data="d", time=0.5, trials=10)
    with pytest.raises(ConfigError, match="--final-share must be in"):
        TuneConfig(data="d", time=5, final_share=1.0)


# --- the study database ---------------------------------------------------------------------------------------

def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "study.db"
    db.write_bytes(b"not a database at all")
    with pytest.raises(StudyError, match=r"study.db: not an SQLite database \(it starts with b'not a da'\)"):
        check_sqlite(db)
    with pytest.raises(StudyError):
        open_study(sqlite_url(db), "exp", {"model": "m"}, seed=0, startup_trials=2)
    assert db.read_bytes() == b"not a database at all"


def test_another_programs_sqlite_database_is_refused(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE users (name TEXT)")
    before = db.read_bytes()
    with pytest.raises(StudyError, match=r"an SQLite database of something else \(tables: users\), not an Optuna"):
        open_study(sqlite_url(db), "exp", {"model": "m"}, seed=0, startup_trials=2)
    assert db.read_bytes() == before


def test_a_study_of_another_model_or_not_made_by_ssd_is_refused(storage):
    url = storage
    open_study(url, "exp", {"model": "ssd_tiny", "classes": ["a"]}, seed=0, startup_trials=2)
    with pytest.raises(StudyError, match=r"study 'exp' tunes model 'ssd_tiny', not 'ssd300_vgg16'; give another"):
        open_study(url, "exp", {"model": "ssd300_vgg16", "classes": ["a"]}, seed=0, startup_trials=2)
    foreign = optuna.create_study(storage=url, study_name="theirs")
    foreign.tell(foreign.ask(), 1.0)
    with pytest.raises(StudyError, match=r"study 'theirs' was not made by ssd tune \(it has 1 trials"):
        open_study(url, "theirs", {"model": "ssd_tiny"}, seed=0, startup_trials=2)


# --- trials with a fake trainer -------------------------------------------------------------------------------

SPACE = {"lr": {"low": 0.001, "high": 0.1, "log": True}, "augment": {"choices": ["light", "none"]}}


class FakeTrainer:
    """What TrialPruning reads and calls of a Trainer."""

    def __init__(self):
        self.epoch, self.stopped = 0, None

    def stop(self, reason):
        self.stopped = reason


class FakeTrain:
    """A trial function: the run's best mAP is its lr (so the best trial is the largest lr); ``fail`` trial calls
    raise, ``maps`` reports per-epoch values to the callbacks (for pruning); every call's config is kept."""

    def __init__(self, fail=(), maps=None, interrupt=None, epoch_seconds=1.0):
        self.calls, self.fail, self.maps, self.interrupt = [], fail, maps, interrupt
        self.epoch_seconds = epoch_seconds

    def __call__(self, config, callbacks=()):
        index = len(self.calls)
        self.calls.append(config)
        if index == self.interrupt:
            raise KeyboardInterrupt
        if index in self.fail:
            raise NonFiniteLossError("the loss became nan at epoch 1, step 3")
        trainer, history = FakeTrainer(), []
        for epoch, value in enumerate((self.maps or {}).get(index, [config.lr])):
            trainer.epoch = epoch
            history.append({"epoch": epoch + 1, "time": (epoch + 1) * self.epoch_seconds})
            for callback in callbacks:
                if isinstance(callback, TrialPruning):
                    callback.on_val_end(trainer, {"map": value})
        return TrainResult(Path(config.project) / config.name, config.lr, {}, history or [{"time": 1.0}])


@pytest.fixture(scope="module")
def empty_study_db(tmp_path_factory):
    """An SQLite file with Optuna's tables and no study: copied for each test instead of made again (seconds)."""
    path = tmp_path_factory.mktemp("template") / "study.db"
    optuna.delete_study(study_name="x", storage=optuna.create_study(storage=sqlite_url(path), study_name="x")._storage)
    return path


@pytest.fixture
def storage(empty_study_db, tmp_path):
    shutil.copy(empty_study_db, tmp_path / "study.db")
    return sqlite_url(tmp_path / "study.db")


@pytest.fixture
def tune_files(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({k: v for k, v in TINY_TRAIN.items() if k != "model"}))
    return space, base


def run_tune(shapes, tmp_path, tune_files, fake, time=10, **options):
    space, base = tune_files
    config = TuneConfig(data=str(shapes), model="ssd_tiny", time=time, space=space, config=base,
                        project=tmp_path / "runs", **options)
    return tune(config, train_fn=fake)


def read_trials(run_dir):
    with open(run_dir / "trials.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_failed_trial_is_recorded_and_the_search_goes_on(shapes, tmp_path, tune_files, storage):
    fake = FakeTrain(fail={1})
    result = run_tune(shapes, tmp_path, tune_files, fake, trials=3, storage=storage)
    assert result.states == {"COMPLETE": 2, "FAIL": 1}
    rows = read_trials(result.run_dir)
    assert [row["state"] for row in rows] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert rows[1]["reason"] == "NonFiniteLossError: the loss became nan at epoch 1, step 3"
    assert rows[1]["run_dir"] == str(result.run_dir / "trials" / "trial1")
    best = max((c for i, c in enumerate(fake.calls[:3]) if i != 1), key=lambda c: c.lr)
    assert result.best_params == {"lr": best.lr, "augment": best.augment} and result.best_map == best.lr
    final = fake.calls[3]  # the final training: the best options into the run directory itself
    assert (final.lr, final.augment, Path(final.project) / final.name) == (best.lr, best.augment, result.run_dir)
    assert final.exist_ok and 0 < final.time <= 10 and all(c.time <= 10 * 0.7 / 3 for c in fake.calls[:3])
    winning = TrainConfig.from_yaml(result.run_dir / "config.yaml")  # what ssd train --config reads
    assert (winning.lr, winning.augment, winning.model, winning.batch_size) == (best.lr, best.augment, "ssd_tiny", 8)
    assert (winning.project, winning.name, winning.exist_ok) == ("runs/train", "exp", False)
    assert yaml.safe_load((result.run_dir / "space.yaml").read_text()) == SPACE
    assert (result.run_dir / "trials.png").read_bytes()[:4] == b"\x89PNG"


def test_the_first_trial_of_a_new_study_is_the_defaults(shapes, tmp_path, tune_files, storage):
    fake = FakeTrain()
    run_tune(shapes, tmp_path, tune_files, fake, trials=2, storage=storage)
    defaults = TrainConfig(**TINY_TRAIN).resolved()
    first, second = fake.calls[:2]
    assert (first.lr, first.augment) == (defaults.lr, "none")  # both held by SPACE: the trial is ssd train's run
    assert second.lr != defaults.lr  # then the sampler


def test_trials_too_short_for_five_epochs_are_lengthened(shapes, tmp_path, tune_files, storage, ssd_messages):
    fake = FakeTrain(epoch_seconds=60)  # each trial trains one epoch of a minute
    run_tune(shapes, tmp_path, tune_files, fake, trials=3, storage=storage)
    assert [round(c.time, 2) for c in fake.calls[:3]] == [2.33, 5.0, 5.0]  # 10 min * 0.7 / 3, then 5 epochs
    said = ("ssd tune: an epoch of this data takes 1.00 min, so trials of 2.33 min would be ranked after 2.3 epochs: "
            "they get 5.00 min (5 epochs) each, fewer of them")
    assert any(message.startswith(said) for message in ssd_messages())


def test_with_no_time_for_a_second_trial_the_defaults_are_trained(shapes, tmp_path, tune_files, storage):
    fake = FakeTrain(epoch_seconds=60)
    result = run_tune(shapes, tmp_path, tune_files, fake, storage=storage, time=6)  # 4.2 min of search: one trial
    first, final = fake.calls
    assert (final.lr, final.augment) == (first.lr, first.augment) == (TrainConfig(**TINY_TRAIN).resolved().lr, "none")
    assert result.states == {"COMPLETE": 1} and final.time > 1.5


@pytest.mark.parametrize("param, value, held", [
    (Param("lr", 0.001, 0.1, log=True), 0.003, True), (Param("lr", 0.001, 0.1), 0.2, False),
    (Param("close_mosaic", 0, 10, step=2), 4, True), (Param("close_mosaic", 0, 10, step=2), 3, False),
    (Param("ema", choices=(False, True)), False, True), (Param("mosaic", choices=(0.0, 0.5)), 0.5, True),
    (Param("augment", choices=("ssd", "light")), "none", False), (Param("priors", choices=(None, "auto")), None, True),
])
def test_a_default_the_space_cannot_take_is_left_to_the_sampler(param, value, held):
    assert param.holds(value) is held
    assert default_params([param], TrainConfig(model="ssd_tiny", **{param.name: value})) == (
        {param.name: value} if held else {})


def test_a_choice_is_held_by_value_but_a_flag_is_not_a_number():
    assert Param("mosaic", choices=(0.0, 0.5)).holds(0) and not Param("mosaic", choices=(0.0, 0.5)).holds(False)
    assert not Param("lr", 0.001, 0.1).holds(True) and not Param("ema", choices=(0, 1)).holds(True)


def test_a_trial_below_the_median_at_an_epoch_is_pruned(shapes, tmp_path, tune_files, storage):
    fake = FakeTrain(maps={0: [0.5, 0.6], 1: [0.5, 0.7], 2: [0.5, 0.1]})  # trial 2 falls behind at epoch 2
    result = run_tune(shapes, tmp_path, tune_files, fake, trials=3, storage=storage)
    rows = read_trials(result.run_dir)
    assert [row["state"] for row in rows] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert rows[2]["reason"] == ("pruned after epoch 2: mAP 0.1000 below the median of the earlier trials at that "
                                 "epoch")


def test_every_trial_failing_is_an_error_naming_the_reason(shapes, tmp_path, tune_files, storage):
    with pytest.raises(StudyError, match="no trial completed .2 ran: NonFiniteLossError: the loss became nan"):
        run_tune(shapes, tmp_path, tune_files, FakeTrain(fail={0, 1}), trials=2, storage=storage)


def test_an_interrupted_tune_resumes(shapes, tmp_path, tune_files, monkeypatch):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a process id that no longer runs: the killed tune's
    monkeypatch.setattr(tune_module, "OWNER", f"{socket.gethostname()}:{ended.pid}")
    with pytest.raises(KeyboardInterrupt):
        run_tune(shapes, tmp_path, tune_files, FakeTrain(interrupt=1), trials=3)
    run_dir = tmp_path / "runs" / "exp"
    assert (run_dir / "study.db").is_file() and not (run_dir / "trials.csv").exists()
    monkeypatch.undo()
    result = run_tune(shapes, tmp_path, tune_files, FakeTrain(), trials=2, resume=run_dir, name="other")
    assert result.run_dir == run_dir
    rows = read_trials(run_dir)
    assert [(row["trial"], row["state"]) for row in rows] == [("0", "COMPLETE"), ("1", "FAIL"), ("2", "COMPLETE"),
                                                              ("3", "COMPLETE")]
    assert rows[1]["reason"] == "interrupted (its tune process ended)"  # and the study kept its name, exp


@pytest.mark.slow
def test_two_processes_share_one_sqlite_study(shapes, tmp_path, tune_files):
    """Two ssd tune processes, one trial each of real ssd train runs on the shapes, in one SQLite study."""
    space, base = tune_files
    url = sqlite_url(tmp_path / "shared.db")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    processes = [subprocess.Popen([sys.executable, "-m", "ssd", "tune", "--data", str(shapes), "--model", "ssd_tiny",
                                   "--time", "0.3", "--trials", "1", "--space", str(space), "--config", str(base),
                                   "--storage", url, "--name", "shared", "--project", str(tmp_path / side)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for side in ("a", "b")]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0, 0], outputs
    study = optuna.load_study(study_name="shared", storage=url)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE"]
    assert {str(Path(t.user_attrs["run_dir"]).parent) for t in study.trials} == {
        str(tmp_path / side / "shared" / "trials") for side in ("a", "b")}
    for side in ("a", "b"):
        assert (tmp_path / side / "shared" / "weights" / "best.pt").is_file()
        assert (tmp_path / side / "shared" / "config.yaml").is_file()


def test_cli_refuses_a_bad_space_or_budget_before_any_run_directory(shapes, tmp_path, capsys):
    from ssd.cli import main

    space = tmp_path / "space.yaml"
    space.write_text("lrr: {low: 0.001, high: 0.1}\n")
    args = ["tune", "--data", str(shapes), "--model", "ssd_tiny", "--project", str(tmp_path / "runs")]
    assert main([*args, "--time", "5", "--space", str(space)]) == 1
    assert f"error: {space}: lrr: not an option ssd tune searches; did you mean 'lr'" in capsys.readouterr().err
    assert main([*args, "--time", "0.1", "--trials", "5"]) == 2
    assert "error: ssd tune: --time 0.1 is too short" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
