"""runners.base.Background: work lockstep does in a thread of its own beside a framework's
processes (the reference's step 1, InfiniTrain's saved weights read during its drift)."""

from __future__ import annotations

import threading

import pytest

from lockstep.errors import RunError
from lockstep.runners.base import Background


def test_its_result_is_what_the_work_returned_and_its_error_is_raised_in_the_caller():
    started, release = threading.Event(), threading.Event()

    def work(x):
        started.set()
        release.wait(5)
        return x * 2

    b = Background(work, 21, name="t")
    assert started.wait(5) and b.in_background
    assert b._thread.daemon  # an interrupted lockstep does not wait for it
    release.set()
    assert b.result() == 42

    def fails():
        raise RunError("x.log: it failed")

    f = Background(fails)
    with pytest.raises(RunError, match="x.log: it failed"):
        f.result()
    assert f.result() is None  # raised once


def test_what_is_at_hand_is_a_background_already_done():
    d = Background.done("capture")
    assert d.result() == "capture" and not d.in_background
