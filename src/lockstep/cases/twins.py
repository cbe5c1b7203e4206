"""Recompute twins: activation recompute trades compute for memory and must not change one bit of
training, so a case with recompute on is judged, per framework, against the same case with
recompute off on the same framework, bit for bit (compare/identity.py). The twin is a case of
the run that differs only in its name and recompute settings (InfiniTrain's feat/activation_checkpointing
test_config.json pairs `2_recompute_uniform2` with its basic `2`); where the run has none, lockstep
adds `<case>_no_recompute` and runs it on the same frameworks.
"""

from __future__ import annotations

import dataclasses

from lockstep.cases.spec import CaseSpec

TWIN_SUFFIX = "_no_recompute"


def without_recompute(case: CaseSpec) -> CaseSpec:
    """The case with recompute off (the defaults CaseSpec gives a case without it)."""
    return dataclasses.replace(case, activation_recompute=False, recompute_granularity="full",
                               recompute_method="none", recompute_num_layers=0)


def _same_training(a: CaseSpec, b: CaseSpec) -> bool:
    """Equal but for their labels: the name, and the test-config group a case came from."""
    return dataclasses.replace(a, name="", group=None) == dataclasses.replace(b, name="", group=None)


def recompute_twins(cases: list[CaseSpec]) -> tuple[list[CaseSpec], dict[str, str]]:
    """The cases with every recompute case's twin present (an added twin right after its case), and
    {recompute case: its twin}."""
    out: list[CaseSpec] = []
    twins: dict[str, str] = {}
    names = {c.name for c in cases}
    for case in cases:
        out.append(case)
        if not case.activation_recompute:
            continue
        plain = without_recompute(case)
        twin = next((c for c in cases + out if _same_training(c, plain)), None)
        if twin is None:
            name = case.name + TWIN_SUFFIX
            while name in names:
                name += "_"
            twin = dataclasses.replace(plain, name=name)
            out.append(twin)
            names.add(name)
        twins[case.name] = twin.name
    return out, twins
