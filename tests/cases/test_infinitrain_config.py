"""InfiniTrain's scripts/test_config.json read as it is: every test of every group becomes a case
with the fields InfiniTrain's examples would train, and anything else is one sentence."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lockstep.cases.infinitrain_config import load_test_config, parse_test_config
from lockstep.cases.matrix import load_matrix
from lockstep.cases.spec import CaseSpec, CheckpointSpec, LoraSpec
from lockstep.cli import main
from lockstep.errors import CaseError, LockstepError

INFINITRAIN_COMMIT = "b24d92f"
BIG = {"num_iteration": 10, "total_batch_size": 5120}
LAYOUTS = {  # the shape of each numbered basic test (InfiniTrain's ids 1..8)
    "1": {},
    "2": {**BIG, "batch_size": 80},
    "3": {**BIG, "nthread_per_process": 8, "batch_size": 10},
    "4": {**BIG, "nthread_per_process": 8, "batch_size": 40, "tensor_parallel": 4},
    "5": {**BIG, "nthread_per_process": 8, "batch_size": 40, "tensor_parallel": 4, "sequence_parallel": True},
    "6": {**BIG, "nthread_per_process": 8, "batch_size": 10, "pipeline_parallel": 8},
    "7": {**BIG, "nthread_per_process": 4, "batch_size": 10, "pipeline_parallel": 4, "virtual_pipeline_parallel": 2},
    "8": {**BIG, "nthread_per_process": 8, "batch_size": 40, "tensor_parallel": 2, "sequence_parallel": True,
          "pipeline_parallel": 2, "virtual_pipeline_parallel": 2},
}
LORA = {  # id -> (fp32 rank, alpha, bf16 rank, alpha, targets), as b24d92f's lora group sets them
    "1": (8, 16.0, 8, 16.0, "c_attn,attn.c_proj"), "2": (8, 16.0, 8, 16.0, "c_attn,attn.c_proj"),
    "3": (8, 16.0, 8, 16.0, "c_attn,attn.c_proj"), "4": (4, 8.0, 16, 32.0, "c_attn,c_fc,c_proj"),
    "5": (4, 8.0, 16, 32.0, "attn.c_proj,c_fc,c_proj"), "6": (4, 8.0, 16, 32.0, "c_attn,attn.c_proj,c_fc"),
    "7": (4, 8.0, 16, 32.0, "c_attn,c_proj"), "8": (4, 8.0, 16, 32.0, "c_fc,c_proj"),
}
VARIABLES = {"BUILD_DIR": "../build", "GPT2_INPUT_BIN": "/nowhere/gpt2/tiny_shakespeare_train.bin",
             "GPT2_LLMC_FILEPATH": "/nowhere/gpt2/gpt2_124M.bin",
             "LLAMA3_INPUT_BIN": "/nowhere/llama3/tiny_shakespeare_train.bin",
             "LLAMA3_LLMC_FILEPATH": "/nowhere/llama3/llama3.2_1B_fp32.bin", "PROFILE_LOG_DIR": "./profile_logs",
             "LOG_DIR": "./logs", "CKPT_ROOT_DIR": "/nowhere/ckpt", "COMPARE_LOG_DIR": "", "RUN_CTEST": "true",
             "RUN_PROFILE_TEST": "false"}
CKPT_3D = {"nthread_per_process": 8, "num_iteration": 50, "save_interval": 10, "batch_size": 40,
           "total_batch_size": 5120, "tensor_parallel": 2, "sequence_parallel": True, "pipeline_parallel": 2,
           "virtual_pipeline_parallel": 2}


def test_config_like_b24d92f() -> dict:
    """A document of the structure and keys of InfiniTrain b24d92f's scripts/test_config.json
    (52 tests in four groups), built here rather than copied."""
    basic = []
    for i, layout in LAYOUTS.items():
        for dtype, suffix in (("float32", ""), ("bfloat16", "_bfloat16")):
            basic.append({"id": i + suffix, "args": {"dtype": dtype, **layout}})
    zero = []
    for i in ("3", "4", "5", "8"):
        for dtype, suffix in (("float32", ""), ("bfloat16", "_bfloat16")):
            for stage, name in ((1, "distopt"), (2, "zero2")):
                if i == "8" and stage == 2:
                    continue
                zero.append({"id": f"{i}{suffix}_{name}", "args": {"dtype": dtype, **LAYOUTS[i], "zero_stage": stage}})
    lora = []
    for i, (r32, a32, r16, a16, targets) in LORA.items():
        for dtype, suffix, r, a in (("float32", "", r32, a32), ("bfloat16", "_bfloat16", r16, a16)):
            lora.append({"id": f"{i}_lora{suffix}", "args": {"dtype": dtype, **LAYOUTS[i], "lora_rank": r,
                                                             "lora_alpha": a, "lora_target_modules": targets}})
    ckpt = [
        {"id": "ckpt_no_resume", "args": {"num_iteration": 50, "save_interval": 10, "save": "@CKPT_ROOT_DIR@/no_resume"}},
        {"id": "ckpt_resume", "args": {"num_iteration": 50, "save_interval": 10,
                                       "load": "@CKPT_ROOT_DIR@/no_resume/checkpoint_step_000030",
                                       "save": "@CKPT_ROOT_DIR@/base_resume"}},
        {"id": "ckpt_bfloat16", "args": {"dtype": "bfloat16", "num_iteration": 50, "save_interval": 10,
                                         "save": "@CKPT_ROOT_DIR@/bfloat16_no_resume"}},
        {"id": "ckpt_bfloat16_resume", "args": {"dtype": "bfloat16", "num_iteration": 50, "save_interval": 10,
                                                "load": "@CKPT_ROOT_DIR@/bfloat16_no_resume/checkpoint_step_000030",
                                                "save": "@CKPT_ROOT_DIR@/bfloat16_resume"}},
        {"id": "ckpt_3d_ddp_tp_pp", "args": {**CKPT_3D, "save": "@CKPT_ROOT_DIR@/3d_ddp2_tp2_pp2_no_resume",
                                             "save_optimizer_state": True, "max_checkpoint_keep": 5}},
        {"id": "ckpt_3d_ddp_tp_pp_resume", "args": {
            **CKPT_3D, "load": "@CKPT_ROOT_DIR@/3d_ddp2_tp2_pp2_no_resume/checkpoint_step_000030",
            "save": "@CKPT_ROOT_DIR@/3d_tp2_pp2_resume", "save_optimizer_state": True, "max_checkpoint_keep": 5}},
    ]
    return {"variables": dict(VARIABLES),
            "basic_compile_commands": [{"id": "build_1", "cmd": "cmake -DUSE_CUDA=ON -DUSE_NCCL=ON .. && make -j"}],
            "test_groups": [{"tag": "basic", "tests": basic}, {"tag": "zero", "tests": zero},
                            {"tag": "lora", "tests": lora}, {"tag": "checkpoint", "tests": ckpt}]}


test_config_like_b24d92f.__test__ = False  # a builder, not a test


def expected_case(family: str, model: str, test_id: str) -> CaseSpec:
    """What InfiniTrain's example trains for the test, written from the test id alone."""
    head = test_id.split("_")[0]
    layout = CKPT_3D if test_id.startswith("ckpt_3d") else LAYOUTS.get(head, {})
    world, tp, pp = (layout.get(k, 1) for k in ("nthread_per_process", "tensor_parallel", "pipeline_parallel"))
    lora = checkpoint = None
    if "_lora" in test_id:
        r32, a32, r16, a16, targets = LORA[head]
        bf16 = test_id.endswith("bfloat16")
        lora = LoraSpec(rank=r16 if bf16 else r32, alpha=a16 if bf16 else a32, target_modules=tuple(targets.split(",")))
    if test_id.startswith("ckpt"):
        resumes = test_id.endswith("_resume") and test_id != "ckpt_no_resume"
        source = {"ckpt_resume": "ckpt_no_resume", "ckpt_bfloat16_resume": "ckpt_bfloat16",
                  "ckpt_3d_ddp_tp_pp_resume": "ckpt_3d_ddp_tp_pp"}.get(test_id)
        checkpoint = CheckpointSpec(save_interval=10, resume_from=30 if resumes else None,
                                    resume_case=f"{family}_{source}" if resumes else None,
                                    max_checkpoint_keep=5 if test_id.startswith("ckpt_3d") else 3)
    zero = 1 if test_id.endswith("distopt") else 2 if test_id.endswith("zero2") else 0
    group = ("checkpoint" if test_id.startswith("ckpt") else "lora" if lora else "zero" if zero else "basic")
    return CaseSpec(name=f"{family}_{test_id}", model=model, dtype="bfloat16" if "bfloat16" in test_id else "float32",
                    micro_batch=layout.get("batch_size", 4), seq_len=64, total_batch=layout.get("total_batch_size", 256),
                    steps=50 if test_id.startswith("ckpt") else layout.get("num_iteration", 10), lr=1e-4 if family == "gpt2" else 1e-5,
                    dp=world // (tp * pp), tp=tp, pp=pp, vpp=layout.get("virtual_pipeline_parallel", 1),
                    sp=layout.get("sequence_parallel", False), zero=zero, lora=lora, checkpoint=checkpoint, group=group)


@pytest.mark.parametrize("model, family", [("gpt2", "gpt2"), ("llama3", "llama3"), ("gpt2-tiny", "gpt2"),
                                           ("llama3-tiny", "llama3")])
def test_all_52_tests_map_to_cases(model, family):
    doc = test_config_like_b24d92f()
    matrix = parse_test_config(doc, "test_config.json", model=model)
    ids = [t["id"] for g in doc["test_groups"] for t in g["tests"]]
    assert len(ids) == 52 and len(matrix.cases) == 52
    assert matrix.groups == ["basic", "zero", "lora", "checkpoint"]
    assert [c.name for c in matrix.cases] == [f"{family}_{i}" for i in ids]
    for case, test_id in zip(matrix.cases, ids):
        assert case == expected_case(family, model, test_id), test_id
    by_name = {c.name: c for c in matrix.cases}
    assert by_name[f"{family}_3_bfloat16_zero2"].dp == 8 and by_name[f"{family}_3_bfloat16_zero2"].zero == 2
    assert by_name[f"{family}_8_lora"].world_size == 8 and by_name[f"{family}_7_lora"].world_size == 4
    assert sum(c.lora is not None for c in matrix.cases) == 16
    assert sum(c.checkpoint is not None for c in matrix.cases) == 6


def test_without_a_model_both_families_in_the_drivers_order():
    matrix = parse_test_config(test_config_like_b24d92f(), "test_config.json")
    assert len(matrix.cases) == 104
    assert [c.name for c in matrix.cases[:4]] == ["gpt2_1", "llama3_1", "gpt2_1_bfloat16", "llama3_1_bfloat16"]
    assert {c.model for c in matrix.cases} == {"gpt2", "llama3"}


def test_groups_select_and_an_unknown_group_is_named():
    doc = test_config_like_b24d92f()
    cases = parse_test_config(doc, "t.json", model="gpt2", groups=["lora", "checkpoint"]).cases
    assert len(cases) == 22 and {c.group for c in cases} == {"lora", "checkpoint"}
    with pytest.raises(CaseError, match=r"^t\.json: no test group 'lorra' \(its groups: basic, zero, lora, checkpoint\)$"):
        parse_test_config(doc, "t.json", model="gpt2", groups=["lorra"])


def test_notes_say_what_replaces_the_files_paths():
    notes = parse_test_config(test_config_like_b24d92f(), "t.json", model="gpt2").notes
    assert "t.json: variables.GPT2_LLMC_FILEPATH = /nowhere/gpt2/gpt2_124M.bin does not exist here: " \
           "gpt2 cases train lockstep's seeded init" in notes
    assert "t.json: variables.GPT2_INPUT_BIN = /nowhere/gpt2/tiny_shakespeare_train.bin does not exist here: " \
           "gpt2 cases train lockstep's own token file" in notes
    assert not any("LLAMA3" in n for n in notes)  # only the chosen family's inputs
    assert any(n.startswith("t.json: variables.CKPT_ROOT_DIR = '/nowhere/ckpt' not used") for n in notes)


def test_an_existing_input_path_is_noted_not_silently_used(tmp_path):
    doc = test_config_like_b24d92f()
    init = tmp_path / "gpt2_124M.bin"
    init.write_bytes(b"x")
    doc["variables"]["GPT2_LLMC_FILEPATH"] = str(init)
    matrix = parse_test_config(doc, "t.json", model="gpt2")
    assert matrix.inputs["gpt2"].llmc == init and matrix.inputs["gpt2"].tokens is None
    assert f"t.json: variables.GPT2_LLMC_FILEPATH = {init} exists here, but gpt2 cases train lockstep's seeded " \
           f"init unless --llmc {init} is given" in matrix.notes


def _with_args(**args) -> dict:
    doc = test_config_like_b24d92f()
    doc["test_groups"][0]["tests"][2]["args"].update(args)  # test "2"
    return doc


@pytest.mark.parametrize("doc, message", [
    (_with_args(batch_size="eighty"), "t.json: test 2: arg batch_size = 'eighty' does not read as an integer"),
    (_with_args(batch_size=8.5), "t.json: test 2: arg batch_size = 8.5 is a number, but it must be an integer"),
    (_with_args(sequence_parallel=1), "t.json: test 2: arg sequence_parallel = 1 is an integer, but it must be a boolean"),
    (_with_args(dtype="float16"), "t.json: test 2: case gpt2_2: dtype 'float16' is not one of float32, bfloat16"),
    (_with_args(zero_stage=3), "t.json: test 2: case gpt2_2: zero is 3, must be one of 0, 1, 2"),
    (_with_args(total_batch_size=5000), "t.json: test 2: case gpt2_2: impossible batch split"),
    (_with_args(nthread_per_process=6, tensor_parallel=4),
     "t.json: test 2: nthread_per_process 6 is not a multiple of tensor_parallel x pipeline_parallel = 4 x 1"),
    (_with_args(lora_rank=4, lora_target_modules="c_fc2"),
     "t.json: test 2: arg lora_target_modules: c_fc2 names no linear layer of gpt2"),
    (_with_args(save="@NOPE@/x", save_interval=5), "t.json: test 2: arg save: @NOPE@ is not one of the file's variables"),
    (_with_args(save="/tmp/x"), "t.json: test 2: arg save is set but save_interval is 0; InfiniTrain refuses to start"),
    (_with_args(save_interval=5), "t.json: test 2: arg save_interval is 5 but save is not set"),
    (_with_args(load="/elsewhere/checkpoint_step_000030"),
     "t.json: test 2: arg load = '/elsewhere/checkpoint_step_000030' is no checkpoint a test of the file saves"),
    (_with_args(load="@CKPT_ROOT_DIR@/no_resume"), "is not a <save folder>/checkpoint_step_NNNNNN folder"),
    (_with_args(save="/tmp/own", save_interval=5, load="/tmp/own/checkpoint_step_000005"),
     "t.json: test 2: arg load = '/tmp/own/checkpoint_step_000005' is inside the test's own save folder '/tmp/own'; "
     "a test cannot resume from the checkpoints it is writing"),
    (_with_args(load="@CKPT_ROOT_DIR@/no_resume/checkpoint_step_000035"),
     "t.json: test 2: arg load asks for step 35, but test ckpt_no_resume saves steps 10, 20, 30, 40, 50"),
    (_with_args(load="@CKPT_ROOT_DIR@/no_resume/checkpoint_step_000010"),
     "t.json: test 2: arg load asks for step 10, but test ckpt_no_resume keeps only steps 30, 40, 50 (max_checkpoint_keep)"),
])
def test_every_bad_arg_is_one_sentence_naming_test_and_key(doc, message):
    with pytest.raises(CaseError) as info:
        parse_test_config(doc, "t.json", model="gpt2")
    assert message in str(info.value) and str(info.value).startswith("t.json: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(extra=1), "t.json: unknown top-level key(s) 'extra'"),
    (lambda d: d["test_groups"][1].update(name="z"), "t.json: group zero: unknown key(s) 'name'"),
    (lambda d: d["test_groups"][1]["tests"][0].update(cmd="x"), "t.json: test 3_distopt: unknown key(s) 'cmd'"),
    (lambda d: d["test_groups"][1]["tests"].append({"id": "1", "args": {}}),
     "t.json: test 1 is defined twice (groups basic and zero), both run by gpt2"),
    (lambda d: d.update(variables=[1]), "t.json: variables is an array, but it must be an object"),
    (lambda d: d.update(test_groups=[]), "t.json: test_groups is an array with no groups"),
    (lambda d: d["test_groups"][0].pop("tag"), "t.json: test_groups #1 has no tag"),
])
def test_structure_errors_name_the_place(mutate, message):
    doc = test_config_like_b24d92f()
    mutate(doc)
    with pytest.raises(CaseError) as info:
        parse_test_config(doc, "t.json", model="gpt2")
    assert message in str(info.value)


def test_a_model_of_another_family_is_refused():
    with pytest.raises(CaseError, match="InfiniTrain's test config runs gpt2, llama3 and tiny_mixtral, but --model "
                                        "qwen3-tiny is a qwen3 model"):
        parse_test_config(test_config_like_b24d92f(), "t.json", model="qwen3-tiny")


def test_load_matrix_reads_a_json_path_and_records_notes(tmp_path):
    path = tmp_path / "test_config.json"
    path.write_text(json.dumps(test_config_like_b24d92f(), indent=4))
    notes: list[str] = []
    cases = load_matrix(str(path), model="llama3-tiny", groups=["checkpoint"], notes=notes)
    assert [c.name for c in cases][:2] == ["llama3_ckpt_no_resume", "llama3_ckpt_resume"]
    assert cases[1].checkpoint.resume_case == "llama3_ckpt_no_resume" and cases[1].model == "llama3-tiny"
    assert any("does not exist here" in n for n in notes)
    with pytest.raises(LockstepError, match="--groups picks the test groups of InfiniTrain's test_config.json, but gpt2 is a TOML matrix"):
        load_matrix("gpt2", groups=["basic"])
    path.write_text("{not json")
    with pytest.raises(LockstepError, match=r"test_config\.json: not valid JSON"):
        load_matrix(str(path))


def test_an_unknown_arg_skips_its_test_naming_the_arg_and_the_rest_plans(tmp_path, capsys):
    path = tmp_path / "test_config.json"
    doc = test_config_like_b24d92f()
    doc["test_groups"][2]["tests"][0]["args"]["lora_dropout"] = 0.1
    path.write_text(json.dumps(doc))
    matrix = load_test_config(path, model="gpt2-tiny", groups=["lora"])
    assert matrix.skipped == {"gpt2_1_lora": "arg lora_dropout is not one lockstep maps to a case yet"}
    assert "gpt2_1_lora" not in [c.name for c in matrix.cases] and len(matrix.cases) == 15
    assert f"{path}: 1 test(s) skipped: arg lora_dropout is not one lockstep maps to a case yet: gpt2_1_lora" in matrix.notes


def test_case_specs_round_trip_through_a_record_and_old_records_still_read():
    for case in parse_test_config(test_config_like_b24d92f(), "t.json", model="gpt2").cases:
        assert CaseSpec.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    old = {"name": "gpt2_1", "model": "gpt2", "dtype": "float32", "micro_batch": 4, "seq_len": 64, "total_batch": 256,
           "steps": 10, "lr": 1e-4, "dp": 1, "tp": 1, "pp": 1, "vpp": 1, "sp": False, "zero": 0, "pp_layout": None}
    case = CaseSpec.from_dict(old)
    assert case.lora is None and case.checkpoint is None and case.group is None and case.needs == frozenset()
    with pytest.raises(CaseError, match=r"case x: lora: unknown field\(s\) dropout"):
        CaseSpec.from_dict({**old, "name": "x", "lora": {"rank": 4, "alpha": 8.0, "target_modules": ["c_fc"],
                                                          "dropout": 0.1}})
    with pytest.raises(CaseError, match=r"case x: checkpoint\.resume_from = '30' is a string"):
        CaseSpec.from_dict({**old, "name": "x", "checkpoint": {"resume_from": "30"}})
    with pytest.raises(CaseError, match="case x: checkpoint resume_from is step 10, must be between 1 and 9"):
        CaseSpec.from_dict({**old, "name": "x", "checkpoint": {"resume_from": 10}}).check()


def _real_test_config() -> str | None:
    """InfiniTrain's own file, from LOCKSTEP_INFINITRAIN_SRC: a checkout, or a git directory
    holding its commit b24d92f."""
    src = os.environ.get("LOCKSTEP_INFINITRAIN_SRC")
    if not src:
        return None
    path = Path(src) / "scripts" / "test_config.json"
    if path.is_file():
        return path.read_text()
    done = subprocess.run(["git", "--git-dir", src, "show", f"{INFINITRAIN_COMMIT}:scripts/test_config.json"],
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


@pytest.mark.skipif(_real_test_config() is None, reason="needs LOCKSTEP_INFINITRAIN_SRC (InfiniTrain's sources)")
@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_infinitrains_own_file_maps_as_the_built_one(tmp_path, family):
    path = tmp_path / "test_config.json"
    path.write_text(_real_test_config())
    real = load_test_config(path, model=family)
    built = parse_test_config(test_config_like_b24d92f(), str(path), model=family)
    assert len(real.cases) == 52
    assert real.cases == built.cases


def test_run_of_the_file_trains_basic_and_lora_cases_and_skips_a_lone_resume_saying_why(capsys, tmp_path, tiny_checkpoint,
                                                                                  training_tokens):
    path = tmp_path / "test_config.json"
    path.write_text(json.dumps(test_config_like_b24d92f(), indent=4))
    out_dir = tmp_path / "out"
    rc = main(["run", "--matrix", str(path), "--model", "gpt2-tiny", "--groups", "basic,lora,checkpoint",
               "--cases", "gpt2_1,gpt2_1_lora,gpt2_ckpt_resume", "--frameworks", "pytorch", "--llmc", str(tiny_checkpoint),
               "--data", str(training_tokens), "--device", "cpu", "--out", str(out_dir), "--no-report"])
    out, err = capsys.readouterr()
    # pytorch alone compares nothing, which is not a pass (comparison.md, Exit status); what is
    # checked here is what it planned, ran and skipped.
    assert rc == 1 and "FAIL: nothing was compared: pytorch ran alone" in " ".join(out.split()), err
    assert "variables.GPT2_LLMC_FILEPATH = /nowhere/gpt2/gpt2_124M.bin does not exist here" in " ".join(out.split())
    manifest = json.loads((out_dir / "run.json").read_text())
    assert {(s["case"], s["reason"]) for s in manifest["skipped"]} == {
        # pytorch resumes (runners/pytorch/checkpoint.py), but not without the case that saves
        ("gpt2_ckpt_resume", "resumes from gpt2_ckpt_no_resume's step-30 checkpoint, which this run does not train "
                             "(select gpt2_ckpt_no_resume too)")}
    assert [c["group"] for c in manifest["cases"]] == ["basic", "lora", "checkpoint"]
    assert manifest["cases"][1]["lora"] == {"rank": 8, "alpha": 16.0, "target_modules": ["c_attn", "attn.c_proj"]}
    from lockstep.formats.run_record import read_run_record

    rec = read_run_record(out_dir / "pytorch" / "gpt2_1.jsonl")
    assert rec.ok and len(rec.steps) == 10 and rec.meta["case_spec"]["group"] == "basic"
    lora = read_run_record(out_dir / "pytorch" / "gpt2_1_lora.jsonl")  # the reference trains LoRA (models/lora.py)
    assert lora.ok and lora.meta["case_spec"]["lora"]["rank"] == 8 and lora.losses() != rec.losses()


def test_config_like_b7e0760() -> dict:
    """The MoE branch's file (feat/support_moe): b24d92f's groups, a `moe` group whose ids repeat basic's,
    and the variables naming each example's groups."""
    doc = test_config_like_b24d92f()
    doc["variables"].update(MIXTRAL_INPUT_BIN="/nowhere/llama3/tiny_shakespeare_train.bin",
                            MIXTRAL_LLMC_FILEPATH="/nowhere/tiny_mixtral/tiny_mixtral_megatron_export.bin",
                            GPT2_TEST_GROUPS="basic,zero,lora,checkpoint", LLAMA3_TEST_GROUPS="basic,zero,lora,checkpoint",
                            MIXTRAL_TEST_GROUPS="moe")
    doc["test_groups"].append({"tag": "moe", "tests": [
        {"id": "1", "args": {"dtype": "float32"}}, {"id": "1_bfloat16", "args": {"dtype": "bfloat16"}},
        {"id": "2", "args": {"dtype": "float32", "num_iteration": 10, "global_batch_size": 80, "micro_batch_size": 80}},
        {"id": "2_bfloat16", "args": {"dtype": "bfloat16", "num_iteration": 10, "global_batch_size": 80,
                                      "micro_batch_size": 80}}]})
    return doc


def test_the_moe_branchs_file_gives_each_example_its_own_groups():
    doc = test_config_like_b7e0760()
    gpt2 = parse_test_config(doc, "t.json", model="gpt2")
    assert len(gpt2.cases) == 52 and "moe" not in {c.group for c in gpt2.cases}  # ids 1 and 2 are basic's here
    assert "t.json: variables.GPT2_TEST_GROUPS = 'basic,zero,lora,checkpoint': gpt2 runs group(s) basic, zero, " \
           "lora, checkpoint" in gpt2.notes
    moe = parse_test_config(doc, "t.json", model="mixtral-tiny")
    assert [(c.name, c.group, c.model, c.dtype, c.micro_batch, c.total_batch, c.seq_len, c.steps, c.lr, c.world_size)
            for c in moe.cases] == [
        ("tiny_mixtral_1", "moe", "mixtral-tiny", "float32", 4, 256, 64, 10, 1e-4, 1),  # tiny_mixtral's defaults
        ("tiny_mixtral_1_bfloat16", "moe", "mixtral-tiny", "bfloat16", 4, 256, 64, 10, 1e-4, 1),
        ("tiny_mixtral_2", "moe", "mixtral-tiny", "float32", 80, 80 * 64, 64, 10, 1e-4, 1),  # batch sizes in sequences
        ("tiny_mixtral_2_bfloat16", "moe", "mixtral-tiny", "bfloat16", 80, 80 * 64, 64, 10, 1e-4, 1)]
    assert "t.json: variables.MIXTRAL_LLMC_FILEPATH = /nowhere/tiny_mixtral/tiny_mixtral_megatron_export.bin does not " \
           "exist here: mixtral cases train lockstep's seeded init" in moe.notes
    every = parse_test_config(doc, "t.json")  # as the driver: every example, each on its groups
    assert len(every.cases) == 52 * 2 + 4
    assert {c.model for c in every.cases} == {"gpt2", "llama3", "mixtral-l32-c512"}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["test_groups"][-1]["tests"][2]["args"].update(global_batch_size=100),
     "t.json: test 2: global_batch_size 100 is not a multiple of micro_batch_size 80, as tiny_mixtral requires"),
    (lambda d: d["variables"].update(MIXTRAL_TEST_GROUPS="basic,moe"),
     "t.json: test 1 is defined twice (groups basic and moe), both run by tiny_mixtral"),
])
def test_a_moe_test_tiny_mixtral_cannot_run_is_one_sentence(mutate, message):
    doc = test_config_like_b7e0760()
    mutate(doc)
    with pytest.raises(CaseError) as info:
        parse_test_config(doc, "t.json", model="mixtral-tiny")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_without_group_variables_gpt2_runs_every_group_as_b24d92fs_driver():
    doc = test_config_like_b24d92f()
    doc["test_groups"].append({"tag": "extra", "tests": [{"id": "x", "args": {}}]})
    assert [c.name for c in parse_test_config(doc, "t.json", model="gpt2").cases][-1] == "gpt2_x"
    with pytest.raises(LockstepError, match="hold no tests that tiny_mixtral runs"):
        parse_test_config(doc, "t.json", model="mixtral-tiny")  # its default group, moe, is not in the file


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infinitrain_test_configs"


def _read(name: str, model: str = "gpt2-tiny"):
    return load_test_config(FIXTURES / name, model=model)


def test_the_builds_key_is_noted_not_run_and_use_distributed_optimizer_is_zero1():
    m = _read("builds_key.json")
    by = {c.name: c for c in m.cases}
    assert list(by) == ["gpt2_1", "gpt2_2_distopt"] and m.skipped == {}
    assert by["gpt2_2_distopt"].zero == 1 and by["gpt2_2_distopt"].dp == 2 and by["gpt2_1"].zero == 0
    src = str(FIXTURES / "builds_key.json")
    assert f"{src}: builds (2) not run: lockstep runs an existing InfiniTrain build" in m.notes
    assert any(n.startswith(f"{src}: variables.CTEST_CMD = ") and "does not run InfiniTrain's ctest" in n for n in m.notes)


def test_a_flat_tests_list_is_one_group_run_by_gpt2_and_llama3():
    m = load_test_config(FIXTURES / "flat_tests.json")
    assert [c.name for c in m.cases] == ["gpt2_1", "llama3_1", "gpt2_1_bfloat16", "llama3_1_bfloat16"]
    assert m.groups == ["tests"] and {c.dtype for c in m.cases} == {"float32", "bfloat16"}
    with pytest.raises(CaseError, match="holds both tests and test_groups"):
        parse_test_config({"tests": [], "test_groups": []}, "t.json")


def test_a_maca_file_plans_and_says_the_device_lockstep_trains_on():
    m = _read("maca.json")
    assert [c.name for c in m.cases] == ["gpt2_1"]
    assert any("variables.DEVICE_BACKEND = 'maca' not used: InfiniTrain's driver passes it to the examples as --device"
               in n for n in m.notes)


def test_shell_variables_lora_load_path_noted_and_a_shell_variable_arg_skipped():
    m = _read("shell_variable.json")
    src = str(FIXTURES / "shell_variable.json")
    assert [c.name for c in m.cases] == ["gpt2_1_lora"] and m.cases[0].lora.rank == 8
    assert (f"{src}: test 1_lora: arg lora_load_path = '$LORA_WEIGHTS_DIR' not read: lockstep starts LoRA from its "
            "own seeded init (the same in every framework)") in m.notes
    assert m.skipped == {"gpt2_2_lora": "arg lora_target_modules = '$LORA_TARGETS' names a shell variable of "
                                        "InfiniTrain's driver"}


def test_unknown_args_skip_their_tests_grouped_by_reason():
    m = _read("unknown_arg.json")
    assert [c.name for c in m.cases] == ["gpt2_1"]
    assert m.skipped == {"gpt2_2_cp": "args context_parallel, cp_comm_type are not ones lockstep maps to a case yet",
                         "gpt2_3_typo": "arg bacth_size is not one lockstep maps to a case yet"}
    skips = [n for n in m.notes if "skipped" in n]
    assert len(skips) == 2 and all(" 1 test(s) skipped: " in n for n in skips)


def test_use_distributed_optimizer_beside_zero_stage_is_a_test_its_own_build_cannot_run():
    m = _read("stale_distributed_optimizer.json")
    assert [c.name for c in m.cases] == ["gpt2_3_zero1"]
    assert m.skipped == {"gpt2_3_distopt": "arg use_distributed_optimizer: the file's other tests use zero_stage, so "
                                           "its own build has no use_distributed_optimizer flag"}


MIRROR = Path("/work/.mirror/InfiniTensor+InfiniTrain/repo")


def _branch_configs(out: Path) -> list[Path]:
    """Every distinct scripts/test_config*.json on the mirror's branch heads, written under `out`."""
    heads = subprocess.run(["git", "-C", str(MIRROR), "for-each-ref", "refs/heads", "--format=%(refname:short)"],
                           capture_output=True, text=True, check=True).stdout.split()
    found = {}
    for head in heads:
        for name in ("scripts/test_config.json", "scripts/test_config_maca.json"):
            blob = subprocess.run(["git", "-C", str(MIRROR), "rev-parse", "--verify", "-q", f"{head}:{name}"],
                                  capture_output=True, text=True).stdout.strip()
            if blob and blob not in found:
                text = subprocess.run(["git", "-C", str(MIRROR), "cat-file", "-p", blob], capture_output=True,
                                      text=True, check=True).stdout
                path = out / f"{head.replace('/', '_')}_{Path(name).name}"
                path.write_text(text, encoding="utf-8")
                found[blob] = path
    return list(found.values())


@pytest.mark.skipif(not MIRROR.is_dir(), reason="InfiniTrain's mirror is not on this machine")
def test_every_branchs_test_config_plans_naming_each_test_it_cannot_run(tmp_path, capsys):
    files = _branch_configs(tmp_path)
    assert len(files) == 14
    for path in files:
        rc = main(["run", "--matrix", str(path), "--model", "gpt2-tiny", "--dry-run", "--device", "cpu",
                   "--frameworks", "pytorch", "--out", str(tmp_path / "o" / path.stem)])
        out, err = capsys.readouterr()
        assert rc == 0, (path.name, err)
        matrix = load_test_config(path, model="gpt2-tiny")
        for name, reason in matrix.skipped.items():
            line = next(n for n in matrix.notes if f"skipped: {reason}: " in n)
            printed = " ".join((out + err).split())  # the plan's notes are wrapped to the terminal
            assert name in line and " ".join(line.split()) in printed, (path.name, name)


def test_lr_schedule_and_recompute_args_become_case_fields():
    """feat/lr_scheduler's and feat/activation_checkpointing's args, one table each (CASE_FIELD_ARGS,
    LR_SCHEDULE_ARGS): the schedule's unset args at InfiniTrain's defaults."""
    from lockstep.cases.spec import LRSchedule

    config = {"test_groups": [{"tag": "lr", "tests": [
        {"id": "1_cosine", "args": {"num_iteration": 6, "lr_decay_style": "cosine", "lr_warmup_iters": 2,
                                    "min_lr": 1e-5}},
        {"id": "2_recompute", "args": {"activation_recompute": True, "recompute_granularity": "full",
                                       "recompute_method": "uniform", "recompute_num_layers": 1}}]}]}
    cases = {c.name: c for c in parse_test_config(config, "t.json").cases}
    assert cases["gpt2_1_cosine"].lr_schedule == LRSchedule(lr_decay_style="cosine", lr_warmup_iters=2, min_lr=1e-5)
    assert cases["llama3_1_cosine"].lr_schedule.lr_warmup_init == 0.0
    r = cases["gpt2_2_recompute"]
    assert (r.activation_recompute, r.recompute_granularity, r.recompute_method, r.recompute_num_layers) == (
        True, "full", "uniform", 1) and r.lr_schedule is None
