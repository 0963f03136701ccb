"""The timing of ``ssd benchmark``: runtimes timed in turn call by call, a failing runtime dropped from the rounds,
and the batch-1 time split into pre-processing, network and post-processing (on a clock only the network moves)."""

import pytest

import ssd.export.timing as timing
from builders import biased_model, random_images
from ssd.export.timing import Timing, time_backends
from ssd.inference.backends import open_backend


class Recorded:
    """A backend that logs its name at each network call and can be made to fail from its ``fail_at``-th call."""

    def __init__(self, name, backend, log, fail_at=None, clock=None):
        self.name_, self.backend, self.log, self.fail_at, self.clock = name, backend, log, fail_at, clock

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def __call__(self, batch):
        self.log.append(self.name_)
        if self.fail_at is not None and self.log.count(self.name_) >= self.fail_at:
            raise RuntimeError(f"{self.name_} stopped")
        if self.clock is not None:
            self.clock.now += 0.005  # the network takes 5 ms, nothing else takes any time
        return self.backend(batch)


class Clock:
    now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture(scope="module")
def tiny_backend():
    return open_backend(biased_model("ssd_tiny", image_size=64), "cpu")


def test_runtimes_are_timed_in_turn_call_by_call_after_a_warm_up(tiny_backend):
    log = []
    backends = {name: Recorded(name, tiny_backend, log) for name in ("eager", "onnx")}
    timings = time_backends(backends, random_images(3), batch_size=2, runs=3, warmup=1)
    # 1 warm-up + 3 timed images at batch 1, then 1 warm-up batch + max(2, 3 // 2) timed batches of 2
    assert log == ["eager", "onnx"] * (1 + 3 + 1 + 2)
    assert all(isinstance(t, Timing) and t.p50_ms > 0 and t.images_per_s > 0 for t in timings.values())


def test_a_runtime_that_fails_while_timed_is_dropped_and_the_others_go_on(tiny_backend):
    log = []
    backends = {"eager": Recorded("eager", tiny_backend, log), "broken": Recorded("broken", tiny_backend, log, 3)}
    timings = time_backends(backends, random_images(2), batch_size=1, runs=4, warmup=1)
    assert log == ["eager", "broken"] * 3 + ["eager"] * 2
    assert str(timings["broken"]) == "broken stopped" and isinstance(timings["eager"], Timing)


def test_the_time_per_image_is_split_into_pre_network_and_post_processing(tiny_backend, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    backends = {"eager": Recorded("eager", tiny_backend, [], clock=clock)}
    result = time_backends(backends, random_images(2), batch_size=4, runs=8, warmup=1)["eager"]
    assert result == Timing(p50_ms=5.0, p90_ms=5.0, images_per_s=800.0, pre_ms=0.0, network_ms=5.0, post_ms=0.0)
