"""Pascal VOC XML reader: the VOCdevkit layout and a flat folder of images with XML files beside them.

Coordinates: VOC writes 1-based pixel indices; like the reference SSD implementations we subtract 1 from all four
values, so ``xmin == xmax`` stays a zero-area box (reported by ``check``). Image sizes come from the image file
(header read, EXIF applied), never from ``<size>`` (real files say 0 there, or hold a PNG named .jpg); a ``<size>``
that disagrees with the image (other than by an EXIF rotation) is a warning, since the boxes were probably drawn on
another version of the picture. ``<difficult>`` is 0/1 (also true/false, yes/no); anything else is a warning and
reads as 0.

Class names: ``classes.txt`` (one name per line) at the dataset root when present, else the sorted set of names in
the annotations, unless the caller gives ``class_names``. Text files may have Windows line ends or a UTF-8 BOM.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from ssd.data.images import is_image, read_image_size
from ssd.data.memo import decode_parsed, encode_parsed, remembered
from ssd.data.records import DatasetSpec, ImageRecord, Issue, ObjectRecord, broken_link, relative_path
from ssd.errors import DataError, ImageError
from ssd.limits import MAX_CLASSES
from ssd.text import few

__all__ = ["find_voc_root", "read_voc", "read_voc_record", "parse_voc_xml", "read_lines", "read_class_file",
           "xml_files", "CLASS_FILE", "xml_problem", "check_class_count"]

CLASS_FILE = "classes.txt"
_SPLIT_ALIASES = {"valid": "val", "validation": "val"}
_FLAGS = {"0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}


def read_lines(path: Path) -> list[str]:
    """The non-blank lines of a text file, stripped (a UTF-8 BOM and Windows line ends are fine); ``DataError``
    naming the file when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e}; text files must be UTF-8)") from e
    return [line.strip() for line in text.splitlines() if line.strip()]


def find_voc_root(folder: Path) -> Path | None:
    """The folder holding ``Annotations/`` (``folder`` itself, a child, or ``VOCdevkit/<child>``), else None."""
    candidates = [folder] + sorted(p for p in folder.iterdir() if p.is_dir())
    candidates += sorted(p for p in (folder / "VOCdevkit").glob("*") if p.is_dir())
    for c in candidates:
        if (c / "Annotations").is_dir():
            return c
    return None


def xml_problem(error: ET.ParseError) -> str:
    """What a parse error says, with the rule when it is an entity: an external one (another file, a URL) is
    never fetched and a nested expansion (a "billion laughs") never made, so such a file cannot be read."""
    text = str(error)
    if "entity" in text or "amplification" in text:
        return (f"XML does not parse ({text}): XML entities are not read (an external entity is never fetched, nor "
                "an entity expansion made): write the values themselves, without <!ENTITY> declarations")
    return f"XML does not parse ({text})"


def _number(bndbox: ET.Element | None, tag: str) -> float:
    text = None if bndbox is None else bndbox.findtext(tag)  # a plain tag: found in C, no path parsed
    if text is None:
        raise ValueError(f"missing <bndbox><{tag}>")
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"<{tag}> is {text.strip()!r}, not a number") from None


def _size_issue(root: ET.Element, rel: str, width: int | None, height: int | None) -> list[Issue]:
    """A warning when ``<size>`` disagrees with the image (0 or absent means unknown; an EXIF rotation is fine)."""
    written = [(root.findtext(f"size/{tag}") or "0").strip() for tag in ("width", "height")]
    try:
        size = tuple(float(v) for v in written)
    except ValueError:
        size = None  # not numbers: a disagreement
    if width is None or height is None or size == (0, 0) or size in ((width, height), (height, width)):
        return []
    return [Issue("warning", "size_mismatch", f"{rel}: <size> says {'x'.join(written)} but the image is "
                  f"{width}x{height} (boxes are read in the image's pixels; if they were drawn on another version "
                  "of the picture they are misplaced)", rel)]


@remembered("voc", encode_parsed, decode_parsed)
def parse_voc_xml(xml_path: Path, rel: str, width: int | None = None,
                  height: int | None = None) -> tuple[list[ObjectRecord], list[Issue]]:
    """Objects of one VOC XML file (labels left at -1, see :func:`assign_labels`) and the parse problems found.

    ``width``/``height``: the image's real size, compared with ``<size>`` (a warning when they disagree).
    """
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        line = e.position[0] if e.position else None
        return [], [Issue("error", "parse_error", f"{rel}:{line}: {xml_problem(e)}", rel, line)]
    except OSError as e:
        return [], [Issue("error", "parse_error", f"{rel}: cannot read annotation ({e})", rel)]
    objects, issues = [], _size_issue(root, rel, width, height)
    for index, obj in enumerate(root.iter("object"), start=1):
        name = (obj.findtext("name") or "").strip()
        where = f"{rel} object {index} ({name or 'no name'})"
        try:
            bndbox = obj.find("bndbox")
            values = [_number(bndbox, t) for t in ("xmin", "ymin", "xmax", "ymax")]
        except ValueError as e:
            issues.append(Issue("error", "parse_error", f"{where}: {e} (VOC boxes need numeric xmin ymin xmax ymax)",
                                rel, index))
            continue
        if not name:
            issues.append(Issue("error", "parse_error", f"{where}: object has no <name>", rel, index))
            continue
        raw = " ".join(f"{t}={v:g}" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), values))
        # iscrowd: written by `ssd data convert` for COCO crowds
        difficult, truncated, occluded, crowd = ((obj.findtext(tag) or "0").strip()
                                                 for tag in ("difficult", "truncated", "occluded", "iscrowd"))
        for tag, value in (("difficult", difficult), ("truncated", truncated), ("occluded", occluded)):
            if value.lower() not in _FLAGS:
                issues.append(Issue("warning", "bad_flag", f"{where}: <{tag}> is {value!r}, read as 0 (not {tag}; "
                                    "write 0 or 1)", rel, index, object_index=len(objects)))
        objects.append(ObjectRecord(tuple(v - 1.0 for v in values), -1, name,
                                    difficult=_FLAGS.get(difficult.lower(), False),
                                    iscrowd=_FLAGS.get(crowd.lower(), False),
                                    line=index, source=xml_path, where=where, raw=raw,
                                    occluded=_FLAGS.get(occluded.lower(), False),
                                    truncated=_FLAGS.get(truncated.lower(), False)))
    return objects, issues


def assign_labels(records: list[ImageRecord], class_names: list[str]) -> None:
    """Set each object's label from its name (``-1`` for names not in ``class_names``; ``check`` reports them)."""
    index = {n: i for i, n in enumerate(class_names)}
    for rec in records:
        for obj in rec.objects:
            obj.label = index.get(obj.name, -1)


def _split_ids(voc_root: Path) -> dict[str, list[str]]:
    main = voc_root / "ImageSets" / "Main"
    splits = {}
    for txt in sorted(main.glob("*.txt")) if main.is_dir() else []:
        if "_" in txt.stem:  # per-class lists such as aeroplane_train.txt
            continue
        ids = [line.split()[0] for line in read_lines(txt)]
        splits[_SPLIT_ALIASES.get(txt.stem, txt.stem)] = ids
    return splits


def _read_images(pairs: list[tuple[str, Path | None, Path]], root: Path, split: str,
                 issues: list[Issue]) -> list[ImageRecord]:
    """Records for (id, image path or None, xml path) triples; unreadable images become issues, not records."""
    return [rec for image_id, image_path, xml_path in pairs
            if (rec := read_voc_record(image_id, image_path, xml_path, root, split, issues)) is not None]


def read_voc_record(image_id: str, image_path: Path | None, xml_path: Path, root: Path, split: str,
                    issues: list[Issue], size: tuple[int, int] | None = None) -> ImageRecord | None:
    """The record of one image and its XML file (labels left at -1, see :func:`assign_labels`), its problems
    appended to ``issues``; None when it cannot be read (said in ``issues``). The dataset index reads an edited file
    again with it alone, giving the ``size`` of an image it knows unchanged (its header is not read again)."""
    rel_xml = relative_path(xml_path, root)
    link = next(((p, why) for p in (xml_path, image_path) if p is not None and (why := broken_link(p))), None)
    if link:
        rel = relative_path(link[0], root)
        issues.append(Issue("error", "broken_link", f"{rel}: {link[1]}, so it cannot be read", rel, split=split,
                            image=image_path))
        return None
    if image_path is None or not image_path.is_file():
        issues.append(Issue("error", "missing_image", f"{rel_xml}: no image found for id {image_id!r}", rel_xml,
                            split=split))
        return None
    if not xml_path.is_file():
        issues.append(Issue("error", "missing_annotation",
                            f"{relative_path(image_path, root)}: annotation {rel_xml} does not exist", rel_xml,
                            split=split, image=image_path))
        return None
    try:
        width, height = read_image_size(image_path) if size is None else size
    except ImageError as e:
        rel = relative_path(image_path, root)
        issues.append(Issue("error", e.code, f"{rel}: {e.reason}", rel, split=split, image=image_path))
        return None
    objects, found = parse_voc_xml(xml_path, rel_xml, width, height)
    for issue in found:
        issue.split, issue.image = split, image_path
    issues.extend(found)
    return ImageRecord(image_path, xml_path, objects, width, height, image_id)


def check_class_count(count: int, source: str | Path, what: str = "class names") -> None:
    """``DataError`` naming ``source`` when a dataset has more than :data:`~ssd.limits.MAX_CLASSES` classes (checked
    before the names are looked at one by one)."""
    if count > MAX_CLASSES:
        raise DataError(f"{source}: {count:,} {what}; a dataset may have at most {MAX_CLASSES:,} classes (is this "
                        "the right file?)")


def read_class_file(path: Path) -> list[str]:
    """The class names of a ``classes.txt`` (one per line); ``DataError`` when it holds none (an empty file is a
    mistake to report, never a reason to guess the names) or too many."""
    names = read_lines(path)
    if not names:
        raise DataError(f"{path}: the class file is empty: list one class name per line (or delete it to take the "
                        "names from the annotations)")
    check_class_count(len(names), path)
    return names


def xml_files(folder: Path) -> list[Path]:
    """The VOC XML files directly in ``folder``, sorted; the suffix in any case (``a.XML`` too)."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == ".xml" and not p.is_dir())  # links in a loop too


def _images_by_stem(folder: Path, root: Path, split: str, issues: list[Issue]) -> dict[str, Path]:
    """The images of ``folder`` by file stem; two images with one stem (``a.jpg``, ``a.png``) are a warning naming
    the one used (the first by name)."""
    images: dict[str, Path] = {}
    for path in sorted(p for p in folder.iterdir() if is_image(p)):
        kept = images.setdefault(path.stem, path)
        if kept != path:
            rel = relative_path(path, root)
            issues.append(Issue("warning", "same_stem", f"{rel}: shares the name {path.stem!r} with "
                                f"{relative_path(kept, root)}, whose annotation it would share: {rel} is not read "
                                "(rename one)", rel, split=split, image=path))
    return images


def _class_names(root: Path, records: list[ImageRecord]) -> list[str]:
    class_file = root / CLASS_FILE
    if class_file.is_file():
        return read_class_file(class_file)
    names = sorted({o.name for r in records for o in r.objects})
    check_class_count(len(names), root, "different object names in the annotations")
    return names


def read_voc(folder: Path) -> DatasetSpec:
    """Read a VOCdevkit-style dataset or a flat folder of images + XML files (labels assigned from class names).

    VOCdevkit: splits from ``ImageSets/Main/<split>.txt`` (``valid`` is renamed ``val``); without ImageSets every
    XML is in split ``train``. Flat folder: subfolders ``train/``, ``val/``, ``test/`` become splits, else the
    folder itself is split ``train``.
    """
    issues: list[Issue] = []
    voc_root = find_voc_root(folder)
    splits: dict[str, list[ImageRecord]] = {}
    if voc_root is not None:
        image_dir = voc_root / "JPEGImages"
        images = _images_by_stem(image_dir, folder, "train", issues) if image_dir.is_dir() else {}
        xmls = {p.stem: p for p in xml_files(voc_root / "Annotations")}
        ids_per_split = _split_ids(voc_root) or {"train": sorted(xmls)}
        for split, ids in ids_per_split.items():
            pairs = [(i, images.get(i), xmls.get(i, voc_root / "Annotations" / f"{i}.xml")) for i in ids]
            splits[split] = _read_images(pairs, folder, split, issues)
        names_root = voc_root if (voc_root / CLASS_FILE).is_file() else folder
    else:
        subdirs = {_SPLIT_ALIASES.get(p.name, p.name): p for p in sorted(folder.iterdir())
                   if p.is_dir() and p.name in ("train", "val", "valid", "validation", "test")}
        for split, d in (subdirs or {"train": folder}).items():
            images = _images_by_stem(d, folder, split, issues)
            pairs = [(x.stem, images.get(x.stem), x) for x in xml_files(d)]
            unread = sorted(set(images) - {x.stem for x in xml_files(d)})
            if unread:  # a flat folder pairs by name: an image without XML is not part of the dataset
                issues.append(Issue("warning", "image_without_annotation", f"{relative_path(d, folder)}: "
                                    f"{len(unread)} image(s) without an XML file beside them are not read: "
                                    f"{few([images[i].name for i in unread])}", relative_path(d, folder),
                                    split=split))
            splits[split] = _read_images(pairs, folder, split, issues)
        names_root = folder
    all_records = [r for recs in splits.values() for r in recs]
    names = _class_names(names_root, all_records)
    assign_labels(all_records, names)
    return DatasetSpec(folder, "voc", names, splits, issues)
