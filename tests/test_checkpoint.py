"""Checkpoints: round trips, atomic writes, weights_only safety, clear refusals, fine-tuning to new classes."""

import logging
import os
import pickle
import re

import numpy as np
import pytest
import torch
from torch import nn

import ssd
from ssd import CheckpointError, build_model, load_checkpoint, model_from_checkpoint, save_checkpoint
from ssd.errors import BackboneWeightsError, OutputError
from ssd.files import remove_stale_temporaries
from ssd.weights.checkpoint import FORMAT


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = build_model("ssd_tiny", class_names=["cat", "dog", "bird"], image_size=128)
    with torch.no_grad():  # non-default BatchNorm statistics, so that buffers are checked too
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return net.eval()


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    save_checkpoint(path, model)
    return path


def outputs(net, seed=1):
    x = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return net.eval()(x)


@pytest.mark.slow
def test_round_trip_gives_identical_outputs(model, saved):
    ckpt = load_checkpoint(saved)
    assert ckpt["format"] == FORMAT and ckpt["version"] == ssd.__version__
    assert ckpt["class_names"] == ["cat", "dog", "bird"] and ckpt["config"] == model.config.to_dict()
    restored = model_from_checkpoint(saved)
    assert restored.class_names == model.class_names and restored.config == model.config
    assert torch.equal(restored.priors, model.priors)
    for ours, theirs in zip(outputs(model), outputs(restored)):
        assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_training_state_round_trip(model, tmp_path):
    net = build_model("ssd_tiny", 2, image_size=64)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=10)
    sum(o.sum() for o in net(torch.rand(2, 3, 64, 64))).backward()
    optimizer.step()
    scheduler.step()
    rng = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64))}
    path = save_checkpoint(tmp_path / "run" / "last.pt", net, optimizer=optimizer.state_dict(),
                           scheduler=scheduler.state_dict(), epoch=4, rng=rng, metrics={"map": 0.5},
                           train_config={"model": "ssd_tiny", "lr": None})
    assert path == tmp_path / "run" / "last.pt"
    ckpt = load_checkpoint(path)
    assert ckpt["epoch"] == 4 and ckpt["metrics"] == {"map": 0.5} and ckpt["train_config"]["lr"] is None
    assert torch.equal(ckpt["rng"]["torch"], rng["torch"])
    fresh = torch.optim.AdamW(net.parameters(), lr=1e-3)
    fresh.load_state_dict(ckpt["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert ckpt["scheduler"]["last_epoch"] == 1


@pytest.mark.slow
def test_wrapped_and_channels_last_models_save_the_inner_model(model, tmp_path):
    inner = build_model("ssd_tiny", class_names=["cat", "dog", "bird"], image_size=128)
    inner.load_state_dict(model.state_dict())
    inner.to(memory_format=torch.channels_last)
    save_checkpoint(tmp_path / "c.pt", nn.DataParallel(inner))  # as DDP: the model is .module
    ckpt = load_checkpoint(tmp_path / "c.pt")
    assert not any(k.startswith("module.") for k in ckpt["model"]) and ckpt["class_names"] == ["cat", "dog", "bird"]
    for ours, theirs in zip(outputs(model), outputs(model_from_checkpoint(ckpt))):
        torch.testing.assert_close(ours, theirs)


def test_save_is_atomic(model, saved, tmp_path, monkeypatch):
    path = tmp_path / "keep.pt"
    save_checkpoint(path, model, epoch=1)
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"PK partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OutputError, match=r"disk full while writing .*keep\.pt: the previous file is intact"):
        save_checkpoint(path, model, epoch=2)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.pt"]  # no temporary file left behind


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_checkpoints_get_the_permissions_of_any_new_file(model, tmp_path):
    old = os.umask(0o022)
    try:
        assert save_checkpoint(tmp_path / "a.pt", model).stat().st_mode & 0o777 == 0o644
        os.umask(0o027)
        assert save_checkpoint(tmp_path / "b.pt", model).stat().st_mode & 0o777 == 0o640
        (tmp_path / "a.pt").chmod(0o600)  # a file being replaced keeps its own permissions
        assert save_checkpoint(tmp_path / "a.pt", model, epoch=2).stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    assert load_checkpoint(tmp_path / "a.pt")["epoch"] == 2


def test_cleanup_after_a_killed_save_removes_its_temporary_but_not_the_users_tmp_files(model, tmp_path,
                                                                                       monkeypatch):
    seen = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: (seen.extend(os.listdir(tmp_path)), real_save(obj, f)))
    save_checkpoint(tmp_path / "last.pt", model)
    monkeypatch.undo()
    (temporary,) = seen  # the name save_checkpoint used while writing, which a kill would leave behind
    assert temporary.startswith(".last.pt.") and temporary.endswith(".ssdtmp")
    assert len(temporary) == len(".last.pt..ssdtmp") + 8

    weights = tmp_path / "weights"
    weights.mkdir()
    users = [".notes.txt.mynotes1.tmp", ".best.pt.ab_12xyz.tmp", ".my model.pth.a1b2c3d4.tmp", "notes.tmp"]
    for name in [temporary, *users, "last.pt"]:
        (weights / name).write_bytes(b"PK partial")
    assert remove_stale_temporaries(weights) == [weights / temporary]  # what `ssd train` does when it starts
    assert sorted(os.listdir(weights)) == sorted([*users, "last.pt"])


def test_extras_must_be_weights_only_loadable(model, tmp_path):
    path = tmp_path / "x.pt"
    with pytest.raises(TypeError, match=r"rng\['numpy'\]\[1\] is a numpy\.ndarray.*convert arrays"):
        save_checkpoint(path, model, rng={"numpy": np.random.get_state()})
    with pytest.raises(TypeError, match=r"train_config is a pathlib"):
        save_checkpoint(path, model, train_config=tmp_path)
    with pytest.raises(ValueError, match=r"extra key\(s\) \['config'\] are reserved"):
        save_checkpoint(path, model, config={})
    assert not path.exists() and os.listdir(tmp_path) == []


def test_missing_and_truncated_files_are_refused(saved, tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.pt does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="is not a file"):
        load_checkpoint(tmp_path)
    data = saved.read_bytes()
    for size in (len(data) // 2, len(data) - 30, 100):
        cut = tmp_path / f"cut{size}.pt"
        cut.write_bytes(data[:size])
        with pytest.raises(CheckpointError, match=rf"cut{size}\.pt is truncated \({size} bytes"):
            load_checkpoint(cut)
        with pytest.raises(CheckpointError, match="truncated"):
            model_from_checkpoint(cut)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt \(0 bytes\) is corrupt or not a PyTorch file"):
        load_checkpoint(empty)
    binary = tmp_path / "noise.pt"
    binary.write_bytes(bytes(range(3, 200)))
    with pytest.raises(CheckpointError, match=r"noise\.pt \(197 bytes\) is corrupt or not a PyTorch file"):
        load_checkpoint(binary)


@pytest.mark.parametrize("text", ["hello", "cat\ndog\n", "names:\n  - cat\n", '{"format": "ssd-checkpoint-v1"}\n'],
                         ids=["word", "class-list", "yaml", "json"])
def test_a_text_file_given_as_weights_is_not_called_code(tmp_path, text):
    """`cat\\ndog` reads as a pickle GLOBAL opcode to torch.load: the refusal says what the file is, not that it
    could execute code."""
    path = tmp_path / "classes.txt"
    path.write_text(text)
    first = text.split("\n")[0]
    with pytest.raises(CheckpointError, match=rf"classes\.txt is not a weights file: it looks like text "
                                              rf"\({len(text)} bytes, starting '{re.escape(first)}'\)$") as refused:
        model_from_checkpoint(path)
    assert "execute" not in str(refused.value)


def test_a_text_protocol_pickle_is_still_refused_as_code(tmp_path):
    path = tmp_path / "model.pkl"
    path.write_bytes(b"cos\nsystem\n(S'true'\ntR.")  # pickle protocol 0: printable, but a call to os.system
    with pytest.raises(CheckpointError, match=r"model\.pkl is refused: loading it could execute code"):
        load_checkpoint(path)


def test_foreign_files_are_refused(model, tmp_path):
    plain = tmp_path / "state.pth"
    torch.save(model.state_dict(), plain)
    with pytest.raises(CheckpointError, match=r"state\.pth is not an ssd checkpoint: it holds the state dict of an "
                                              r"ssd model without its configuration and class names \(keys priors "
                                              r"\[1364, 4\], backbone\..*\); rebuild the model with "
                                              r"ssd\.build_model\(\.\.\.\) and load_state_dict\(\)$"):
        load_checkpoint(plain)
    pickled = tmp_path / "module.pth"
    torch.save(nn.Linear(2, 2), pickled)  # a whole pickled module: weights_only refuses to run its code
    with pytest.raises(CheckpointError, match=r"module\.pth is refused: loading it could execute code \(it refers to "
                                              r"torch\.nn\.modules\.linear\.Linear;.*not a checkpoint of this library"
                       ) as refused:
        load_checkpoint(pickled)
    assert "weights_only" not in str(refused.value) and "trust" not in str(refused.value)  # no advice to load it
    other = tmp_path / "other.pt"
    torch.save({"epoch": 3, "weights": [1, 2]}, other)
    with pytest.raises(CheckpointError, match=r"other\.pt is not an ssd checkpoint: it holds no weights \(keys "
                                              r"'epoch', 'weights' \(2 in all\)\); give a checkpoint of this library "
                                              r"or a detector ssd imports$"):
        load_checkpoint(other)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match=r"raw\.pkl is refused: loading it could execute code \(it holds pickled "
                                              r"content other than plain data") as refused:
        load_checkpoint(raw)
    assert "weights_only" not in str(refused.value)


def test_a_detector_or_backbone_given_as_a_checkpoint_is_named_with_where_it_goes(tmp_path):
    detector = {"vgg.0.weight": torch.zeros(1), "loc.0.weight": torch.zeros(1), "conf.0.weight": torch.zeros(1)}
    torch.save(detector, tmp_path / "ssd300_VOC.pth")
    with pytest.raises(CheckpointError, match=r"ssd300_VOC\.pth is not an ssd checkpoint: it holds a detector of the "
                                              r"ssd\.pytorch format \(VGG16 backbone\); give it to weights= "
                                              r"\(--weights\), which imports it, or convert it once with `ssd "
                                              r"import`$"):
        load_checkpoint(tmp_path / "ssd300_VOC.pth")
    torch.save({f"{i}.weight": torch.zeros(1) for i in (0, 31, 33)}, tmp_path / "vgg16_reducedfc.pth")
    with pytest.raises(CheckpointError, match=r"vgg16_reducedfc\.pth is not an ssd checkpoint: it holds a "
                                              r"vgg16_reducedfc backbone; train a detector from it with "
                                              r"backbone_weights= \(--backbone-weights\)$"):
        load_checkpoint(tmp_path / "vgg16_reducedfc.pth")


def test_a_checkpoint_given_as_backbone_weights_is_named_with_where_it_goes(saved):
    with pytest.raises(BackboneWeightsError, match=r"model\.pt is not a backbone: it holds an ssd checkpoint; give "
                                                   r"it to weights= \(--weights\) or ssd\.model_from_checkpoint as "
                                                   r"it is$"):
        build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights=saved)


def test_different_class_names_are_refused_with_both_lists(saved):
    with pytest.raises(CheckpointError, match=r"trained for 3 classes \['cat', 'dog', 'bird'\] but the class names "
                                              r"given are 2 classes \['apple', 'pear'\]; pass reinit_heads=True"):
        model_from_checkpoint(saved, class_names=["apple", "pear"])
    with pytest.raises(CheckpointError, match="the same names in another order"):
        model_from_checkpoint(saved, class_names=["dog", "cat", "bird"])


@pytest.mark.slow
def test_reinit_heads_keeps_everything_but_the_class_rows(model, saved, caplog):
    with caplog.at_level(logging.WARNING, logger="ssd"):
        tuned = model_from_checkpoint(saved, class_names=["apple", "Dog"], reinit_heads=True)
    assert "fine-tuning from 3 classes to 2" in caplog.text
    assert "class rows carried over for 1 (Dog <- dog); initialised for 1 (apple)" in caplog.text
    assert tuned.class_names == ["apple", "Dog"] and tuned.num_classes == tuned.config.num_classes == 2
    old, new = model.state_dict(), tuned.state_dict()
    assert set(old) == set(new)
    for key in old:
        if ".cls." in key:  # 4 boxes x (2+1) outputs instead of 4 x (3+1): background and dog rows carried over
            rows_old, rows_new = old[key].unflatten(0, (4, 4)), new[key].unflatten(0, (4, 3))
            assert torch.equal(rows_new[:, 0], rows_old[:, 0]) and torch.equal(rows_new[:, 2], rows_old[:, 2]), key
            assert not torch.equal(rows_new[:, 1], rows_old[:, 1]), key
        else:
            assert torch.equal(new[key], old[key]), key
    loc, logits = outputs(tuned)
    assert torch.equal(loc, outputs(model)[0]) and logits.shape[-1] == 3
    torch.testing.assert_close(logits[..., [0, 2]], outputs(model)[1][..., [0, 2]], rtol=0, atol=1e-5)


def test_reinit_heads_with_the_same_names_changes_nothing(model, saved):
    same = model_from_checkpoint(saved, class_names=["cat", "dog", "bird"], reinit_heads=True)
    for ours, theirs in zip(outputs(model), outputs(same)):
        assert torch.equal(ours, theirs)


def test_edited_checkpoints_are_refused(saved):
    ckpt = load_checkpoint(saved)
    unknown = {**ckpt, "config": {**ckpt["config"], "name": "ssd1000_resnet"}}
    with pytest.raises(CheckpointError, match=r"model named 'ssd1000_resnet'.*known: ssd300_vgg16"):
        model_from_checkpoint(unknown)
    with pytest.raises(CheckpointError, match="not an ssd checkpoint and fits none of the formats tried.*without its "
                                              "configuration"):
        model_from_checkpoint({"model": ckpt["model"]})
    damaged = {**ckpt, "model": {k: v for k, v in ckpt["model"].items() if k != "heads.0.loc.weight"}}
    with pytest.raises(CheckpointError, match=r"do not fit the model configuration.*heads\.0\.loc\.weight"):
        model_from_checkpoint(damaged)


@pytest.mark.parametrize("name, rule", [("cat\x1b[2J", "holds U+001B (a control character)"),
                                        ("\udc80", "holds a lone surrogate U+DC80")])
def test_checkpoint_whose_class_names_hold_a_terminal_escape_or_a_lone_surrogate_is_refused(saved, tmp_path, name,
                                                                                           rule):
    ckpt = load_checkpoint(saved)
    path = tmp_path / "edited.pt"
    torch.save({**ckpt, "class_names": [name, *ckpt["class_names"][1:]]}, path)
    with pytest.raises(CheckpointError) as info:
        model_from_checkpoint(path)
    assert str(info.value).startswith(f"{path}: the saved class names") and f"class_names[0] = {name!r} {rule}" in \
        str(info.value) and str(info.value).isprintable()
    with pytest.raises(ValueError, match=re.escape(f"class_names[0] = {name!r} {rule}")):
        build_model("ssd_tiny", class_names=[name])


@pytest.mark.parametrize("removed", [("priors",), ("mean", "std"), ("options", "priors", "mean")])
def test_a_config_lacking_settings_says_what_is_missing(saved, tmp_path, removed):
    """A checkpoint whose model configuration lacks settings (edited, or written by another program) is refused by
    name, with what can still be done, never with a KeyError."""
    ckpt = load_checkpoint(saved)
    config = {k: v for k, v in ckpt["config"].items() if k not in removed}
    path = torch.save({**ckpt, "config": config}, tmp_path / "edited.pt") or tmp_path / "edited.pt"
    required = [k for k in ("priors", "mean", "std") if k in removed]
    with pytest.raises(CheckpointError, match=rf"edited.pt: the model configuration lacks {', '.join(required)} "
                                              r"\(it has name, .*ssd.build_model"):
        model_from_checkpoint(path)
    if removed == ("options", "priors", "mean"):
        return
    lenient = {k: v for k, v in ckpt["config"].items() if k != "options"}  # optional settings take their defaults
    assert model_from_checkpoint({**ckpt, "config": lenient}).config.options == {}


def test_a_checkpoint_of_another_format_version_is_refused_with_what_to_do(saved, tmp_path):
    ckpt = load_checkpoint(saved)
    torch.save({**ckpt, "format": "ssd-checkpoint-v9", "version": "9.0"}, tmp_path / "future.pt")
    message = (rf"future\.pt has format 'ssd-checkpoint-v9' \(saved by ssd 9\.0\), but this version of ssd "
               rf"\({re.escape(ssd.__version__)}\) reads only '{FORMAT}' \(and the older 'ssd-checkpoint-v1'\): load "
               r"it with the version that saved it, or "
               r"import / train the model again with this one")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match=message):
        model_from_checkpoint(tmp_path / "future.pt")


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_whose_weights_are_not_finite_is_refused(saved, tmp_path, value):
    ckpt = load_checkpoint(saved)
    broken = {k: torch.full_like(v, value) if v.is_floating_point() and k != "priors" else v
              for k, v in ckpt["model"].items()}
    torch.save({**ckpt, "model": broken}, tmp_path / "diverged.pt")
    count = sum(1 for k, v in broken.items() if v.is_floating_point() and k != "priors")
    with pytest.raises(CheckpointError, match=rf"the weights in .*diverged\.pt hold NaN or infinite values in {count} "
                                              rf"of {len(broken)} tensors \(backbone\..*more\)\): the training "
                                              "diverged or the file is damaged; use an earlier checkpoint"):
        model_from_checkpoint(tmp_path / "diverged.pt")
    one = {**ckpt["model"], "heads.1.loc.bias": torch.full_like(ckpt["model"]["heads.1.loc.bias"], value)}
    with pytest.raises(CheckpointError, match=r"in 1 of \d+ tensors \(heads\.1\.loc\.bias\)"):
        model_from_checkpoint({**ckpt, "model": one})


def test_floating_point_weights_stored_as_integers_are_refused(saved, tmp_path):
    ckpt = load_checkpoint(saved)
    weights = {**ckpt["model"], "heads.0.loc.weight": (ckpt["model"]["heads.0.loc.weight"] * 100).long(),
               "heads.0.loc.bias": ckpt["model"]["heads.0.loc.bias"].to(torch.int32)}
    torch.save({**ckpt, "model": weights}, tmp_path / "integers.pt")
    with pytest.raises(CheckpointError, match=r"integers\.pt do not fit the model configuration saved with them .*"
                                              r"wrong types \(2\): heads\.0\.loc\.weight torch\.int64 \(expected "
                                              r"floating point\), heads\.0\.loc\.bias torch\.int32"):
        model_from_checkpoint(tmp_path / "integers.pt")


@pytest.mark.parametrize(("edit", "message"), [
    ({"class_names": ["cat", "dog"]}, r"the saved class names do not fit its model configuration \(edited\?\): "
                                      r"num_classes=3 but 2 class_names were given \['cat', 'dog'\]"),
    ({"class_names": ["cat", "cat", "bird"]}, r"class_names has duplicates \['cat'\]"),
    ({"config": {"image_size": 32}}, r"its model configuration does not build a ssd_tiny \(edited or damaged "
                                     r"checkpoint\?\): ssd_tiny at 32 px has feature maps"),
    ({"config": {"num_classes": "3"}}, r"num_classes must be an int >= 1 \(object classes, background "
                                       r"excluded\), got '3'"),
    ({"config": {"priors": {"feature_maps": [16]}}}, r"malformed model configuration \("),
], ids=["fewer-names", "duplicate-names", "image-size", "num-classes-text", "priors"])
def test_a_checkpoint_with_an_edited_configuration_is_refused_by_name(saved, tmp_path, edit, message):
    ckpt = load_checkpoint(saved)
    edited = {**ckpt, **{k: v for k, v in edit.items() if k != "config"},
              "config": {**ckpt["config"], **edit.get("config", {})}}
    torch.save(edited, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match=rf"edited\.pt.*({message})"):
        model_from_checkpoint(tmp_path / "edited.pt")
