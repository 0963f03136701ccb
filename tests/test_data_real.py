"""The shared real datasets: object counts equal to their READMEs, and each listed defect reported at its file."""


from ssd.data import check_dataset, load_dataset


def _objects(spec, split):
    return sum(len(r.objects) for r in spec.splits[split])


def test_bccd_counts_and_defects(shared_data):
    spec = load_dataset(shared_data / "bccd")
    assert spec.format == "voc" and spec.class_names == ["Platelets", "RBC", "WBC"]
    assert {s: len(r) for s, r in spec.splits.items()} == {"train": 205, "val": 87, "trainval": 292, "test": 72}
    assert _objects(spec, "trainval") + _objects(spec, "test") == 4888
    per_class = {}
    for split in ("trainval", "test"):
        for rec in spec.splits[split]:
            assert (rec.width, rec.height) == (640, 480)
            for o in rec.objects:
                per_class[o.name] = per_class.get(o.name, 0) + 1
    assert per_class == {"RBC": 4155, "WBC": 372, "Platelets": 361}

    report = check_dataset(spec)
    zero = sorted((e.file.split("/")[-1], e.line) for e in report.errors if e.code == "zero_area")
    assert [z[0] for z in zero] == ["BloodImage_00338.xml", "BloodImage_00343.xml"] and len(report.errors) == 2
    dup_images = sorted(w.file.split("_")[-1][:5] for w in report.warnings if w.code == "duplicate_box")
    assert dup_images == ["00020", "00100", "00104", "00251", "00284", "00331", "00403"]


def test_aquarium_counts_and_defects(shared_data, tmp_path):
    root = shared_data / "aquarium"
    spec = load_dataset(root)
    assert spec.format == "yolo" and spec.class_names[0] == "fish" and len(spec.class_names) == 7
    assert {s: (len(r), _objects(spec, s)) for s, r in spec.splits.items()} == {"train": (448, 3324),
                                                                                 "val": (127, 909)}
    # data.yaml leaves test/ out; list it in a copy of the yaml to check the zero-size boxes there
    yaml = tmp_path / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: train/images\nval: valid/images\ntest: test/images\n"
                    "names: [fish, jellyfish, penguin, puffin, shark, starfish, stingray]\n")
    full = load_dataset(yaml)
    assert (len(full.splits["test"]), _objects(full, "test")) == (63, 584)
    report = check_dataset(full, decode_images=False)  # the BCCD test covers decoding real JPEGs
    zero = sorted(e.file.split("/")[-1].split(".")[0] for e in report.errors)
    assert [e.code for e in report.errors] == ["zero_area", "zero_area"]
    assert zero == ["IMG_2423_jpeg_jpg", "IMG_2570_jpeg_jpg"]
    (tiny,) = [w for w in report.warnings if w.code == "tiny_box"]
    assert tiny.file == "train/labels/IMG_8580_jpg.rf.9b5f56c09ea8a7933c2c575f7e9a3f14.txt"
    (empty,) = [w for w in report.warnings if w.code == "no_objects"]
    assert empty.file == "train/labels/IMG_3133_jpeg_jpg.rf.f439b9d382fd153b96f0a88cdf169172.txt"
    assert not [w for w in report.warnings if w.code == "duplicate_box"]


def test_bccd_zero_area_message_quotes_the_file(shared_data):
    """The message gives the values as written in the XML (1-based), next to the converted pixel box."""
    report = check_dataset(load_dataset(shared_data / "bccd", split="trainval"), decode_images=False)
    assert [e.message for e in report.errors] == [
        "BCCD/Annotations/BloodImage_00338.xml object 13 (RBC): box (503, 336, 503, 336) (written: xmin=504 ymin=337 "
        "xmax=504 ymax=337) has zero area (width 0, height 0; boxes need x2 > x1 and y2 > y1)",
        "BCCD/Annotations/BloodImage_00343.xml object 4 (RBC): box (180, 328, 180, 328) (written: xmin=181 ymin=329 "
        "xmax=181 ymax=329) has zero area (width 0, height 0; boxes need x2 > x1 and y2 > y1)"]
