"""The shape roofline (lockstep/roofline.py): the exact GEMMs of a case, their FLOPs against the
MFU convention, the cache (hit, a corrupt file), and run.json's rooflines read back for a record."""

from __future__ import annotations

import json

import pytest

from lockstep.cases.spec import CaseSpec
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record
from lockstep.models import SHAPES
from lockstep.models.gpt2.config import GPT2Config
from lockstep.roofline import (RUN_JSON_KEY, ShapeRoofline, cache_key, cache_path, case_gemms, measure_case,
                               measure_run, roofline_of_record, unique_shapes)

# A GPT-2 small enough that timing its GEMMs on a loaded CPU takes milliseconds.
MICRO = GPT2Config(max_seq_len=8, vocab_size=16, num_layers=1, num_heads=2, channels=8, padded_vocab_size=16)


def _table(gemms):
    return [(g.name, g.batch, g.m, g.n, g.k, g.count, g.flops) for g in gemms]


def test_gpt2_tiny_gemms_exactly():
    # gpt2-tiny: L=2 NH=12 C=96 Vp=50304; B=4, T=64: 256 token rows; head_dim 8.
    assert _table(case_gemms(SHAPES["gpt2-tiny"].config, 4, 64)) == [
        ("qkv forward", 1, 256, 288, 96, 2, 28_311_552),
        ("qkv input gradient", 1, 256, 96, 288, 2, 28_311_552),
        ("qkv weight gradient", 1, 288, 96, 256, 2, 28_311_552),
        ("attention out forward", 1, 256, 96, 96, 2, 9_437_184),
        ("attention out input gradient", 1, 256, 96, 96, 2, 9_437_184),
        ("attention out weight gradient", 1, 96, 96, 256, 2, 9_437_184),
        ("mlp up forward", 1, 256, 384, 96, 2, 37_748_736),
        ("mlp up input gradient", 1, 256, 96, 384, 2, 37_748_736),
        ("mlp up weight gradient", 1, 384, 96, 256, 2, 37_748_736),
        ("mlp down forward", 1, 256, 96, 384, 2, 37_748_736),
        ("mlp down input gradient", 1, 256, 384, 96, 2, 37_748_736),
        ("mlp down weight gradient", 1, 96, 384, 256, 2, 37_748_736),
        ("lm head forward", 1, 256, 50304, 96, 1, 2_472_542_208),  # the tied wte: all Vp rows
        ("lm head input gradient", 1, 256, 96, 50304, 1, 2_472_542_208),
        ("lm head weight gradient", 1, 50304, 96, 256, 1, 2_472_542_208),
        ("attention scores forward", 48, 64, 64, 8, 2, 6_291_456),  # B x NH = 48 (sequence, head) pairs
        ("attention values forward", 48, 64, 8, 64, 2, 6_291_456),
        ("attention scores gradient", 48, 64, 64, 8, 2, 6_291_456),
        ("attention values gradient", 48, 64, 8, 64, 2, 6_291_456),
        ("attention query gradient", 48, 64, 8, 64, 2, 6_291_456),
        ("attention key gradient", 48, 64, 8, 64, 2, 6_291_456),
    ]


def test_llama3_tiny_gemms_exactly():
    # llama3-tiny: L=4 NH=8 kv=4 C=128 FFN=512 V=128256; B=4, T=64; qkv rows (8 + 2x4) x 16 = 256.
    gemms = case_gemms(SHAPES["llama3-tiny"].config, 4, 64)
    assert _table(gemms) == [
        ("qkv forward", 1, 256, 256, 128, 4, 67_108_864),
        ("qkv input gradient", 1, 256, 128, 256, 4, 67_108_864),
        ("qkv weight gradient", 1, 256, 128, 256, 4, 67_108_864),
        ("attention out forward", 1, 256, 128, 128, 4, 33_554_432),
        ("attention out input gradient", 1, 256, 128, 128, 4, 33_554_432),
        ("attention out weight gradient", 1, 128, 128, 256, 4, 33_554_432),
        ("mlp up forward", 1, 256, 512, 128, 4, 134_217_728),
        ("mlp up input gradient", 1, 256, 128, 512, 4, 134_217_728),
        ("mlp up weight gradient", 1, 512, 128, 256, 4, 134_217_728),
        ("mlp gate forward", 1, 256, 512, 128, 4, 134_217_728),
        ("mlp gate input gradient", 1, 256, 128, 512, 4, 134_217_728),
        ("mlp gate weight gradient", 1, 512, 128, 256, 4, 134_217_728),
        ("mlp down forward", 1, 256, 128, 512, 4, 134_217_728),
        ("mlp down input gradient", 1, 256, 512, 128, 4, 134_217_728),
        ("mlp down weight gradient", 1, 128, 512, 256, 4, 134_217_728),
        ("lm head forward", 1, 256, 128256, 128, 1, 8_405_385_216),
        ("lm head input gradient", 1, 256, 128, 128256, 1, 8_405_385_216),
        ("lm head weight gradient", 1, 128256, 128, 256, 1, 8_405_385_216),
        ("attention scores forward", 32, 64, 64, 16, 4, 16_777_216),
        ("attention values forward", 32, 64, 16, 64, 4, 16_777_216),
        ("attention scores gradient", 32, 64, 64, 16, 4, 16_777_216),
        ("attention values gradient", 32, 64, 16, 64, 4, 16_777_216),
        ("attention query gradient", 32, 64, 16, 64, 4, 16_777_216),
        ("attention key gradient", 32, 64, 16, 64, 4, 16_777_216),
    ]
    assert sum(g.flops for g in gemms) == 26_826_768_384


@pytest.mark.parametrize("name, total, non_matrix", [
    ("gpt2-tiny", 7_795_113_984, 2_688),  # per layer 2 LNs (4C) + biases 3C + C + 4C + C; final LN 2C
    ("llama3-tiny", 26_826_768_384, 1_152),  # 2 RMSNorm weights per layer (2C), final norm C
    ("qwen3-tiny", 31_180_455_936, 1_280),  # and q/k norms (2 x head_dim) per layer
    ("mixtral-tiny", 12_930_514_944, 320),  # top-2 of 8 experts: only the routed experts' rows
])
def test_gemm_flops_are_the_mfu_convention_less_norms_and_biases(name, total, non_matrix):
    config, tokens = SHAPES[name].config, 4 * 64
    assert sum(g.flops for g in case_gemms(config, 4, 64)) == total
    assert total == config.flops_per_token(64) * tokens - 6 * non_matrix * tokens


def test_lora_case_has_no_weight_gradients_of_its_frozen_weights():
    full, lora = case_gemms(SHAPES["gpt2-tiny"].config, 4, 64), case_gemms(SHAPES["gpt2-tiny"].config, 4, 64, lora=True)
    assert [g.name for g in full if g not in lora] == [g.name for g in full if g.name.endswith("weight gradient")]
    assert len(lora) == 21 - 5


def test_measured_then_cached_then_a_corrupt_cache_is_measured_again(tmp_path):
    first = measure_case(MICRO, 1, 4, "float32", "cpu", 1, tmp_path, budget_s=0.05)
    assert not first.cached and first.gemm_seconds > 0 and first.tokens == 4
    assert first.flops == sum(g.flops for g in case_gemms(MICRO, 1, 4))
    files = list((tmp_path / "roofline").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["gemm_seconds"] == first.gemm_seconds

    hit = measure_case(MICRO, 1, 4, "float32", "cpu", 2, tmp_path, budget_s=0.05)
    assert hit.cached and hit.gemm_seconds == first.gemm_seconds
    assert hit.tokens_per_s == pytest.approx(2 * 4 / first.gemm_seconds)  # two devices: perfect scaling

    for garbage in ("{not json", json.dumps({"key": "another", "gemm_seconds": 1.0}),
                    json.dumps({"key": json.loads(files[0].read_text())["key"], "gemm_seconds": -1})):
        files[0].write_text(garbage)
        again = measure_case(MICRO, 1, 4, "float32", "cpu", 1, tmp_path, budget_s=0.05)
        assert not again.cached and again.gemm_seconds > 0
        assert json.loads(files[0].read_text())["gemm_seconds"] == again.gemm_seconds  # rewritten whole
    assert list((tmp_path / "roofline").iterdir()) == files  # no temporary file left behind


def test_cache_key_separates_device_dtype_torch_and_shape(tmp_path):
    gemms = case_gemms(MICRO, 1, 4)
    key = cache_key("NVIDIA H100 80GB HBM3", "bfloat16", "2.9.0", gemms)
    assert key["shapes"] == sorted([*s, c] for s, c in unique_shapes(gemms).items())
    others = [cache_key("NVIDIA H200", "bfloat16", "2.9.0", gemms), cache_key(key["device_name"], "float32", "2.9.0", gemms),
              cache_key(key["device_name"], "bfloat16", "2.10.0", gemms),
              cache_key(key["device_name"], "bfloat16", "2.9.0", case_gemms(MICRO, 2, 4))]
    assert len({cache_path(tmp_path, k) for k in [key, *others]}) == 5


def test_an_unwritable_cache_costs_a_measurement_not_the_run(tmp_path):
    blocked = tmp_path / "cache"
    blocked.mkdir()
    (blocked / "roofline").write_text("a file where the cache's folder would be")
    r = measure_case(MICRO, 1, 4, "float32", "cpu", 1, blocked, budget_s=0.05)
    assert not r.cached and r.gemm_seconds > 0


def _case(name: str, **kw) -> CaseSpec:
    return CaseSpec(name=name, model="micro", dtype="float32", micro_batch=1, seq_len=4, total_batch=4, steps=2,
                    lr=1e-4, **kw)


def test_run_rooflines_for_run_json_and_read_back_for_a_record(tmp_path):
    cases = [_case("a"), _case("b", dp=2)]
    rooflines = measure_run(cases, {"a": MICRO, "b": MICRO}, "cpu", tmp_path / "cache")
    assert set(rooflines) == {"a", "b"} and rooflines["b"]["devices"] == 2 and rooflines["b"]["cached"]
    run = tmp_path / "run"
    (run / "pytorch").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({RUN_JSON_KEY: rooflines}))
    record = RunRecord("pytorch", "b", [StepRecord(1, 1.0, 1.0, 4.0)], source=str(run / "pytorch" / "b.jsonl"))
    assert roofline_of_record(record) is None  # no such file: not a record of this run
    write_run_record(run / "pytorch" / "b.jsonl", record)
    back = roofline_of_record(record)
    assert back == ShapeRoofline.from_json(rooflines["b"]) and back.tokens_per_s == rooflines["b"]["tokens_per_s"]
    elsewhere = RunRecord("pytorch", "b", [], source=str(tmp_path / "loose" / "x" / "b.jsonl"))
    assert roofline_of_record(elsewhere) is None
    (run / "run.json").write_text(json.dumps({RUN_JSON_KEY: {"b": {"gemm_seconds": "soon"}}}))
    assert roofline_of_record(record) is None  # not a roofline lockstep wrote: none, never a crash


def test_a_probe_that_fails_is_said_and_the_other_cases_keep_theirs(tmp_path):
    class ForeignShape:  # a plugin family's config without the sizes the GEMMs are built from
        family = "foreign"

    said = []
    rooflines = measure_run([_case("a"), _case("b")], {"a": ForeignShape(), "b": MICRO}, "cpu", tmp_path,
                            say=said.append)
    assert set(rooflines) == {"b"}
    assert len(said) == 1 and said[0].startswith("roofline of a: not measured (")

    class Silent(Exception):  # an error without a message still names itself
        pass

    class Refusing(GPT2Config):
        @property
        def head_dim(self):
            raise Silent()

    said.clear()
    assert measure_run([_case("a")], {"a": Refusing()}, "cpu", tmp_path, say=said.append) == {}
    assert said == ["roofline of a: not measured (Silent)"]
