"""``ssd val --track``: MOT ground truth read and checked, tracks scored with HOTA, IDF1 and MOTA (TrackEval), on
sequences whose figures are worked out by hand."""

import json
import math
import re

import numpy as np
import pytest
import torch

from builders import write_image
from ssd.cli import main
from ssd.data.mot import MotFrame, read_mot
from ssd.errors import DataError
from ssd.evaluation.tracking import score_tracks
from ssd.inference.results import Result

A, B = [0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 60.0, 60.0]


def _result(ids: list[int], boxes: list[list[float]]) -> Result:
    n = len(ids)
    return Result(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), torch.full((n,), 0.9),
                  torch.zeros(n, dtype=torch.int64), ["a"] * n, 100, 100, track_ids=torch.tensor(ids))


def _truth(frames: int, ignored: list[list[float]] | None = None) -> list[MotFrame]:
    return [MotFrame(np.array([1, 2]), np.array([A, B]), np.array(ignored or []).reshape(-1, 4)) for _ in range(frames)]


def test_a_perfect_tracker_scores_one_and_one_identity_switch_its_hand_computed_figures():
    pytest.importorskip("trackeval")
    perfect = score_tracks({"s": (_truth(4), [_result([7, 9], [A, B])] * 4)})["overall"]
    assert perfect == {"HOTA": 1.0, "DetA": 1.0, "AssA": 1.0, "IDF1": 1.0, "MOTA": 1.0, "MOTP": 1.0, "IDSW": 0,
                       "CLR_FP": 0, "CLR_FN": 0}
    # object A is track 7 in frames 1-2, then track 8: one switch. IDF1: A-7 and B-9 matched, 6 of 8 boxes on each
    # side (2 of track 8 false, 2 of A missed): 6 / (6 + 1 + 1). MOTA: 1 - 1/8. Association of A's boxes 0.5, of
    # B's 1: AssA 0.75, DetA 1, HOTA sqrt(0.75)
    switch = [_result([7, 9], [A, B])] * 2 + [_result([8, 9], [A, B])] * 2
    figures = score_tracks({"s": (_truth(4), switch)})["overall"]
    assert (figures["IDF1"], figures["MOTA"], figures["IDSW"], figures["AssA"]) == (0.75, 0.875, 1, 0.75)
    assert figures["HOTA"] == pytest.approx(math.sqrt(0.75), abs=1e-12)
    # B never tracked: 4 misses of 8; a box on an object not to score (flag 0) is no false positive, one elsewhere is
    half = [_result([7, 5], [A, [30, 30, 40, 40]])] * 2
    ignored = score_tracks({"s": (_truth(2, ignored=[[30, 30, 40, 40]]), half)})["overall"]
    counted = score_tracks({"s": (_truth(2), half)})["overall"]
    assert (ignored["CLR_FN"], ignored["CLR_FP"], ignored["MOTA"]) == (2, 0, 0.5)
    assert (counted["CLR_FN"], counted["CLR_FP"], counted["MOTA"]) == (2, 2, 0.0)


def _frames(folder, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        write_image(folder / f"{i + 1:06d}.jpg", 96, 64)


def test_both_layouts_are_read_and_bad_lines_are_named_by_file_and_line(tmp_path):
    motchallenge = tmp_path / "MOT" / "SEQ-02"
    _frames(motchallenge / "img1", 3)
    (motchallenge / "gt").mkdir()
    (motchallenge / "gt" / "gt.txt").write_text("1,1,10,20,30,40,1,1,1.0\n3,1,12,20,30,40,1,1,0.5\n"
                                                "2,4,0,0,5,5,0,7,0.1\n")
    plain = tmp_path / "plain"
    _frames(plain, 2)
    (plain / "gt.txt").write_text("\ufeff2,3,1,2,3,4\n")
    for root in (tmp_path / "MOT", motchallenge):
        (sequence,) = read_mot(root)
        assert sequence.name == "SEQ-02" and [p.name for p in sequence.frames] == ["000001.jpg", "000002.jpg",
                                                                                  "000003.jpg"]
        assert sequence.truth[0].ids.tolist() == [1] and sequence.truth[0].boxes.tolist() == [[10, 20, 40, 60]]
        assert sequence.truth[1].ids.tolist() == [] and sequence.truth[1].ignored.tolist() == [[0, 0, 5, 5]]
        assert sequence.truth[2].boxes.tolist() == [[12, 20, 42, 60]]
    (sequence,) = read_mot(plain)
    assert sequence.truth[0].ids.tolist() == [] and sequence.truth[1].boxes.tolist() == [[1, 2, 4, 6]]
    gt = plain / "gt.txt"
    for text, message in [
        ("1,1,0,0,5\n", "gt.txt:1: 5 columns, need at least 6"),
        ("1,1,0,0,5,5\n\n1,x,0,0,5,5\n", "gt.txt:3: not a number in '1,x,0,0,5,5'"),
        ("3,1,0,0,5,5\n", "gt.txt:1: frame 3 is not one of the sequence's frames 1..2"),
        ("1,-1,0,0,5,5\n", "gt.txt:1: id -1 is not a whole number >= 0"),
        ("1,1,0,0,0,5\n", "gt.txt:1: box of width 0 and height 5: both must be > 0"),
        ("1,1,0,0,nan,5\n", "gt.txt:1: a value that is not finite"),
        ("1,1,0,0,5,5\n1,1,9,9,5,5\n", "gt.txt:2: id 1 twice in frame 1: an id is one object"),
    ]:
        gt.write_text(text)
        with pytest.raises(DataError, match="^" + re.escape(f"{gt}{message[6:]}")):
            read_mot(plain)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: no MOT ground truth: neither gt.txt, gt/gt.txt nor SEQ/gt/gt.txt"):
        read_mot(tmp_path / "empty")
    with pytest.raises(DataError, match="SEQ-02/gt: no frames"):  # gt/ alone: a folder of no frames
        read_mot(motchallenge / "gt")


@pytest.mark.slow
def test_ssd_val_track_scores_the_tracks_of_detector_track(tiny_checkpoint, tmp_path, capsys):
    pytest.importorskip("trackeval")
    pytest.importorskip("trackers")
    from ssd.inference.detector import load

    sequence = tmp_path / "seq"
    _frames(sequence, 4)
    (sequence / "gt.txt").write_text("".join(f"{f},1,{8 * f},10,30,30\n" for f in range(1, 5)))
    assert main(["val", "--weights", str(tiny_checkpoint), "--data", str(sequence), "--track", "--project",
                 str(tmp_path / "runs"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["sequence", "HOTA", "DetA", "AssA", "IDF1", "MOTA", "MOTP", "IDSW",
                                           "CLR_FP", "CLR_FN"]
    saved = json.loads((tmp_path / "runs" / "exp" / "tracking.json").read_text())
    (seq,) = read_mot(sequence)
    expected = score_tracks({"seq": (seq.truth, load(tiny_checkpoint).track(seq.frames, batch_size=16))})
    assert saved["overall"] == expected["overall"] and saved["sequences"] == expected["sequences"]
    assert main(["val", "--weights", str(tiny_checkpoint), "--data", str(sequence), "--tracker", "t.yaml"]) == 2
    assert capsys.readouterr().err == "error: ssd val: --tracker sets the tracker of --track: add --track\n"
