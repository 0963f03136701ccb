"""The number tests of ssd.limits that the option, card and file checks share."""

import math

import numpy as np
import pytest

from ssd.errors import ConfigError
from ssd.limits import is_real, is_whole
from ssd.settings import check_thresholds
from ssd.sizes import as_hw

CASES = [True, False, 1, 1.0, np.int64(2), "3", None, 2**70, -4, np.float64(0.5), math.nan]


def test_is_whole_is_an_int_that_is_not_a_bool():
    assert [is_whole(v) for v in CASES] == [False, False, True, False, False, False, False, True, True, False, False]


def test_is_whole_integral_also_takes_numpy_integers():
    assert [is_whole(v, integral=True) for v in CASES] == [
        False, False, True, False, True, False, False, True, True, False, False]


def test_is_real_is_an_int_or_float_that_is_not_a_bool():
    assert [is_real(v) for v in CASES] == [False, False, True, True, False, False, False, True, True, True, True]


def test_is_real_any_real_also_takes_numpy_float32_and_integers():
    assert [is_real(v, any_real=True) for v in [*CASES, np.float32(0.5)]] == [
        False, False, True, True, True, False, False, True, True, True, True, True]
    assert not is_real(np.float32(0.5))


def test_is_real_finite_is_a_number_a_float_can_hold_exactly_compared():
    values = [*CASES, math.inf, -math.inf, 10**400, -(10**308), 1.7976931348623157e308]
    assert [is_real(v, finite=True) for v in values] == [
        False, False, True, True, False, False, False, True, True, True, False, False, False, False, True, True]


def test_numpy_integers_are_input_sizes_but_not_option_counts():
    assert as_hw(np.int64(300)) == (300, 300)
    with pytest.raises(ConfigError, match="max_detections must be a positive integer, got 5"):
        check_thresholds(0.5, 0.5, np.int64(5))
