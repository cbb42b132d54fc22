"""The transformers continuous-batching baseline stops and joins the manager's thread on every way out.

The manager decodes on a non-daemon thread; left running, it keeps the process alive after
`compress bench` returns or is interrupted. A stand-in manager records how it was stopped.
"""

from types import SimpleNamespace

import pytest

from compress.bench import hf_baselines
from compress.runtime.sequence import SamplingParams


class Manager:
    def __init__(self, results, alive=True):
        self.results, self.alive, self.stopped = list(results), alive, None

    def start(self):
        pass

    def add_request(self, prompt, request_id, max_new_tokens, record_timestamps):
        pass

    def get_result(self, timeout):
        item = self.results.pop(0) if self.results else None
        if isinstance(item, BaseException):
            raise item
        return item

    def is_running(self):
        return self.alive and self.stopped is None

    def stop(self, block, hard_stop=False):
        self.stopped = (block, hard_stop)


def finished(i, error=None):
    return SimpleNamespace(request_id=str(i), error=error, timestamps=[1.0, 2.0], is_finished=lambda: True)


def continuous(manager, n=2):
    hf = SimpleNamespace(init_continuous_batching=lambda generation_config: manager)
    return hf_baselines.continuous(hf, [[1, 2]] * n, [SamplingParams(max_tokens=2)] * n, 0.0)


def test_a_finished_run_stops_and_joins_the_thread():
    m = Manager([finished(1), None, finished(0)])
    assert continuous(m) == {0: [1.0, 2.0], 1: [1.0, 2.0]}
    assert m.stopped == (True, False)


@pytest.mark.parametrize("results,error", [
    ([KeyboardInterrupt()], KeyboardInterrupt),
    ([finished(0, error="out of blocks")], RuntimeError),
])
def test_an_interrupt_or_a_failed_request_stops_the_thread_hard(results, error):
    m = Manager(results)
    with pytest.raises(error):
        continuous(m)
    assert m.stopped == (True, True)


def test_a_dead_thread_is_an_error_not_an_endless_wait():
    m = Manager([], alive=False)
    with pytest.raises(RuntimeError, match="stopped before"):
        continuous(m)
    assert m.stopped == (True, True)
