"""The copy test behind `compress bench`'s roofline."""

import math

import pytest

from compress.bench.bandwidth import copy_bandwidth
from compress.errors import UserError


def test_copy_bandwidth_is_a_positive_finite_rate():
    bw = copy_bandwidth(4 << 20, reps=2)
    assert bw > 0 and math.isfinite(bw)


@pytest.mark.parametrize("nbytes,reps", [(0, 1), (1 << 20, 0)])
def test_bad_copy_test_settings(nbytes, reps):
    with pytest.raises(UserError):
        copy_bandwidth(nbytes, reps)
