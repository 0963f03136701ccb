"""Tracking (ssd.inference.tracking, Detector.track): ByteTrack ids on results whose boxes move by known amounts,
the --tracker YAML, and ids and trails drawn on frames."""

import json

import numpy as np
import pytest
import torch

from builders import biased_model
from ssd.cli import main
from ssd.errors import ConfigError
from ssd.inference.detector import Detector
from ssd.inference.results import Frame, Result
from ssd.inference.tracking import TRAIL_LENGTH, Tracker, track_frames, tracker_settings
from ssd.plots import class_color, draw_detections

pytest.importorskip("trackers")
cv2 = pytest.importorskip("cv2")

CONFIRMED = dict(minimum_consecutive_frames=1, track_activation_threshold=0.3, high_conf_det_threshold=0.3)
"""Settings under which a track gets its id on its second frame (ByteTrack gives none on a track's first)."""


def result(boxes, scores=None, labels=None) -> Result:
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    scores = torch.full((len(boxes),), 0.9) if scores is None else torch.tensor(scores)
    labels = torch.arange(len(boxes)) % 2 if labels is None else torch.tensor(labels, dtype=torch.int64)
    return Result(boxes, scores, labels, [f"c{k}" for k in labels.tolist()], 200, 100)


def moving(frame: int) -> Result:
    """Two objects: one of class 0 moving right 4 px a frame, one of class 1 moving down 3 px a frame; listed in
    alternating order."""
    a = [10 + 4 * frame, 10, 40 + 4 * frame, 40]
    b = [120, 5 + 3 * frame, 150, 35 + 3 * frame]
    return result([a, b], labels=[0, 1]) if frame % 2 == 0 else result([b, a], labels=[1, 0])


def test_ids_follow_objects_in_the_order_of_the_detections():
    tracker = Tracker(minimum_consecutive_frames=2)
    ids = [tracker.update(moving(i), i).track_ids.tolist() for i in range(6)]
    # frame 0: not confirmed yet; then each object keeps its id whichever order the detections come in
    assert ids == [[-1, -1], [1, 0], [0, 1], [1, 0], [0, 1], [1, 0]]
    out = tracker.update(moving(6), 6)
    assert out.track_ids.dtype == torch.int64 and out.boxes.equal(moving(6).boxes)  # nothing reordered or dropped
    assert out.to_dict()["detections"][0]["track_id"] == 0


def test_per_class_tracks_never_cross_classes():
    box = [10.0, 10, 40, 40]
    labelled = [Result(torch.tensor([box, [120.0, 5, 150, 35]]), torch.tensor([0.9, 0.9]), torch.tensor([k, 1]),
                       [f"c{k}", "c1"], 200, 100) for k in (0, 0, 0, 1, 1)]
    shared, per_class = Tracker(per_class=False, **CONFIRMED), Tracker(**CONFIRMED)  # per_class: the default
    assert [shared.update(r, i).track_ids.tolist() for i, r in enumerate(labelled)] == \
        [[-1, -1], [0, 1], [0, 1], [0, 1], [0, 1]]  # one ByteTrack: the box keeps its id when its class changes
    # one per class: the class-1 box at the left starts its own track; ids are numbered across the classes
    assert [per_class.update(r, i).track_ids.tolist() for i, r in enumerate(labelled)] == \
        [[-1, -1], [0, 1], [0, 1], [-1, 1], [2, 1]]


def meeting(frame: int) -> Result:
    """A class-0 box moving right and a class-1 box moving left, 10 px a frame, on top of each other at frame 8,
    then each going back the way it came."""
    step = 10 * (frame if frame <= 8 else 16 - frame)
    return result([[20 + step, 40, 60 + step, 80], [180 - step, 40, 220 - step, 80]], labels=[0, 1])


def test_objects_of_two_classes_that_meet_keep_their_ids():
    ids = [Tracker(per_class=per_class, **CONFIRMED) for per_class in (True, False)]
    kept, swapped = ([tracker.update(meeting(i), i).track_ids.tolist() for i in range(12)] for tracker in ids)
    assert kept == [[-1, -1]] + [[0, 1]] * 11  # per class (the default): each keeps its id when they turn back
    # one ByteTrack for both classes follows the motion it predicts: after the meeting the ids are swapped
    assert swapped == [[-1, -1]] + [[0, 1]] * 8 + [[1, 0]] * 3


def test_a_box_below_the_confidence_continues_its_track_but_starts_none():
    tracker = Tracker(score_threshold=0.5)  # ByteTrack's defaults: tracks start at 0.7, a second pass below 0.6
    box, elsewhere = [10.0, 10, 40, 40], [120.0, 5, 150, 35]
    frames = [result([box], [0.9], [0])] * 3 + [result([box, elsewhere], [0.2, 0.2], [0, 0]),
                                                 result([box, elsewhere], [0.2, 0.55], [0, 0]),
                                                 result([box, elsewhere], [0.2, 0.5], [0, 0])]
    out = [tracker.update(r, i) for i, r in enumerate(frames)]
    assert [r.track_ids.tolist() for r in out] == [[-1], [0], [0], [0], [0, -1], [0]]  # 0.5: not above the conf
    # the box scored 0.2 keeps its track and is written; the one elsewhere is written only at 0.55 (>= 0.5), untracked
    assert [r.scores.tolist() for r in out[3:5]] == [[pytest.approx(0.2)], [pytest.approx(0.2), pytest.approx(0.55)]]
    assert out[4].boxes.tolist() == [box, elsewhere] and out[4].names == ["c0", "c0"]


class ThresholdRecorder:
    """A detector that records the score threshold it is asked for; it finds one box, scored 0.3, in each image
    (none above a threshold over 0.3)."""

    def __init__(self):
        self.thresholds = []

    def confidence(self, score_threshold=None):
        return (0.25 if score_threshold is None else score_threshold), "default"

    def detect(self, images, paths, *, score_threshold, **options):
        self.thresholds.append(score_threshold)
        found = score_threshold <= 0.3
        return [result([[10.0, 10, 40, 40]] * found, [0.3] * found, [0] * found) for _ in images]


def test_tracking_runs_the_detector_down_to_the_low_threshold():
    frames = [[Frame(torch.zeros(3, 100, 200, dtype=torch.uint8), 0, i, 0.0, None)] for i in range(2)]
    for settings, conf, detected, boxes in (
            (None, 0.5, 0.5, 0),  # no tracking: the user's confidence
            ({}, 0.5, 0.1, 0),  # tracking: down to 0.1; a box scored 0.3 that continues no track is not written
            ({"low_conf_det_threshold": 0.2}, None, 0.2, 1),  # the model's confidence (0.25) keeps a box at 0.3
            ({}, 0.05, 0.05, 1)):  # a confidence below the low threshold is the detector's
        detector = ThresholdRecorder()
        results = [r for r, _, _ in track_frames(detector, frames, settings, score_threshold=conf)]
        assert detector.thresholds == [detected] * 2 and [len(r.scores) for r in results] == [boxes] * 2


def test_ids_survive_dropped_frames_and_trails_hold_centres():
    tracker = Tracker(**CONFIRMED)
    for index in (0, 1, 2, 6, 7):  # frames 3 to 5 dropped (a busy model on a live stream): motion predicted over them
        ids = tracker.update(moving(index), index).track_ids.tolist()
    assert ids == [1, 0]  # frame 7 lists the object moving down first
    # a track's trail: its box centres from the frame it got its id (a new track's first frame has none)
    assert list(tracker.trails[0]) == [(25.0 + 4 * i, 25.0) for i in (1, 2, 6, 7)]
    assert list(tracker.trails[1]) == [(135.0, 20.0 + 3 * i) for i in (1, 2, 6, 7)]


def test_trails_are_short_and_forget_lost_tracks():
    tracker = Tracker(**CONFIRMED)
    for index in range(TRAIL_LENGTH + 5):
        tracker.update(moving(index), index)
    assert sorted(len(t) for t in tracker.trails.values()) == [TRAIL_LENGTH, TRAIL_LENGTH]
    for index in range(TRAIL_LENGTH + 5, 2 * TRAIL_LENGTH + 5):  # nothing seen for TRAIL_LENGTH frames
        tracker.update(result([]), index)
    assert tracker.trails == {}


def test_tracker_settings_from_yaml(tmp_path):
    path = tmp_path / "bytetrack.yaml"
    path.write_text("tracker_type: bytetrack\ntrack_activation_threshold: 0.4\nlost_track_buffer: 60\n"
                    "frame_rate: 25\nper_class: false\nlow_conf_det_threshold: 0.05\n")
    assert tracker_settings(path) == {"track_activation_threshold": 0.4, "lost_track_buffer": 60, "frame_rate": 25.0,
                                      "per_class": False, "low_conf_det_threshold": 0.05}
    assert tracker_settings(None) == {}
    for text, message in (
            ("track_activation_treshold: 0.4\n", r"'track_activation_treshold' is not a setting; did you mean "
                                                 r"'track_activation_threshold'"),
            ("high_conf_det_threshold: 1.5\n", r"high_conf_det_threshold' = 1.5: must be a number in \[0, 1\]"),
            ("lost_track_buffer: 2.5\n", r"lost_track_buffer' = 2.5: must be an integer in 0\.\.100000"),
            ("lost_track_buffer: .inf\n", r"lost_track_buffer' = inf: must be an integer in 0\.\.100000"),
            ("lost_track_buffer: .nan\n", r"lost_track_buffer' = nan: must be an integer in 0\.\.100000"),
            ("lost_track_buffer: 1.0e+300\n", r"lost_track_buffer' = 1e\+300: must be an integer in 0\.\.100000"),
            (f"frame_rate: {10**400}\n", r"'frame_rate' = 10+\.\.\.0+: must be a number in \[1, 1000\] frames"),
            ("frame_rate: 4.9e-324\n", r"'frame_rate' = 5e-324: must be a number in \[1, 1000\] frames per second"),
            ("minimum_consecutive_frames: true\n", r"must be an integer in 1\.\.100000"),
            ("tracker_type: botsort\n", r"'botsort' is not a tracker; valid: bytetrack"),
            ("per_class: 1\n", r"'per_class' = 1: must be true or false"),
            ("- 1\n", r"expected a mapping of settings, got list"),
            ("a: [\n", r"not valid YAML")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"--tracker {path}: .*{message}"):
            tracker_settings(path)


def test_tracker_settings_given_as_a_dict_are_checked_as_a_files_are():
    """Detector.track(tracker={...}) skipped the check: a bad value failed at the first frame, or gave no tracks."""
    assert tracker_settings({"frame_rate": 25, "per_class": False}) == {"frame_rate": 25.0, "per_class": False}
    with pytest.raises(ConfigError, match=r"^tracker: 'lost_track_buffer' = 1e\+300: must be an integer in 0\.\."):
        tracker_settings({"lost_track_buffer": 1e300})
    with pytest.raises(ConfigError, match=r"^tracker: 'frame_rat' is not a setting; did you mean 'frame_rate'"):
        Detector(biased_model("ssd_tiny")).track([torch.zeros(3, 32, 32, dtype=torch.uint8)] * 2,
                                                 tracker={"frame_rat": 5})


def test_a_20_mb_tracker_yaml_is_refused_before_it_is_read_and_before_the_model_loads(tmp_path, capsys):
    """A 20 MB tracker YAML took 73 s and 0.97 GB before it was refused."""
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"# x\n" * (20 * 2**20 // 4))
    code = main(["predict", "--weights", str(tmp_path / "none.pt"), "--source", str(tmp_path), "--track",
                 "--tracker", str(path)])
    assert code == 1 and capsys.readouterr().err == (f"error: --tracker {path}: over 65,536 bytes "
                                                     "(limits.MAX_TRACKER_FILE_BYTES): a tracker's settings take a "
                                                     "few lines\n")  # not "weights ... does not exist": before it


def still_video(path, count=6):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (96, 64))
    image = np.full((64, 96, 3), 90, np.uint8)
    cv2.rectangle(image, (20, 10), (60, 50), (0, 0, 255), -1)
    for _ in range(count):
        writer.write(image)
    writer.release()
    return path


def test_detector_tracks_a_video_and_a_list_of_frames(tmp_path):
    detector = Detector(biased_model("ssd_tiny", image_size=96))
    settings = dict(CONFIRMED, track_activation_threshold=0.0, high_conf_det_threshold=0.0)
    video = still_video(tmp_path / "still.avi")
    results = detector.track(video, tracker=settings, batch_size=4, max_detections=5)
    assert len(results) == 6 and {r.path for r in results} == {str(video)}
    # the same frame six times: the same detections, each with its own id from the second frame on
    assert [r.track_ids.tolist() for r in results] == [[-1] * 5] + [list(range(5))] * 5
    assert all(r.boxes.equal(results[0].boxes) for r in results)
    image = torch.full((3, 64, 96), 90, dtype=torch.uint8)
    streamed = detector.track([image, image.clone(), image], tracker=settings, stream=True, max_detections=5)
    assert not isinstance(streamed, list)
    assert [r.track_ids.tolist() for r in streamed] == [[-1] * 5] + [list(range(5))] * 2
    frame = tmp_path / "frame.png"
    cv2.imwrite(str(frame), np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match=r"frame.png is one image, and tracking follows objects across frames"):
        detector.track(frame)


def test_drawn_ids_and_trails():
    image = torch.full((3, 100, 200), 255, dtype=torch.uint8)
    boxes, labels = torch.tensor([[120.0, 60, 150, 90]]), torch.tensor([0])
    trail = [(20.0, 20.0), (60.0, 20.0), (100.0, 20.0)]
    drawn = draw_detections(image, boxes, labels, None, ["a"], track_ids=torch.tensor([7]), trails={7: trail},
                            line_width=3)
    assert tuple(drawn[:, 20, 80].tolist()) == class_color(7)  # on the trail, in the track's colour
    assert tuple(drawn[:, 75, 120].tolist()) == class_color(7)  # the box's left side, the same colour
    untracked = draw_detections(image, boxes, labels, None, ["a"], track_ids=torch.tensor([-1]), trails={7: trail},
                                line_width=3)
    assert tuple(untracked[:, 20, 80].tolist()) == (255, 255, 255)  # no trail for an untracked box
    assert tuple(untracked[:, 75, 120].tolist()) == class_color(0)


def test_predict_track_on_a_video_a_folder_and_one_image(tiny_checkpoint, tmp_path, capsys):
    video = still_video(tmp_path / "still.avi")
    settings = tmp_path / "bytetrack.yaml"
    settings.write_text("track_activation_threshold: 0.0\nhigh_conf_det_threshold: 0.0\n"
                        "minimum_consecutive_frames: 1\n")
    assert main(["predict", "--weights", str(tiny_checkpoint), "--source", str(video), "--save-dir",
                 str(tmp_path / "v"), "--track", "--tracker", str(settings), "--max-det", "4"]) == 0
    frames = json.loads((tmp_path / "v" / "predictions.json").read_text())["images"]
    assert [[d["track_id"] for d in f["detections"]] for f in frames] == [[-1] * 4] + [[0, 1, 2, 3]] * 5
    assert (tmp_path / "v" / "still.avi").is_file()

    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i:03d}.png"), np.full((64, 96, 3), 90, np.uint8))
    assert main(["predict", "--weights", str(tiny_checkpoint), "--source", str(folder), "--save-dir",
                 str(tmp_path / "f"), "--track", "--tracker", str(settings), "--max-det", "4"]) == 0
    assert "--track: the 3 images are tracked as one sequence of frames, in name order" in capsys.readouterr().err
    images = json.loads((tmp_path / "f" / "predictions.json").read_text())["images"]
    assert [[d["track_id"] for d in f["detections"]] for f in images] == [[-1] * 4] + [[0, 1, 2, 3]] * 2

    one = folder / "000.png"
    assert main(["predict", "--weights", str(tiny_checkpoint), "--source", str(one), "--track"]) == 1
    assert "track follows objects across the frames of a video or a stream, and" in capsys.readouterr().err
    assert main(["predict", "--weights", str(tiny_checkpoint), "--source", str(video), "--tracker",
                 str(settings)]) == 2  # an option mistake, refused before the model loads
    assert "sets up tracking: give track too (--track --tracker" in capsys.readouterr().err
