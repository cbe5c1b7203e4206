"""Recompute twins judged (cases/twins.py): each framework's run of a recompute case against its own
run of the case's twin without recompute, bit for bit (compare/identity.py), into summary.json's
"twins". A twin that is not identical fails the run, whatever either case's loss threshold says.
"""

from __future__ import annotations

from lockstep.compare.identity import judge_identity
from lockstep.formats.run_record import RunRecord


def judge_twins(records: dict[tuple[str, str], RunRecord], twins: dict[str, str]) -> list[dict]:
    """One entry per (framework, recompute case) whose case and twin both trained to the end."""
    entries = []
    for (framework, case), record in records.items():
        twin = twins.get(case)
        base = records.get((framework, twin)) if twin else None
        if base is None or not (record.ok and base.ok):
            continue  # a skipped or failed run is said where skips and failures are
        verdict = judge_identity(base, record)
        entries.append({"framework": framework, "case": case, "twin": twin, "passed": verdict.identical,
                        **verdict.to_json()})
    return entries


def twin_line(entry: dict) -> str:
    return f"recompute {entry['framework']}/{entry['case']} vs {entry['twin']}: {entry['sentence']}"
