"""execute_plan's order with persistent workers: pairs that run on their own go first, in plan
order, while the first worker group starts; then a runner's cases that share a worker-group key
run together, in plan order, in one `run_many`; skipped pairs are never handed to a runner;
outcomes come back in plan order. With
`persistent_workers` off every pair is its own `run_many`, not persistent.

The runners here are a bookkeeping framework: they record what they were asked to run and
return records without training (what runs inside `run_many` is tested with real frameworks in
tests/runners/test_persistent_workers.py)."""

from __future__ import annotations

from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.models import SHAPES
from lockstep.execute import execute_plan
from lockstep.plan import RunPlan
from lockstep.runners.base import FrameworkRunner, RunInputs


class Bookkeeping(FrameworkRunner):
    """Groups cases by world size when `grouped`; "fails" cases fail (their repeats are not run)."""

    def __init__(self, name: str, grouped: bool, calls: list):
        self.name, self.grouped, self.calls = name, grouped, calls

    def version(self) -> str:
        return "0"

    def skip_reason(self, case, inputs):
        return "too wide" if case.dp == 4 and self.name == "b" else None

    def worker_group_key(self, case, inputs):
        return case.world_size if self.grouped else None

    def execute(self, case, inputs, log_path, on_step):
        raise AssertionError("run_many is overridden")

    def open_workers(self, case, inputs):
        return BookkeepingGroup(self.name, case.world_size, self.calls)

    def run_many(self, pairs, out_dirs, on_start=None, on_step=None, on_done=None, persistent=False, group=None,
                 before_capture=None):
        assert (group is not None) == persistent
        self.calls.append((self.name, [c.name for c, _ in pairs], persistent, len(out_dirs)))
        out = []
        for case, _ in pairs:
            rec = RunRecord(self.name, case.name, [StepRecord(1, 1.0, 1.0, 1.0, 1e-4)],
                            status="failed" if case.name == "fails" else "ok")
            on_done(case, [rec])
            out.append([rec])
        return out


class BookkeepingGroup:
    """A worker group that records when it was started early and closed."""

    def __init__(self, name: str, world: int, calls: list):
        self.name, self.world, self.calls = name, world, calls

    def prestart(self, case: dict, log_dir) -> None:
        self.calls.append(("prestart", self.name, self.world, case["name"]))

    def close(self) -> None:
        self.calls.append(("close", self.name, self.world))

    def discard(self) -> None:
        self.calls.append(("discard", self.name, self.world))

    def __exit__(self, *exc) -> None:
        self.calls.append(("discard", self.name, self.world))


def case(name: str, dp: int = 1) -> CaseSpec:
    return CaseSpec(name=name, model="gpt2-tiny", dtype="float32", micro_batch=1, seq_len=8, total_batch=8 * dp,
                    steps=1, lr=1e-4, dp=dp)


def plan(tmp_path: Path, runners, persistent: bool) -> RunPlan:
    cases = [case("one"), case("dp2", 2), case("fails"), case("dp4", 4), case("dp2_again", 2)]
    inputs = RunInputs(checkpoint=Path("-"), tokens=Path("-"), model=SHAPES["gpt2-tiny"].config, device="cpu")
    return RunPlan(out_dir=tmp_path, device="cpu", cases=cases, inputs={c.name: inputs for c in cases},
                   runners=runners, persistent_workers=persistent)


def test_pairs_on_their_own_run_first_while_the_first_group_starts(tmp_path):
    calls, ended = [], []
    runners = [Bookkeeping("a", grouped=False, calls=calls), Bookkeeping("b", grouped=True, calls=calls)]
    outcomes = execute_plan(plan(tmp_path, runners, persistent=True), repeat=2,
                            on_end=lambda o: ended.append(f"{o.framework}/{o.case.name}"))
    # "a"'s pairs run in this process first, in plan order, while "b"'s first worker group starts
    # beside them; then each of "b"'s groups runs every case of its key and is closed.
    assert calls == [("prestart", "b", 1, "one"), ("a", ["one"], False, 2), ("a", ["dp2"], False, 2),
                     ("a", ["fails"], False, 2), ("a", ["dp4"], False, 2), ("a", ["dp2_again"], False, 2),
                     ("b", ["one", "fails"], True, 2), ("close", "b", 1),
                     ("b", ["dp2", "dp2_again"], True, 2), ("close", "b", 2)]
    assert ended == ["b/dp4", "a/one", "a/dp2", "a/fails", "a/dp4", "a/dp2_again", "b/one", "b/fails", "b/dp2",
                     "b/dp2_again"]
    assert [(o.framework, o.case.name, o.skipped or o.record.status) for o in outcomes] == [
        ("a", "one", "ok"), ("b", "one", "ok"), ("a", "dp2", "ok"), ("b", "dp2", "ok"), ("a", "fails", "failed"),
        ("b", "fails", "failed"), ("a", "dp4", "ok"), ("b", "dp4", "too wide"), ("a", "dp2_again", "ok"),
        ("b", "dp2_again", "ok")]


def test_without_persistent_workers_every_pair_runs_alone(tmp_path):
    calls = []
    runners = [Bookkeeping("b", grouped=True, calls=calls)]
    execute_plan(plan(tmp_path, runners, persistent=False))
    assert calls == [("b", [name], False, 1) for name in ("one", "dp2", "fails", "dp2_again")]


def test_an_interrupted_plan_discards_its_groups(tmp_path):
    """Ctrl-C while a group is open (or prestarted): no rank may outlive lockstep."""
    calls = []

    class Interrupting(Bookkeeping):
        def run_many(self, pairs, *args, **kwargs):
            raise KeyboardInterrupt

    runners = [Interrupting("a", grouped=False, calls=calls), Bookkeeping("b", grouped=True, calls=calls)]
    try:
        execute_plan(plan(tmp_path, runners, persistent=True))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was swallowed")
    assert calls == [("prestart", "b", 1, "one"), ("discard", "b", 1)]


def test_a_group_started_before_the_plan_is_used_or_stopped(tmp_path):
    """`start_first_group_early` guesses the first group before the plan: execute_plan runs that
    key's cases in it when the plan agrees, and stops a group it does not need first."""
    calls = []
    runners = [Bookkeeping("a", grouped=False, calls=calls), Bookkeeping("b", grouped=True, calls=calls)]
    p = plan(tmp_path, runners, persistent=True)
    p.early_groups = {("b", 1): BookkeepingGroup("b-early", 1, calls), ("b", 4): BookkeepingGroup("b-early", 4, calls)}
    execute_plan(p)
    assert p.early_groups == {}
    # b's world-1 cases run in the early group of that key, closed after them; the guessed world-4
    # group, which no pair needs first, is stopped at once; the world-2 group is made when reached.
    assert calls[:2] == [("prestart", "b-early", 1, "one"), ("discard", "b-early", 4)]
    assert calls[-4:] == [("b", ["one", "fails"], True, 1), ("close", "b-early", 1),
                          ("b", ["dp2", "dp2_again"], True, 1), ("close", "b", 2)]


def test_early_groups_are_guessed_only_where_cheap_and_safe(tmp_path):
    from lockstep.execute import start_first_group_early
    from lockstep.plan import RunRequest
    from lockstep.runners.nodes import NodeLayout

    # Without --model a CPU run trains the CPU shapes the plan swaps in: no guess; nor without
    # persistent workers, on several nodes, or from a user's checkpoint (its shape is in its header).
    assert start_first_group_early(RunRequest(device="cpu", out=str(tmp_path))) == {}
    assert start_first_group_early(RunRequest(device="cpu", model="gpt2-tiny", persistent_workers=False)) == {}
    assert start_first_group_early(RunRequest(device="cpu", model="gpt2-tiny", llmc="x.bin")) == {}
    assert start_first_group_early(RunRequest(device="cpu", model="gpt2-tiny",
                                              nodes=NodeLayout(nnodes=2, node_rank=0, rdzv_endpoint="h:1"))) == {}
    # pytorch alone has no group for one device.
    assert start_first_group_early(RunRequest(device="cpu", model="gpt2-tiny", frameworks=["pytorch"])) == {}


def test_a_lone_framework_records_step_1_only_when_the_run_asks_for_it(tmp_path):
    from lockstep.execute import inputs_for

    lone = Bookkeeping("a", grouped=False, calls=[])
    alone = plan(tmp_path, [lone], persistent=False)
    assert inputs_for(alone, alone.cases[0], lone).capture is None  # nothing to certify
    asked = RunPlan(**{**alone.__dict__, "record_step1": True})  # bisect --expect identical
    request = inputs_for(asked, asked.cases[0], lone).capture
    assert request.path == str(tmp_path / "step1" / "a" / "one.npz") and request.reference is None
