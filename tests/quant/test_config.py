"""QuantConfig refuses options that do not belong to the chosen method."""

import pytest

from compress.errors import UserError
from compress.quant.config import QuantConfig


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(method="fp8", outlier_topk=4), "apply to --method int8"),
        (dict(method="awq", outlier_threshold=3.0), "apply to --method int8"),
        (dict(method="int8", static_activations=True), "--static-activations applies to --method fp8"),
        (dict(method="int8", group_size=32), "--group-size and --symmetric apply to awq and rtn"),
        (dict(method="fp8", format="awq"), "--format awq"),
        (dict(method="int8", outlier_topk=-1), "--outlier-topk must be >= 0"),
        (dict(method="int8", outlier_threshold=-2.0), "--outlier-threshold must be > 0"),
        (dict(method="int8", smooth_alpha=1.5), "--smooth-alpha must be in \\[0, 1\\]"),
        (dict(method="fp8", smooth_alpha=0.3), "--smooth-alpha and --act-group-size apply to --method int8"),
        (dict(method="int8", act_group_size=48), "--act-group-size must be a power of two >= 16"),
        (dict(method="int8", act_group_size=8), "--act-group-size must be a power of two >= 16"),
        (dict(method="awq", act_group_size=32), "--smooth-alpha and --act-group-size apply to --method int8"),
        (dict(method="int8", act_group_size=0, smooth_alpha=-0.1), "--smooth-alpha must be in \\[0, 1\\]"),
        (dict(method="rtn", rounding="gptq"), "--rounding applies to --method awq"),
        (dict(method="awq", rounding="stochastic"), "--rounding stochastic is not one of gptq, nearest"),
    ],
)
def test_bad_int8_fp8_options(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        QuantConfig(**kwargs)


def test_calibration_only_when_a_statistic_is_needed():
    assert QuantConfig(method="int8").needs_calibration
    assert QuantConfig(method="int8", outlier_topk=0, act_group_size=0).needs_calibration  # smoothing needs the statistics
    assert not QuantConfig(method="int8", outlier_topk=0).needs_calibration  # steps per block: no smoothing
    assert not QuantConfig(method="int8", outlier_topk=0, act_group_size=0, smooth_alpha=0.0).needs_calibration
    assert QuantConfig(method="fp8").needs_calibration  # GPTQ rounding needs the inputs' second moments
    assert not QuantConfig(method="fp8", rounding="nearest").needs_calibration
    assert QuantConfig(method="fp8", rounding="nearest", static_activations=True).needs_calibration


def test_int8_smooths_only_with_one_step_per_token():
    assert QuantConfig(method="int8").smooth_alpha == 0.0 and QuantConfig(method="int8").act_group_size is None
    assert QuantConfig(method="int8", act_group_size=0).smooth_alpha == 0.7
    assert QuantConfig(method="int8", act_group_size=16).smooth_alpha == 0.0
    assert QuantConfig(method="int8", act_group_size=0, smooth_alpha=0.4).smooth_alpha == 0.4
    assert QuantConfig(method="awq").smooth_alpha is None


@pytest.mark.parametrize("method", ["awq", "fp8"])
def test_rounds_by_gptq_unless_asked_for_nearest(method):
    assert QuantConfig(method=method).rounding == "gptq" and QuantConfig(method=method).gptq
    assert not QuantConfig(method=method, rounding="nearest").gptq
    assert QuantConfig(method="rtn").rounding is None and not QuantConfig(method="rtn").gptq


def test_awq_tuning_starts_from_nearest_rounding_unless_asked_for_gptq():
    assert QuantConfig(method="awq", tune_iters=50).rounding == "nearest"
    assert QuantConfig(method="awq", tune_iters=50, rounding="gptq").gptq
