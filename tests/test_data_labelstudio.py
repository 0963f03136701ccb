"""The Label Studio reader on an export shaped as Label Studio writes it (tests/data/labelstudio), and the loop
"ssd predict --format labelstudio, a person corrects the tasks, training reads them"."""

import json
import math
import shutil
from pathlib import Path

import pytest

from builders import TINY_TRAIN, write_image
from ssd.data import check_dataset, load_dataset
from ssd.data.gate import load_training_data
from ssd.data.labelstudio import image_names
from ssd.data.tools import tool_format
from ssd.errors import DataError
from ssd.inference.result_files import write_results
from ssd.training.trainer import train

FIXTURES = Path(__file__).parent / "data" / "labelstudio"


@pytest.fixture
def export(tmp_path):
    """The export beside ``cat.jpg`` (uploaded: ``0a1b2c3d-cat.jpg`` in the task) and ``photos/dog.png`` (a
    local-files URL); ``gone.jpg`` is missing, ``unseen.jpg`` was never annotated."""
    shutil.copy(FIXTURES / "export.json", tmp_path)
    write_image(tmp_path / "cat.jpg", 200, 100)
    write_image(tmp_path / "photos" / "dog.png", 100, 50)
    return tmp_path / "export.json"


@pytest.mark.parametrize("reference, names", [
    ("/data/upload/1/0a1b2c3d-cat.jpg", ["0a1b2c3d-cat.jpg", "cat.jpg"]),
    ("/data/upload/12/my-cat.jpg", ["my-cat.jpg"]),
    ("/data/local-files/?d=photos%2Fdog%20one.png", ["photos/dog one.png"]),
    ("http://localhost:8080/data/local-files/?d=a/b.jpg", ["a/b.jpg"]),
    ("s3://bucket/images/%C3%A9t%C3%A9.jpg", ["été.jpg"]),
    ("runs/predict/a.jpg", ["runs/predict/a.jpg"]),
])
def test_image_references(reference, names):
    assert image_names(reference) == names


def test_labelstudio_export(export):
    spec = load_dataset(export)
    assert spec.format == "labelstudio" and spec.class_names == ["cat", "dog"] and list(spec.splits) == ["train"]
    assert spec.sources == {"train": export}
    cat_image, dog_image = spec.splits["train"]
    assert cat_image.path == export.parent / "cat.jpg" and cat_image.image_id == 1
    cat, dog = cat_image.objects
    assert cat.box == (20.0, 20.0, 70.0, 70.0) and cat.label == 0
    assert cat.where == "export.json task 1 result Ab3xYz01 (cat)"
    assert dog.box == (80.0, 10.0, 100.0, 30.0) and dog.label == 1  # a quarter turn about the top-left corner
    assert dog_image.path == export.parent / "photos" / "dog.png" and (dog_image.width, dog_image.height) == (100, 50)
    polygon, rotated = dog_image.objects
    assert polygon.box == (10.0, 5.0, 50.0, 40.0)
    assert rotated.box == pytest.approx((-2.5, 0.0, 10 * math.cos(math.pi / 6), 5 * math.cos(math.pi / 6) + 5))
    by_code = {}
    for issue in spec.issues:
        by_code.setdefault(issue.code, []).append(issue)
    assert sorted(by_code) == ["missing_image", "not_annotated", "polygon_as_box", "rotated_box", "shape_not_read"]
    [missing] = by_code["missing_image"]
    assert missing.message == (f"export.json task 4: image '/data/upload/1/12345678-gone.jpg' not found (looked for "
                               f"'12345678-gone.jpg' or 'gone.jpg' in {export.parent}, {export.parent / 'images'})")
    [turned] = by_code["rotated_box"]
    assert turned.message.startswith("export.json task 2 result Ij7xYz05 (cat): the box is rotated by 30 degrees")
    assert (turned.severity, turned.image, turned.object_index) == ("error", dog_image.path, 1)
    [unannotated] = by_code["not_annotated"]
    assert unannotated.message.endswith("export): export.json task 3")
    [choice] = by_code["shape_not_read"]
    assert choice.message.startswith("export.json task 1 result Ef5xYz03: a 'choices' result has no box")


def test_labelstudio_gate_refuses_a_rotated_box_or_leaves_it_out(export):
    with pytest.raises(DataError, match="rotated by 30 degrees"):
        load_training_data(export, splits=("train",))
    spec = load_training_data(export, splits=("train",), skip_invalid=True)
    assert spec.splits["train"].num_objects == 3  # the rotated box alone left out; the missing image never read


def test_labelstudio_export_of_predictions_only_is_refused(tmp_path):
    write_image(tmp_path / "a.jpg", 64, 64)
    records = [{"file": str(tmp_path / "a.jpg"), "width": 64, "height": 64,
                "detections": [{"box": [8.0, 16.0, 40.0, 48.0], "score": 0.9, "label": 0, "name": "cat"}]}]
    tasks = write_results("labelstudio", iter(records), tmp_path / "tasks.json", class_names=["cat"],
                          model_version="v1")
    with pytest.raises(DataError, match=r"tasks.json: none of its 1 task\(s\) has an annotation \(predictions"):
        load_dataset(tasks)


def _corrected_export(tmp_path: Path) -> Path:
    """The file ``ssd predict --format labelstudio`` writes, imported, corrected and exported as Label Studio does
    (ids added, predictions moved to annotations with one box moved and renamed, one added, an upload URL), as the
    train and val splits of a dataset folder."""
    images = tmp_path / "data" / "images"
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write_image(images / name, 80, 40)
    records = [{"file": str(images / name), "width": 80, "height": 40,
                "detections": [{"box": [8.0, 4.0, 40.0, 20.0], "score": 0.8, "label": 0, "name": "cat"}]}
               for name in ("a.jpg", "b.jpg", "c.jpg")]
    tasks = json.loads(write_results("labelstudio", iter(records), tmp_path / "runs" / "predicted.json",
                                     class_names=["cat", "dog"], model_version="v1").read_text())
    for task_id, task in enumerate(tasks, start=1):
        [prediction] = task.pop("predictions")
        task.update(id=task_id, predictions=[task_id], drafts=[], meta={}, annotations=[{
            "id": task_id, "completed_by": 1, "result": prediction["result"], "was_cancelled": False,
            "ground_truth": False, "task": task_id, "project": 1, "parent_prediction": task_id}])
    tasks[0]["annotations"][0]["result"][0]["value"].update(x=50.0, rectanglelabels=["dog"])  # moved, renamed
    tasks[1]["annotations"][0]["result"].append({**tasks[1]["annotations"][0]["result"][0], "id": "new"})
    tasks[2]["data"]["image"] = "/data/upload/1/9f8e7d6c-c.jpg"
    data = tmp_path / "data"
    for split, part in (("train", tasks), ("val", tasks[:1])):
        (data / split).mkdir()
        (data / split / "export.json").write_text(json.dumps(part))
    return data


def test_labelstudio_loop_predict_correct_then_the_training_gate_reads_it(tmp_path):
    data = _corrected_export(tmp_path)
    spec = load_training_data(data, splits=("train", "val"))
    assert spec.class_names == ["cat", "dog"] and spec.format == "labelstudio"
    train = spec.splits["train"]
    assert len(train) == 3 and train.num_objects == 4 and train.labels.tolist() == [1, 0, 0, 0]
    assert train.boxes[0].tolist() == pytest.approx([40.0, 4.0, 72.0, 20.0])
    assert check_dataset(data).errors == []


@pytest.mark.slow
def test_labelstudio_loop_ssd_train_on_the_corrected_export(tmp_path):
    result = train(data=str(_corrected_export(tmp_path)), epochs=1, project=str(tmp_path), name="ls",
                   **{**TINY_TRAIN, "batch_size": 2})
    assert math.isfinite(result.history[0]["train/loss"]) and (result.run_dir / "weights" / "last.pt").is_file()


def test_labelstudio_images_in_a_folder_the_yaml_names(tmp_path, export):
    """A data YAML names the export as a split and the folder where its images are (uploads, by file name)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (export.parent / "cat.jpg").rename(elsewhere / "cat.jpg")
    (export.parent / "photos" / "dog.png").rename(elsewhere / "dog.png")
    description = tmp_path / "data.yaml"
    description.write_text("train: export.json\nimages: elsewhere\nnames: [dog, cat, bird]\n")
    spec = load_dataset(description)
    assert spec.class_names == ["dog", "cat", "bird"] and spec.sources == {"train": export}
    assert [r.path for r in spec.splits["train"]] == [elsewhere / "cat.jpg", elsewhere / "dog.png"]
    assert [o.label for o in spec.splits["train"][0].objects] == [1, 0]
    description.write_text("train: export.json\nimages: nowhere\n")
    with pytest.raises(DataError, match="data.yaml: 'images' is 'nowhere', not a folder that exists"):
        load_dataset(description)


def test_a_list_of_coco_results_is_not_taken_for_a_label_studio_export(tmp_path):
    (tmp_path / "detections.json").write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5],
                                                            "score": 0.9}]))
    assert tool_format(tmp_path) is None
    (tmp_path / "tasks.json").write_text(json.dumps([{"data": {"image": "a.jpg"}}]))
    assert tool_format(tmp_path) == "labelstudio"
