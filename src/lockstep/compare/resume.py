"""The resume judge: did a run saved at step N and resumed train steps N+1.. as the run that
never stopped (docs/reference/checkpoints.md, "Judging a resume")?

One verdict per (uninterrupted, resumed) pair of one framework:
- resume exact: every loss after the resume point bitwise equal, what a deterministic framework owes;
- resume within threshold: every one within the verdict policy's threshold for the case's dtype
  (compare/policy.py), and by how much;
- resume broken, with its cause where the losses tell it. The resumed losses are matched against
  candidates of what a broken resume trains:
  * the uninterrupted run shifted: resumed step N+k equal to its step k (the checkpoint was not
    loaded at all: a fresh run from batch 0) or to its step M+k (step M's state was loaded);
  * alternatives the caller trains with the reference from the same step-N checkpoint, each
    labelled with its cause: the data stream restarted at batch 0 or shifted, a fresh Adam
    (optimizer state lost), Adam's moments zeroed, its step count reset
    (runners/pytorch/alternatives.py makes them);
  * per rank, where both records hold every rank's losses (`rank_losses` in the meta): some
    ranks equal and others not is a shard that was not restored.
  A resumed run that equals a candidate bitwise is broken with that cause even when it is
  within the threshold of the uninterrupted run; an alternative that trains the same losses as
  the uninterrupted run (SGD has no optimizer state to lose) tells nothing and is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from lockstep.compare.policy import loss_threshold
from lockstep.errors import LockstepError
from lockstep.formats.run_record import RunRecord


class ResumeVerdictClass(str, Enum):
    EXACT = "resume exact"
    WITHIN_THRESHOLD = "resume within threshold"
    BROKEN = "resume broken"

    @property
    def passes(self) -> bool:
        return self is not ResumeVerdictClass.BROKEN


class ResumeCause(str, Enum):
    NOT_RESUMED = "not resumed: trained from step 0 (the checkpoint was not loaded)"
    OTHER_STEP = "another step's state was loaded"
    DATA_RESTARTED = "data stream restarted at batch 0"
    DATA_SHIFTED = "data stream shifted"
    OPTIMIZER_STATE_LOST = "optimizer state lost"
    ADAM_STEP_RESET = "Adam step count reset"
    SHARD_NOT_RESTORED = "a shard not restored"
    UNTOLD = "cause not told (matches no candidate)"


@dataclass(frozen=True)
class ResumeAlternative:
    """What a resume broken by `cause` trains: a continuation from the same checkpoint made
    the broken way (by the reference), and a sentence saying how it was made."""

    cause: ResumeCause
    what: str
    record: RunRecord


@dataclass(frozen=True)
class CandidateMatch:
    cause: ResumeCause
    what: str
    max_abs_diff: float
    exact: bool
    steps: int  # how many steps were compared

    def to_json(self) -> dict:
        return {"cause": self.cause.value, "what": self.what, "max_abs_diff": self.max_abs_diff,
                "exact": self.exact, "steps": self.steps}


@dataclass(frozen=True)
class ResumeVerdict:
    verdict: ResumeVerdictClass
    resume_from: int
    max_abs_diff: float  # resumed vs uninterrupted over the steps after the resume point
    worst_step: int
    threshold: float
    threshold_source: str
    cause: ResumeCause | None = None
    cause_detail: str = ""
    candidates: list[CandidateMatch] = field(default_factory=list)  # closest first
    uninformative: list[str] = field(default_factory=list)  # alternatives equal to the uninterrupted run

    @property
    def passes(self) -> bool:
        return self.verdict.passes

    def sentence(self) -> str:
        where = f"after step {self.resume_from}"
        if self.verdict is ResumeVerdictClass.EXACT:
            return f"resume exact: every loss {where} bitwise equal to the uninterrupted run"
        size = f"max |dloss| {self.max_abs_diff:.3g} at step {self.worst_step}"
        if self.verdict is ResumeVerdictClass.WITHIN_THRESHOLD:
            return f"resume within threshold: {size} <= {self.threshold:g} ({self.threshold_source})"
        return f"resume broken ({self.cause.value}): {size} {where}" + (f"; {self.cause_detail}" if self.cause_detail else "")

    def to_json(self) -> dict:
        return {"verdict": self.verdict.value, "resume_from": self.resume_from, "max_abs_diff": self.max_abs_diff,
                "worst_step": self.worst_step, "threshold": self.threshold, "threshold_source": self.threshold_source,
                "cause": self.cause.value if self.cause else None, "cause_detail": self.cause_detail,
                "candidates": [c.to_json() for c in self.candidates], "uninformative": self.uninformative,
                "sentence": self.sentence()}


def _losses(record: RunRecord, what: str) -> dict[int, float]:
    if not record.ok:
        raise LockstepError(f"{record.source or what}: the {what} run failed ({record.error}); its resume cannot be judged")
    out = {}
    for s in record.steps:
        if not math.isfinite(s.loss):
            raise LockstepError(f"{record.source or what}: step {s.step} loss is {s.loss} (non-finite)")
        out[s.step] = s.loss
    return out


def _resume_point(resumed: RunRecord) -> int:
    spec = (resumed.meta.get("case_spec") or {}).get("checkpoint") or {}
    if spec.get("resume_from") is not None:
        return int(spec["resume_from"])
    if not resumed.steps:
        raise LockstepError(f"{resumed.source or 'resumed run'}: no steps, and no resume_from in its case")
    return resumed.steps[0].step - 1


def _match(resumed: dict[int, float], other: dict[int, float], offset: int) -> tuple[float, bool, int]:
    """max |resumed[s] - other[s + offset]| over the steps both have; (inf, False, 0) for none."""
    pairs = [(v, other[s + offset]) for s, v in resumed.items() if s + offset in other]
    if not pairs:
        return math.inf, False, 0
    return max(abs(a - b) for a, b in pairs), all(a == b for a, b in pairs), len(pairs)


def judge_resume(uninterrupted: RunRecord, resumed: RunRecord, alternatives: Sequence[ResumeAlternative] = (),
                 resume_from: int | None = None, user_fp32: float | None = None,
                 user_bf16: float | None = None) -> ResumeVerdict:
    """The verdict on `resumed` (steps N+1..) against `uninterrupted` (steps 1..), the causes
    told by the shifted uninterrupted run, `alternatives` and per-rank losses."""
    n = _resume_point(resumed) if resume_from is None else resume_from
    full, res = _losses(uninterrupted, "uninterrupted"), _losses(resumed, "resumed")
    res = {s: v for s, v in res.items() if s > n}
    missing = [s for s in res if s not in full]
    if not res:
        raise LockstepError(f"{resumed.source or 'resumed run'}: no step after the resume point {n}")
    if missing:
        raise LockstepError(f"{uninterrupted.source or 'uninterrupted run'}: has no step {missing[0]}, "
                            "which the resumed run trained")
    dtype = resumed.dtype or uninterrupted.dtype or "float32"
    threshold, source = loss_threshold(resumed.case, dtype, uninterrupted, resumed, user_fp32, user_bf16)
    worst_step = max(res, key=lambda s: abs(res[s] - full[s]))
    diff, exact, _ = _match(res, full, 0)
    base = dict(resume_from=n, max_abs_diff=diff, worst_step=worst_step, threshold=threshold, threshold_source=source)

    candidates, uninformative = [], []
    for offset in range(-n, max(full) - n):
        if offset == 0:
            continue
        d, e, count = _match(res, full, offset)
        if count:
            cause = ResumeCause.NOT_RESUMED if offset == -n else ResumeCause.OTHER_STEP
            what = ("the uninterrupted run from step 1" if offset == -n
                    else f"the uninterrupted run from step {n + offset + 1} (step {n + offset}'s state)")
            candidates.append(CandidateMatch(cause, what, d, e, count))
    for alt in alternatives:
        losses = {s: v for s, v in _losses(alt.record, alt.what).items() if s > n}
        if all(losses.get(s) == full[s] for s in res):
            uninformative.append(alt.what)
            continue
        d, e, count = _match(res, losses, 0)
        candidates.append(CandidateMatch(alt.cause, alt.what, d, e, count))
    candidates.sort(key=lambda c: (not c.exact, c.max_abs_diff))
    base.update(candidates=candidates, uninformative=uninformative)

    if exact:
        return ResumeVerdict(ResumeVerdictClass.EXACT, **base)
    shard = _shard_not_restored(uninterrupted, resumed, n)
    if shard:
        return ResumeVerdict(ResumeVerdictClass.BROKEN, cause=ResumeCause.SHARD_NOT_RESTORED, cause_detail=shard, **base)
    exact_matches = [c for c in candidates if c.exact]
    if exact_matches:
        return ResumeVerdict(ResumeVerdictClass.BROKEN, cause=exact_matches[0].cause,
                             cause_detail=_detail(exact_matches, "bitwise equal to"), **base)
    if diff <= threshold:
        close = [c for c in candidates if c.max_abs_diff <= threshold]
        note = (f"at this threshold it cannot be told from {'; '.join(c.what for c in close)}" if close else "")
        return ResumeVerdict(ResumeVerdictClass.WITHIN_THRESHOLD, cause_detail=note, **base)
    close = [c for c in candidates if c.max_abs_diff <= threshold]
    if close:
        return ResumeVerdict(ResumeVerdictClass.BROKEN, cause=close[0].cause,
                             cause_detail=_detail(close, f"within {threshold:g} of"), **base)
    nearest = f"; the nearest candidate, {candidates[0].what}, is {candidates[0].max_abs_diff:.3g} away" if candidates else ""
    return ResumeVerdict(ResumeVerdictClass.BROKEN, cause=ResumeCause.UNTOLD,
                         cause_detail=f"no candidate within {threshold:g}{nearest}", **base)


def _detail(matches: list[CandidateMatch], how: str) -> str:
    first = matches[0]
    text = f"the resumed losses are {how} {first.what} ({first.steps} steps, max |dloss| {first.max_abs_diff:.3g})"
    same = [m.what for m in matches[1:] if m.exact == first.exact and m.max_abs_diff == first.max_abs_diff]
    return text + (f"; equally close: {'; '.join(same)}" if same else "")


def _shard_not_restored(uninterrupted: RunRecord, resumed: RunRecord, n: int) -> str:
    """Where both records hold every rank's losses (`rank_losses`: step -> one loss per rank),
    the ranks whose first resumed step differs while others' are bitwise equal; "" otherwise."""
    full, res = uninterrupted.meta.get("rank_losses") or {}, resumed.meta.get("rank_losses") or {}
    key = str(n + 1)
    if key not in full or key not in res or len(full[key]) != len(res[key]) or len(res[key]) < 2:
        return ""
    equal = [r for r, (a, b) in enumerate(zip(full[key], res[key])) if a == b]
    differ = [r for r in range(len(res[key])) if r not in equal]
    if not equal or not differ:
        return ""
    return (f"at step {n + 1} rank(s) {', '.join(map(str, differ))} differ from the uninterrupted run while "
            f"rank(s) {', '.join(map(str, equal))} are bitwise equal: their part of the state was not restored")


def resume_entry(framework: str, case: str, resume_case: str, verdict: ResumeVerdict | None = None,
                 error: str | None = None) -> dict:
    """One resume's line of summary.json's "resumes" section."""
    entry = {"framework": framework, "case": case, "resume_case": resume_case}
    if verdict is not None:
        entry.update(verdict.to_json(), passed=verdict.passes)
    else:
        entry.update(verdict=None, error=error, passed=False)
    return entry
