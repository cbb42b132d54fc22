import pytest

from compress.errors import UserError
from compress.runtime import SamplingParams


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ["ok", ""]}, "stop"),
    ],
)
def test_bad_sampling_params(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        SamplingParams(**kwargs)


def test_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.5).greedy
