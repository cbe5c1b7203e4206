"""The report and the history call the same tok/s series NOISY, through the one CV definition
(compare/throughput.py's `coefficient_of_variation`)."""

from __future__ import annotations

import statistics

import pytest

from lockstep.compare.throughput import NOISY_CV, coefficient_of_variation, is_noisy, throughput_of
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.history.entries import tokens_per_s_stats
from lockstep.history.trend import TrendPoint

# Steps 2..3 after the warm-up: 90 and 110 tok/s. Sample CV 0.141 (NOISY); the history's former
# population CV was exactly 0.10 (not NOISY): the series the two old definitions split on.
TPS = [50.0, 90.0, 110.0]


def record(tps: list[float]) -> RunRecord:
    return RunRecord("pytorch", "c", [StepRecord(i + 1, 10.0, 1e3 / t if t else None, t, 1e-4)
                                      for i, t in enumerate(tps)])


def history_point(rec: RunRecord) -> TrendPoint:
    stats = tokens_per_s_stats(rec)
    return TrendPoint(run_id="r", recorded_at="", commit="c", identity="-", verdict=None, max_abs_diff=None,
                      threshold=None, **stats)


def test_the_old_definitions_disagree_on_this_series():
    measured = TPS[1:]
    mean = statistics.fmean(measured)
    assert statistics.pstdev(measured) / mean <= NOISY_CV < statistics.stdev(measured) / mean


@pytest.mark.parametrize("tps, noisy", [(TPS, True), ([50.0, 99.0, 101.0], False), ([50.0, 100.0, 100.0], False),
                                        ([50.0, 100.0, 200.0, 100.0], True)])
def test_report_and_history_classify_the_same_series_the_same_way(tps, noisy):
    rec = record(tps)
    report = throughput_of(rec).tokens_per_s  # what the report's and compare's tables show
    history = history_point(rec)
    assert report.cv == pytest.approx(history.tps_cv, rel=1e-12)
    assert report.noisy is history.noisy is noisy


def test_one_value_and_zero_mean():
    assert coefficient_of_variation([5.0]) == 0.0
    assert coefficient_of_variation([0.0, 0.0]) == float("inf") and is_noisy(float("inf"))
    assert not is_noisy(None)
    assert history_point(record([1.0, 0.0, 0.0])).tps_cv is None  # the history stores no infinite CV
