"""Nothing of the user's is overwritten: every command that writes refuses, before any work, an output that is one of
its inputs (the same file, links included) or of the wrong kind; every file is written whole or not at all."""

import errno
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from ssd.cli import main
from ssd.errors import OutputError
from ssd.files import NAME_MAX, atomic_write, check_output, check_outputs, fitted_name, write_text


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    from ssd.models import build_model
    from ssd.weights.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build_model("ssd_tiny", class_names=["circle", "square", "triangle"]).eval()
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", model)


@pytest.fixture()
def photos(tmp_path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for i in range(2):
        Image.new("RGB", (64, 48), (40 * i, 90, 200)).save(source / f"a{i}.jpg")
    return source


@pytest.fixture()
def yolo(tmp_path) -> Path:
    """A YOLO dataset described by data.yaml: two 64x64 images with one box each, train and val (not
    builders.make_dataset: its class names are those of ``weights``)."""
    root = tmp_path / "yolo"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64, 64), (10, 20 * i, 30)).save(root / "images" / split / f"{split}{i}.png")
            (root / "labels" / split / f"{split}{i}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    (root / "data.yaml").write_text("names: [circle, square, triangle]\ntrain: images/train\nval: images/val\n")
    return root


def snapshot(*roots: Path) -> dict[Path, bytes]:
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*"))) if p.is_file()]
    return {p: p.read_bytes() for p in files}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------------------------------------ the guard itself
def test_output_guard_catches_hard_links_and_symlinks(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("keep me")
    os.link(source, tmp_path / "hard.txt")
    (tmp_path / "soft.txt").symlink_to(source)
    for alias in ("in.txt", "hard.txt", "soft.txt"):
        with pytest.raises(OutputError, match=f"output .*{alias} is the input .*in.txt \\(the same file\\)"):
            check_output(tmp_path / alias, inputs=[source])
    assert check_output(tmp_path / "new.txt", inputs=[source, None]) == tmp_path / "new.txt"


def test_output_guard_refuses_the_wrong_kind(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="--save-json .* is a directory; give a file name"):
        check_output(tmp_path, what="--save-json")
    with pytest.raises(OutputError, match="--save-dir .*file is an existing file; give a directory"):
        check_output(tmp_path / "file", kind="dir", what="--save-dir")
    with pytest.raises(OutputError, match="file is a file, not a directory"):
        check_output(tmp_path / "file" / "out.json")
    os.link(tmp_path / "file", tmp_path / "b.txt")
    with pytest.raises(OutputError, match="b.txt is the input .*file"):
        check_outputs([tmp_path / "a.txt", tmp_path / "b.txt"], inputs=[tmp_path / "file"])


# ------------------------------------------------------------------------------------------------ the atomic writer
def test_names_derived_from_long_user_names_fit_name_max_and_stay_distinct(tmp_path):
    assert fitted_name("img", ".jpg") == "img.jpg"  # a name that fits is kept as it is
    stems = ["x" * 300 + "a", "x" * 300 + "b", "é" * 200, "\udcff" * 300]  # ASCII, 2-byte UTF-8, undecodable bytes
    names = [fitted_name(f"001_{stem}", ".jpg") for stem in stems]
    assert len(set(names)) == 4 and all(n.endswith(".jpg") and len(os.fsencode(n)) <= NAME_MAX for n in names)
    assert len(names[0].encode()) == NAME_MAX and names[2][:-21].strip("é") == "001_"  # cut between characters
    for name in names:
        write_text(tmp_path / name, "ok")  # its temporary fits too
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_atomic_write_of_a_250_byte_name_fits_its_temporary(tmp_path):
    name = "y" * 246 + ".txt"
    write_text(tmp_path / name, "ok")
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_atomic_write_replaces_whole_and_keeps_permissions(tmp_path):
    target = tmp_path / "deep" / "out.json"
    write_text(target, "first")
    target.chmod(0o640)
    write_text(target, "second")
    assert target.read_text() == "second" and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "disk full"),
                                         (errno.EFBIG, "file too large for the file-size limit")])
def test_full_disk_while_writing_is_one_line_and_keeps_the_previous_file(tmp_path, code, words):
    target = tmp_path / "last.pt"
    target.write_bytes(b"previous checkpoint")
    with pytest.raises(OutputError) as info, atomic_write(target) as f:
        f.write(b"x" * 100_000)
        raise OSError(code, os.strerror(code))  # what the file's write raises when the disk fills up
    name = errno.errorcode[code]
    assert str(info.value) == f"{words} while writing {target} ({name}): the previous file is intact"
    assert target.read_bytes() == b"previous checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_file_size_limit_in_a_real_process_leaves_nothing_partial(tmp_path):
    import subprocess
    import sys

    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from ssd.errors import OutputError\n"
        "from ssd.files import write_bytes\n"
        "try:\n"
        f"    write_bytes({str(tmp_path / 'big.bin')!r}, bytes(100_000))\n"
        "except OutputError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == f"file too large for the file-size limit while writing {tmp_path / 'big.bin'} (EFBIG)"
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ ssd predict
@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_predict_refuses_a_save_dir_file_linked_to_its_source_image(weights, photos, tmp_path, capsys, link):
    out = tmp_path / "out"
    out.mkdir()
    (os.link if link == "hard" else lambda a, b: Path(b).symlink_to(a))(photos / "a0.jpg", out / "a0.jpg")
    before = snapshot(photos)
    assert main(["predict", "--weights", str(weights), "--source", str(photos), "--save-dir", str(out),
                 "--exist-ok", "--device", "cpu"]) == 1
    line = one_error_line(capsys)
    assert f"{out / 'a0.jpg'} is the input {photos / 'a0.jpg'} (the same file)" in line
    assert snapshot(photos) == before
    assert sorted(p.name for p in out.iterdir()) == ["a0.jpg"]  # nothing written: refused before the work


def test_predict_save_dir_naming_an_existing_file_is_one_line(weights, photos, tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    assert main(["predict", "--weights", str(weights), "--source", str(photos), "--save-dir",
                 str(tmp_path / "taken"), "--device", "cpu"]) == 1
    assert one_error_line(capsys) == f"error: --save-dir {tmp_path / 'taken'} is an existing file; give a directory"
    assert (tmp_path / "taken").read_text() == "mine"


def test_predict_writes_whole_images_and_json(weights, photos, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["predict", "--weights", str(weights), "--source", str(photos), "--save-dir", str(out),
                 "--device", "cpu"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".ssd-predict", "a0.jpg", "a1.jpg", "predictions.json",
                                                     "predictions.jsonl"]
    assert Image.open(out / "a1.jpg").size == (64, 48)


# ------------------------------------------------------------------------------------------------ ssd val
@pytest.mark.parametrize("target", ["data.yaml", "label", "weights", "directory"])
def test_val_save_json_refuses_an_input_or_a_folder_before_evaluating(weights, yolo, tmp_path, capsys, monkeypatch,
                                                                      target):
    import ssd.evaluation.evaluator as evaluator

    monkeypatch.setattr(evaluator, "evaluate_split", lambda *a, **k: pytest.fail("evaluated before refusing"))
    path = {"data.yaml": yolo / "data.yaml", "label": yolo / "labels" / "val" / "val0.txt", "weights": weights,
            "directory": tmp_path}[target]
    before = snapshot(yolo, weights)
    assert main(["val", "--weights", str(weights), "--data", str(yolo / "data.yaml"), "--save-json", str(path),
                 "--device", "cpu"]) == 1
    line = one_error_line(capsys)
    assert line.startswith(f"error: --save-json {path} ")
    assert ("is a directory" in line) if target == "directory" else ("(the same file)" in line)
    assert snapshot(yolo, weights) == before


# ------------------------------------------------------------------------------------------------ ssd check
def test_check_priors_out_refuses_the_data_yaml(yolo, capsys):
    before = snapshot(yolo)
    assert main(["check", str(yolo / "data.yaml"), "--model", "ssd_tiny", "--fit-priors", "--priors-out",
                 str(yolo / "data.yaml")]) == 1
    assert one_error_line(capsys) == (f"error: --priors-out {yolo / 'data.yaml'} is the input {yolo / 'data.yaml'} "
                                      "(the same file); choose another --priors-out so the input is kept")
    assert snapshot(yolo) == before


# ------------------------------------------------------------------------------------------------ ssd export
@pytest.mark.parametrize("target", ["weights", "hard link", "directory", "json"])
def test_export_output_refuses_the_weights_a_folder_and_other_files(weights, tmp_path, capsys, target):
    path = {"weights": weights, "hard link": tmp_path / "w.onnx", "directory": tmp_path,
            "json": tmp_path / "x.json"}[target]
    if target == "hard link":
        os.link(weights, path)
    if target == "json":
        path.write_text('{"mine": 1}')
    before = snapshot(weights, tmp_path)
    assert main(["export", "--weights", str(weights), "--output", str(path), "--no-check"]) == 1
    line = one_error_line(capsys)
    expected = {"weights": "(the same file)", "hard link": "(the same file)", "directory": "is a directory",
                "json": "of the onnx export must end in .onnx (--output)"}[target]
    assert line.startswith("error: ") and str(path) in line and expected in line
    assert snapshot(weights, tmp_path) == before


# ------------------------------------------------------------------------------------------------ property
COMMANDS = ["predict", "val", "check", "export"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(COMMANDS), pick=st.integers(0, 10_000), how=st.sampled_from(["same", "hard", "sym"]))
def test_any_output_that_is_an_input_is_refused_and_inputs_stay_byte_identical(weights, tmp_path_factory, capsys,
                                                                               command, pick, how):
    root = tmp_path_factory.mktemp("prop")
    data = root / "yolo"
    (data / "images").mkdir(parents=True)
    (data / "labels").mkdir()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(data / "images" / "a.png")
    (data / "labels" / "a.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    (data / "data.yaml").write_text("names: [circle, square, triangle]\ntrain: images\nval: images\n")
    inputs = {"predict": [data / "images" / "a.png"],
              "val": [weights, data / "data.yaml", data / "images" / "a.png", data / "labels" / "a.txt"],
              "check": [data / "data.yaml", data / "images" / "a.png", data / "labels" / "a.txt"],
              "export": [weights]}[command]
    victim = inputs[pick % len(inputs)]
    output = victim
    if how != "same":
        output = root / f"link{victim.suffix}"
        (os.link if how == "hard" else lambda a, b: Path(b).symlink_to(a))(victim, output)
    before = snapshot(weights, data)
    argv = {"predict": ["predict", "--weights", str(weights), "--source", str(data / "images"), "--save-dir",
                        str(output.parent), "--exist-ok", "--device", "cpu"],
            "val": ["val", "--weights", str(weights), "--data", str(data / "data.yaml"), "--save-json", str(output),
                    "--device", "cpu"],
            "check": ["check", str(data / "data.yaml"), "--model", "ssd_tiny", "--fit-priors", "--priors-out",
                      str(output)],
            "export": ["export", "--weights", str(weights), "--output", str(output), "--no-check"]}[command]
    if command == "predict" and how != "same":  # the drawn copy of a.png is <save-dir>/a.png: link that name
        output.unlink()
        output = root / "a.png"
        (os.link if how == "hard" else lambda a, b: Path(b).symlink_to(a))(victim, output)
        argv[argv.index("--save-dir") + 1] = str(root)
    assert main(argv) == 1
    assert "(the same file)" in one_error_line(capsys)
    assert snapshot(weights, data) == before


# ------------------------------------------------------------------------------------------------ run directories
def test_second_run_into_a_locked_run_directory_is_refused(tmp_path):
    from ssd.files import DirectoryLock

    first = DirectoryLock(tmp_path)
    with pytest.raises(OutputError, match=f"run directory {tmp_path} is in use by another run \\(it holds "
                                          f"{tmp_path / '.ssd.lock'}\\); wait for it to finish or choose another"):
        DirectoryLock(tmp_path)
    first.release()
    first.release()  # twice is harmless
    DirectoryLock(tmp_path).release()


def test_lock_held_by_another_process_is_seen(tmp_path):
    import subprocess
    import sys

    from ssd.files import DirectoryLock

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from ssd.files import DirectoryLock\n"
        f"lock = DirectoryLock({str(tmp_path)!r}); print('locked', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match="is in use by another run"):
            DirectoryLock(tmp_path)
    finally:
        holder.communicate("")
    DirectoryLock(tmp_path).release()  # the holder's exit released it


def test_train_project_naming_an_existing_file_is_one_line(tmp_path, capsys):
    from ssd.files import make_run_dir

    (tmp_path / "runs").write_text("mine")
    with pytest.raises(OutputError, match="project folder .*runs is an existing file; give a directory"):
        make_run_dir(tmp_path / "runs", "exp")
    assert (tmp_path / "runs").read_text() == "mine"


@pytest.mark.slow
def test_torch_save_on_a_full_disk_is_one_line_naming_the_disk(tmp_path):
    import subprocess
    import sys

    script = (
        "import resource, signal, torch\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "from ssd.errors import OutputError\n"
        "from ssd.files import atomic_write\n"
        f"path = {str(tmp_path / 'last.pt')!r}\n"
        "torch.save({'epoch': 1}, path)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "try:\n"
        "    with atomic_write(path) as f:\n"
        "        torch.save({'w': torch.zeros(100_000)}, f)\n"  # torch turns the EFBIG into a RuntimeError
        "except OutputError as e:\n"
        "    print(e)\n"
        "print(torch.load(path, weights_only=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines() == [f"file too large for the file-size limit while writing {tmp_path / 'last.pt'} "
                                       "(EFBIG): the previous file is intact", "{'epoch': 1}"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.slow
def test_predict_on_a_full_disk_is_one_line_and_leaves_no_partial_image(weights, tmp_path):
    import json
    import subprocess
    import sys

    import numpy as np

    source = tmp_path / "src"
    source.mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    Image.fromarray(noise).save(source / "big.png")  # about 900 kB drawn again: over the 200 kB limit
    out = tmp_path / "out"
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
        "from ssd.cli import main\n"
        f"sys.exit(main(['predict', '--weights', {str(weights)!r}, '--source', {str(source)!r}, '--save-dir', "
        f"{str(out)!r}, '--device', 'cpu']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    errors = [line[line.index("error: "):] for line in done.stderr.splitlines() if "error: " in line]  # after a bar
    assert errors == [f"error: file too large for the file-size limit while writing {out / 'big.png'} (EFBIG)"]
    # no partial image; the result streamed before the drawing failed is kept, whole
    assert sorted(p.name for p in out.iterdir()) == [".ssd-predict", "predictions.json", "predictions.jsonl"]
    records = json.loads((out / "predictions.json").read_text())["images"]
    assert [r["file"] for r in records] == [str(source / "big.png")]


def test_exist_ok_run_directory_naming_a_file_is_refused_not_renamed(tmp_path):
    from ssd.files import make_run_dir

    (tmp_path / "exp").write_text("mine")
    with pytest.raises(OutputError, match="run directory .*exp is an existing file; give a directory"):
        make_run_dir(tmp_path, "exp", exist_ok=True)
    assert make_run_dir(tmp_path, "exp") == tmp_path / "exp2"  # without --exist-ok: the next free name
    assert (tmp_path / "exp").read_text() == "mine"
