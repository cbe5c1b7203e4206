"""The terminal's one timing line of `lockstep run` (commands/run.timing_line), from run.json's "timing"."""

from __future__ import annotations

from lockstep.commands.run import timing_line


def test_the_timing_line_sums_the_pairs_phases():
    timing = {"total_s": 20.4, "stages": {"plan": 3.2, "runs": 15.6},
              "pairs": [{"phases": {"start-up": 0.1, "training": 2.0}}, {"phases": {"start-up": 2.7, "training": 4.3}}]}
    assert timing_line(timing) == ("time: 20.4 s (plan 3.2, runs 15.6; the runs' phases: start-up 2.8, training 6.3) "
                                   "-- run.json \"timing\"")


def test_runs_without_phases_leave_the_phase_part_out():
    """InfiniTrain's runs time no phases of their own (seen on the H200: "the runs' phases: )")."""
    timing = {"total_s": 97.1, "stages": {"plan": 4.2, "runs": 92.7}, "pairs": [{"phases": {}}, {"phases": {}}]}
    assert timing_line(timing) == "time: 97.1 s (plan 4.2, runs 92.7) -- run.json \"timing\""
