"""A recompute case's twin: the case of the run that differs only in name and recompute, or one
lockstep adds, right after it."""

from __future__ import annotations

import dataclasses

from lockstep.cases.spec import CaseSpec
from lockstep.cases.twins import recompute_twins

BASIC = CaseSpec(name="2", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=10,
                 lr=1e-4)
UNIFORM2 = dataclasses.replace(BASIC, name="2_recompute_uniform2", activation_recompute=True,
                               recompute_method="uniform", recompute_num_layers=2)


def test_the_basic_case_of_the_run_is_the_twin():
    cases, twins = recompute_twins([BASIC, UNIFORM2])
    assert cases == [BASIC, UNIFORM2] and twins == {"2_recompute_uniform2": "2"}
    # feat/activation_checkpointing's test_config.json: the basic group's 2, the recompute group's twin of it.
    grouped = [dataclasses.replace(BASIC, group="basic"), dataclasses.replace(UNIFORM2, group="recompute")]
    assert recompute_twins(grouped) == (grouped, {"2_recompute_uniform2": "2"})


def test_a_missing_twin_is_added_right_after_its_case():
    other = dataclasses.replace(BASIC, name="other", lr=3e-4)
    cases, twins = recompute_twins([UNIFORM2, other])
    assert [c.name for c in cases] == ["2_recompute_uniform2", "2_recompute_uniform2_no_recompute", "other"]
    assert twins == {"2_recompute_uniform2": "2_recompute_uniform2_no_recompute"}
    assert dataclasses.replace(cases[1], name="2") == BASIC  # recompute off, nothing else changed
    # Two recompute settings of one case share one twin.
    block = dataclasses.replace(UNIFORM2, name="block2", recompute_method="block")
    cases, twins = recompute_twins([UNIFORM2, block])
    assert [c.name for c in cases] == ["2_recompute_uniform2", "2_recompute_uniform2_no_recompute", "block2"]
    assert set(twins.values()) == {"2_recompute_uniform2_no_recompute"}


def test_a_case_without_recompute_has_no_twin():
    assert recompute_twins([BASIC]) == ([BASIC], {})
