"""The kernel choice follows the timings given to it, and the cache of timings is reused and keyed per host and op."""

import json
import math

import pytest

from compress.runtime import kernel_choice
from compress.runtime.kernel_choice import (C, PANEL, TORCH, Plan, Timings, buckets, coarse_first, confirmed, decide, plan_of,
                                           repeated, time_candidates)


def ratios(*torch_over_c: float) -> tuple[dict[str, float], ...]:
    """Per-bucket times with C at 1 ms and torch at the given multiple of it."""
    return tuple({C: 1.0, TORCH: r} for r in torch_over_c)


def test_buckets_grow_at_most_one_and_a_half_times_and_end_at_the_maximum():
    assert buckets(512) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    assert buckets(1) == [1] and buckets(5) == [1, 2, 3, 4, 5] and buckets(100)[-2:] == [96, 100]
    assert all(b / a <= 1.5 for a, b in zip(buckets(4096)[3:], buckets(4096)[4:]))


def test_coarse_first_visits_every_bucket_ends_and_middle_first():
    assert coarse_first(9)[:3] == [0, 8, 4] and sorted(coarse_first(9)) == list(range(9))
    assert coarse_first(1) == [0] and coarse_first(2) == [0, 1]


def test_the_fastest_wins_unless_the_preferred_is_within_the_margin():
    assert decide({C: 1.0, TORCH: 2.0}, TORCH) == C
    assert decide({C: 1.0, TORCH: 1.0 + kernel_choice.MARGIN / 2}, TORCH) == TORCH  # within noise: the preferred
    assert decide({C: 1.0 + kernel_choice.MARGIN / 2, TORCH: 1.0}, C) == C
    assert decide({C: 2.0, TORCH: 1.0}, C) == TORCH


def test_a_plan_gives_every_row_count_the_choice_of_the_bucket_below():
    plan = Plan((1, 2, 3, 4, 6, 8), (C, C, C, C, TORCH, TORCH), (None,) * 6)  # untimed: no interpolation
    assert plan.table() == [True] * 6 + [False] * 3  # rows 0..8; row 5 takes bucket 4's choice
    assert plan.describe() == "C at 1-5 rows, torch from 6"
    assert Plan((1, 2), (TORCH, TORCH), ratios(1.0, 1.0)).describe() == "torch at every row count"
    assert Plan((1, 2, 3), (C, TORCH, C), (None,) * 3).describe() == "C at 1 row, torch at 2, C from 3"
    with pytest.raises(ValueError, match="ascend from 1"):
        Plan((2, 3), (C, C), ratios(1.0, 1.0))


def test_between_buckets_that_disagree_the_interpolated_ratio_decides():
    # torch / C: 0.9 at 1 row, 1.2 at 32, 0.8 at 64, geometric in the row count in between; C must lead by
    # 3% where torch is preferred: from 32^0.469 = 5.1 rows (1.03 = 0.9 * (1.2 / 0.9)^0.469) to 32 * 2^0.377 = 41.5
    plan = Plan((1, 32, 64), (TORCH, C, TORCH), ratios(0.9, 1.2, 0.8), TORCH)
    use_c = plan.table()
    assert [r for r in range(1, 65) if use_c[r]] == list(range(6, 42))
    assert plan.describe() == "torch at 1-5 rows, C at 6-41, torch from 42"
    int4 = Plan((1, 32, 64), (C, C, TORCH), ratios(1.2, 1.2, 0.8), C)  # C preferred: kept while within 3% of torch (0.971)
    assert [r for r in range(1, 65) if not int4.table()[r]] == list(range(46, 65))


def test_a_third_candidate_is_chosen_and_interpolated_like_the_others():
    # A held weight's candidates: the 4-bit kernel (C), dequantize + torch, the panel GEMM dequantizing into its panels (PANEL).
    # At 64 rows PANEL is fastest; between 32 and 64, each time geometric in the row count: PANEL / C goes
    # 1.2 -> 0.6, torch stays 1.1x PANEL (never chosen); PANEL leads C by 3% from 32 * 2^0.307 = 39.5 rows.
    times = ({C: 1.0, TORCH: 4.0, PANEL: 3.0}, {C: 1.0, TORCH: 1.32, PANEL: 1.2}, {C: 1.0, TORCH: 0.66, PANEL: 0.6})
    plan = Plan((1, 32, 64), (C, C, PANEL), times, C)
    choices = plan.choices()
    assert [r for r in range(1, 65) if choices[r] == PANEL] == list(range(40, 65)) and TORCH not in choices
    assert plan.table()[39] and not plan.table()[40]  # table(): the 4-bit kernel's rows only
    assert plan.describe() == "C at 1-39 rows, C panel from 40"
    assert plan_of(kernel_choice.Request("op", [1, 32, 64], C, lambda rows: {}), list(times)).kernels == (C, C, PANEL)


def test_near_says_where_a_kernel_is_within_a_margin_of_the_fastest():
    # Between 8 and 16 rows C goes 1.0 -> 2.0 and the panel 1.2 -> 1.6, each geometric in the row count, so
    # C / panel = (1 / 1.2) * 1.5^f with f = log2(rows / 8): 0.89 at 9 rows, 1.10 at 12.9, 1.20 at 15.
    times = ({C: 0.1, PANEL: 0.5}, {C: 1.0, PANEL: 1.2}, {C: 2.0, PANEL: 1.6})
    plan = Plan((1, 8, 16), (C, C, PANEL), times, C)
    ratio = lambda r: 1.5 ** math.log2(r / 8) / 1.2  # noqa: E731
    near = plan.near(C, 0.10)
    assert [r for r in range(1, 17) if near[r]] == [r for r in range(1, 17) if r < 8 or ratio(r) <= 1.10] == list(range(1, 13))
    assert near[0] == near[1] and not near[16]
    assert [r for r in range(1, 17) if plan.near(C, 0.0)[r]] == [r for r in range(1, 17) if r < 8 or ratio(r) <= 1.0]
    untimed = Plan((1, 8, 16), (C, C, PANEL), (None, None, None), C)
    assert untimed.near(C, 0.10) == [k == C for k in untimed.choices()]  # untimed: the choice


def test_untimed_buckets_take_the_nearest_timed_choice_below():
    req = kernel_choice.Request("op", [1, 2, 4, 8, 16], TORCH, lambda rows: {})
    fast_c, fast_torch = {C: 1.0, TORCH: 2.0}, {C: 2.0, TORCH: 1.0}
    plan = plan_of(req, [fast_c, None, None, fast_torch, None])
    assert plan.kernels == (C, C, C, TORCH, TORCH)  # 4 is nearer 8, but only a bucket below decides
    assert plan.times == (fast_c, None, None, fast_torch, None)  # untimed buckets keep no times
    assert plan_of(req, [None] * 5).kernels == (TORCH,) * 5
    # the smallest untimed (decode) never takes a large bucket's choice: the preferred kernel
    assert plan_of(kernel_choice.Request("op", [1, 2, 4], C, lambda rows: {}), [None, None, fast_torch]).kernels == (C, C, TORCH)


class FakeClock:
    """perf_counter for time_candidates: each candidate's pass advances it by the next of its durations (s)."""

    def __init__(self, durations: dict[str, list[float]]):
        self.now, self.durations, self.calls = 0.0, durations, []

    def __call__(self) -> float:
        return self.now

    def candidate(self, name: str):
        def run():
            self.calls.append(name)
            self.now += self.durations[name].pop(0)
        return run


def test_time_candidates_keeps_each_ones_fastest_pass_interleaved():
    clock = FakeClock({C: [9.0, 0.002, 0.001, 0.00105], TORCH: [9.0, 0.003, 0.0031, 0.004]})
    ms = time_candidates({C: clock.candidate(C), TORCH: clock.candidate(TORCH)}, repeats=3, max_seconds=100, clock=clock)
    assert clock.calls == [C, TORCH, C, TORCH, TORCH, C, C, TORCH]  # a warm-up each, then alternating order
    assert ms == pytest.approx({C: 1.0, TORCH: 3.0})


def test_a_fastest_pass_that_does_not_repeat_is_too_noisy_to_use():
    clock = FakeClock({C: [1.0, 0.001] + [0.002] * 8, TORCH: [1.0] + [0.003] * 9})  # C's 1 ms is alone
    assert time_candidates({C: clock.candidate(C), TORCH: clock.candidate(TORCH)}, repeats=3, max_seconds=100, clock=clock) is None
    assert clock.calls.count(C) == 1 + 9  # up to three times the rounds asked, to find a repeat


def test_timing_goes_on_until_the_fastest_pass_repeats():
    clock = FakeClock({C: [1.0, 0.001, 0.002, 0.002, 0.00102], TORCH: [1.0] + [0.003] * 4})
    ms = time_candidates({C: clock.candidate(C), TORCH: clock.candidate(TORCH)}, repeats=3, max_seconds=100, clock=clock)
    assert ms == pytest.approx({C: 1.0, TORCH: 3.0}) and clock.calls.count(C) == 1 + 4


def test_a_fastest_pass_is_repeated_when_another_comes_within_the_noise():
    assert repeated([1.0, 1.09, 3.0]) and not repeated([1.0, 1.2, 3.0]) and repeated([5.0])


def test_a_busy_machine_gets_two_rounds():
    clock = FakeClock({C: [1.0] * 5, TORCH: [1.0] * 5})
    time_candidates({C: clock.candidate(C), TORCH: clock.candidate(TORCH)}, repeats=5, max_seconds=0.5, clock=clock)
    assert len(clock.calls) == 2 + 2 * 2


def test_another_kernel_than_the_preferred_must_win_twice():
    runs = iter([{C: 1.0, TORCH: 2.0}, {C: 2.5, TORCH: 3.0}])  # C wins both: its slower 2.5 against torch's faster 2.0
    assert confirmed(lambda rows: next(runs), 8, TORCH) == {C: 2.5, TORCH: 2.0}
    runs = iter([{C: 1.0, TORCH: 2.0}, {C: 3.0, TORCH: 2.0}])  # the second timing disagrees: torch
    assert decide(confirmed(lambda rows: next(runs), 8, TORCH), TORCH) == TORCH
    runs = iter([{C: 1.0, TORCH: 2.0}, None])
    assert confirmed(lambda rows: next(runs), 8, TORCH) is None  # too noisy to confirm
    calls = []
    assert confirmed(lambda rows: calls.append(rows) or {C: 3.0, TORCH: 2.0}, 8, TORCH) == {C: 3.0, TORCH: 2.0}
    assert calls == [8]  # the preferred kernel's win needs one timing


def fake_measure(times: dict[int, dict[str, float]], log: list):
    def measure(rows):
        log.append(rows)
        return times[rows]
    return measure


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "choices.json"


def test_the_plan_follows_the_timings_and_the_cache_is_reused(cache):
    times = {r: ({C: 1.0, TORCH: 3.0} if r < 8 else {C: 3.0, TORCH: 1.0}) for r in buckets(32)}
    log = []
    timings = Timings(cache)
    timings.request("linear 8x8 fp32", 32, TORCH, fake_measure(times, log))
    plan = timings.plans()["linear 8x8 fp32"]
    assert plan.describe() == "C at 1-6 rows, torch from 7" and plan.times[0] == {C: 1.0, TORCH: 3.0}  # 7: 3.0 to 1/3, interpolated, is 0.92
    assert sorted(set(log)) == buckets(32) and timings.measured == len(buckets(32))
    assert sorted(log) == sorted(buckets(32) + [1, 2, 3, 4, 6])  # C's wins timed twice (confirmed)
    timings.save()
    again, log2 = Timings(cache), []
    again.request("linear 8x8 fp32", 32, TORCH, fake_measure(times, log2))
    assert again.plans()["linear 8x8 fp32"] == plan and log2 == [] and again.measured == 0


def test_the_cache_is_keyed_by_op_rows_and_host(cache, monkeypatch):
    times = {r: {C: 1.0, TORCH: 2.0} for r in buckets(64)}
    first = Timings(cache)
    first.request("linear 8x8 fp32", 16, TORCH, fake_measure(times, []))
    first.plans()
    first.save()
    log = []
    other = Timings(cache)
    other.request("linear 8x16 fp32", 16, TORCH, fake_measure(times, log))  # another shape
    other.request("linear 8x8 fp32", 64, TORCH, fake_measure(times, log))  # the same one, more rows
    other.plans()
    assert sorted(set(log)) == sorted(buckets(16) + [24, 32, 48, 64])
    monkeypatch.setattr(kernel_choice.torch, "get_num_threads", lambda: 99)  # another thread count: another host key
    log = []
    third = Timings(cache)
    third.request("linear 8x8 fp32", 16, TORCH, fake_measure(times, log))
    third.plans()
    assert sorted(set(log)) == buckets(16)
    assert all(key.split()[0] in (first.host, third.host) for key in json.loads(cache.read_text()))


def test_noisy_buckets_are_not_cached_and_take_the_nearest_timed_choice(cache):
    times = {r: ({C: 1.0, TORCH: 2.0} if r == 1 else None) for r in buckets(8)}
    timings = Timings(cache)
    timings.request("op", 8, TORCH, fake_measure(times, []))
    assert timings.plans()["op"].kernels == (C,) * 6 and (timings.measured, timings.skipped) == (1, 5)
    timings.save()
    assert len(json.loads(cache.read_text())) == 1


def test_past_the_budget_buckets_are_left_for_a_later_start(cache):
    times = {r: {C: 1.0, TORCH: 2.0} for r in buckets(512)}
    timings = Timings(cache, budget_s=0.0)  # spent before the first bucket
    timings.request("op", 512, TORCH, fake_measure(times, log := []))
    plan = timings.plans()["op"]
    assert log == [] and timings.skipped == len(buckets(512))
    assert plan.kernels == (TORCH,) * len(plan.rows) and set(plan.times) == {None}  # the preferred kernel, untimed
    later = Timings(cache)
    later.request("op", 512, TORCH, fake_measure(times, log))
    assert later.plans()["op"].kernels == (C,) * len(plan.rows)
    assert list(dict.fromkeys(log)) == [buckets(512)[i] for i in coarse_first(len(buckets(512)))]  # coarse buckets first


def test_a_damaged_cache_is_ignored_and_rewritten(cache):
    cache.write_text("{not json")
    timings = Timings(cache)
    timings.request("op", 2, TORCH, fake_measure({1: {C: 1.0, TORCH: 2.0}, 2: {C: 1.0, TORCH: 2.0}}, []))
    timings.plans()
    timings.save()
    assert len(json.loads(cache.read_text())) == 2 and list(cache.parent.iterdir()) == [cache]  # no temporary left
