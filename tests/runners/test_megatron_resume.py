"""Save and resume in the megatron runner (megatron-core's dist_checkpointing, runners/megatron/
checkpoint.py), on CPU (gloo), FP32: its resume judged by the resume judge (compare/resume.py)
against its own run that never stopped, which a deterministic framework owes bitwise; the resumed
megatron run against the pytorch reference's resumed run within the FP32 threshold; and the
judge's negative controls on megatron's side, planted in its workers (tests/support/defects.py):
a resume that restores the data position as 0, one that resets Adam's step count (told by the
reference's alternatives) and, under DP=2, one that restores only DP rank 0 (told per rank) must
be *resume broken* with that cause.

gpt2-tiny (SGD) at lr 0.1 and a small-vocabulary Llama 3 (Adam, as tests/runners/test_pytorch_resume.py)
at lr 1e-3, where each broken resume moves the loss past 1e-5 by the last step. The cases run in
the session's shared worker groups (`worker_pool`, one per world size); a run with a defect in
its workers' environment starts a torchrun of its own.
"""

from __future__ import annotations

import dataclasses

import pytest

from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.compare.resume import ResumeCause, ResumeVerdictClass, judge_resume
from lockstep.models import FAMILIES, SHAPES
from lockstep.models.llama3.config import Llama3Config
from lockstep.runners.base import RunInputs, case_skip_reason
from lockstep.runners.checkpoint_plan import step_dir
from lockstep.runners.pytorch import PyTorchRunner
from lockstep.runners.pytorch.alternatives import train_alternatives
from support import defects

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

pytest.importorskip("megatron.core")

from lockstep.runners.megatron import MegatronRunner  # noqa: E402

SMALL_LLAMA = Llama3Config(max_seq_len=256, vocab_size=50304, num_layers=2, num_heads=4, num_kv_heads=2, channels=64)
STEPS, SAVE_EVERY, RESUME_AT = 6, 2, 4
FP32 = 1e-5  # the verdict policy's FP32 loss threshold
GPT2_LR, LLAMA_LR = 0.1, 1e-3


def saving_case(model: str, lr: float, **parallel) -> CaseSpec:
    dp = parallel.get("dp", 1)
    return CaseSpec(name="saving", model=model, dtype="float32", micro_batch=2, seq_len=32, total_batch=64 * dp,
                    steps=STEPS, lr=lr, checkpoint=CheckpointSpec(save_interval=SAVE_EVERY, max_checkpoint_keep=2),
                    **parallel)


def resumed_case(model: str, lr: float, name: str = "resumed", source: str = "saving", **parallel) -> CaseSpec:
    return dataclasses.replace(saving_case(model, lr, **parallel), name=name,
                               checkpoint=CheckpointSpec(resume_from=RESUME_AT, resume_case=source))


def max_gap(a, b) -> float:
    got = {s.step: s.loss for s in a.steps}
    return max(abs(got[s.step] - s.loss) for s in b.steps if s.step in got)


@pytest.fixture(scope="module")
def gpt2_inputs(tiny_checkpoint, training_tokens) -> RunInputs:
    return RunInputs(checkpoint=tiny_checkpoint, tokens=training_tokens, model=SHAPES["gpt2-tiny"].config, device="cpu",
                     oversubscribe=True)


@pytest.fixture(scope="module")
def llama_inputs(tmp_path_factory, training_tokens) -> RunInputs:
    from lockstep.models.init import write_initial_checkpoint

    path = tmp_path_factory.mktemp("llama_small") / "llama3_small_seed42.bin"
    write_initial_checkpoint(path, FAMILIES["llama3"], SMALL_LLAMA, seed=42)
    return RunInputs(checkpoint=path, tokens=training_tokens, model=SMALL_LLAMA, device="cpu", oversubscribe=True)


def both_frameworks(inputs, out, pool, model, lr, **parallel):
    """megatron's saving run and its resume (in the pool), the reference's, and the reference's
    alternatives of the resume (compare/resume.py's candidates)."""
    mega = {c.name: pool.run(MegatronRunner(), c, inputs, out)
            for c in (saving_case(model, lr, **parallel), resumed_case(model, lr, **parallel))}
    ref = {c.name: PyTorchRunner().run(c, inputs, out) for c in (saving_case(model, lr), resumed_case(model, lr))}
    for rec in (*mega.values(), *ref.values()):
        assert rec.ok, rec.error
    alternatives = train_alternatives(PyTorchRunner(), resumed_case(model, lr), inputs, out / "pytorch" / "resumed.log",
                                      out / "alternatives")
    return mega, ref, alternatives


@pytest.fixture(scope="module")
def gpt2_runs(gpt2_inputs, tmp_path_factory, worker_pool):
    out = tmp_path_factory.mktemp("megatron_gpt2_resume")
    return (out, *both_frameworks(gpt2_inputs, out, worker_pool, "gpt2-tiny", GPT2_LR))


@pytest.fixture(scope="module")
def llama_tp2_runs(llama_inputs, tmp_path_factory, worker_pool):
    out = tmp_path_factory.mktemp("megatron_llama_resume")
    return (out, *both_frameworks(llama_inputs, out, worker_pool, "llama3-tiny", LLAMA_LR, tp=2))


def test_megatron_declares_save_resume(gpt2_inputs):
    assert case_skip_reason(MegatronRunner(), resumed_case("gpt2-tiny", GPT2_LR), gpt2_inputs) is None
    zero = resumed_case("llama3-tiny", LLAMA_LR, dp=2, zero=1)
    assert "needs CUDA" in case_skip_reason(MegatronRunner(), zero, gpt2_inputs)  # ZeRO-1 is CUDA's, saving or not


def test_a_gpt2_resume_is_bitwise_its_own_uninterrupted_run_and_the_references(gpt2_runs):
    out, mega, ref, _ = gpt2_runs
    full, resumed = mega["saving"], mega["resumed"]
    assert [s.step for s in resumed.steps] == [5, 6] and full.losses()[0] - full.losses()[-1] > 0.3  # it trains
    verdict = judge_resume(full, resumed)
    assert verdict.verdict is ResumeVerdictClass.EXACT and verdict.max_abs_diff == 0.0, verdict.sentence()
    # Saved at 2, 4 and 6 as .partial folders renamed into place; max_checkpoint_keep 2 leaves the newest two.
    root = out / "megatron" / "saving.checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000004", "step_000006"]
    assert {"metadata.json", "common.pt", ".metadata"} <= {p.name for p in step_dir(root, 4).iterdir()}
    assert full.meta["checkpoint_save_s"] > 0
    # The resumed megatron run trains the reference's resumed losses (and the uninterrupted ones).
    assert max_gap(resumed, ref["resumed"]) <= FP32 and max_gap(resumed, ref["saving"]) <= FP32


def test_a_gpt2_resume_that_restores_the_data_position_as_0_is_data_restarted(gpt2_runs, gpt2_inputs, monkeypatch):
    out, mega, _, alternatives = gpt2_runs
    defects.worker_env("megatron_resume_data_restarted", monkeypatch)
    broken = MegatronRunner().run(resumed_case("gpt2-tiny", GPT2_LR, name="broken-data"), gpt2_inputs, out)
    assert broken.ok, broken.error
    verdict = judge_resume(mega["saving"], broken, alternatives)
    assert verdict.verdict is ResumeVerdictClass.BROKEN and verdict.cause is ResumeCause.DATA_RESTARTED, verdict.sentence()
    assert verdict.max_abs_diff > FP32 and verdict.candidates[0].max_abs_diff <= FP32


def test_a_llama_tp2_resume_restores_adam_and_is_bitwise(llama_tp2_runs):
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    out, mega, ref, alternatives = llama_tp2_runs
    full, resumed = mega["saving"], mega["resumed"]
    verdict = judge_resume(full, resumed, alternatives)
    assert verdict.verdict is ResumeVerdictClass.EXACT and verdict.max_abs_diff == 0.0, verdict.sentence()
    assert max_gap(resumed, ref["resumed"]) <= FP32
    # Every alternative (a broken resume of the reference) trains other losses, past the threshold.
    assert all(c.max_abs_diff > FP32 for c in verdict.candidates if c.cause is not ResumeCause.OTHER_STEP)
    folder = step_dir(out / "megatron" / "saving.checkpoints", RESUME_AT)
    tensors = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    # Both moments of every parameter, as global (TP-joined) tensors: the q/k/v weight of layer 0
    # is (heads + 2 * kv heads) * head dim = 128 rows of 64, whichever TP rank wrote which rows.
    moments = {k for k in tensors if k.startswith("optimizer.state.")}
    params = {k for k in tensors if k.split(".")[0] in ("decoder", "embedding", "output_layer") and "_extra_state" not in k}
    assert {f"optimizer.state.{m}.{p}" for m in ("exp_avg", "exp_avg_sq") for p in params} == moments
    assert len(params) == 9  # embedding, output layer, final norm, and 6 per-layer tensors with a layer axis
    qkv = "optimizer.state.exp_avg.decoder.layers.self_attention.linear_qkv.weight"
    assert tuple(tensors[qkv].size) == (2, 128, 64), tensors[qkv].size  # (layers, rows, columns)
    common = torch.load(folder / "common.pt", weights_only=False)
    assert int(common["optimizer"]["state"]["common_step"]) == RESUME_AT
    assert common["lockstep"]["data_next_step"] == RESUME_AT and common["iteration"] == RESUME_AT


def test_a_llama_resume_that_resets_adams_step_count_is_told(llama_tp2_runs, llama_inputs, monkeypatch):
    out, mega, _, alternatives = llama_tp2_runs
    defects.worker_env("megatron_resume_step_reset", monkeypatch)
    broken = MegatronRunner().run(resumed_case("llama3-tiny", LLAMA_LR, name="broken-step", tp=2), llama_inputs, out)
    assert broken.ok, broken.error
    verdict = judge_resume(mega["saving"], broken, alternatives)
    assert verdict.verdict is ResumeVerdictClass.BROKEN and verdict.cause is ResumeCause.ADAM_STEP_RESET, verdict.sentence()
    assert verdict.max_abs_diff > FP32


def test_a_resume_without_optimizer_state_is_a_fresh_adam(llama_tp2_runs, llama_inputs, worker_pool):
    """save_optimizer_state = false: the resume builds a fresh optimizer on the loaded weights."""
    out, mega, _, alternatives = llama_tp2_runs
    weights_only = dataclasses.replace(saving_case("llama3-tiny", LLAMA_LR, tp=2), name="saving-weights", steps=RESUME_AT,
                                       checkpoint=CheckpointSpec(save_interval=RESUME_AT, save_optimizer_state=False))
    assert worker_pool.run(MegatronRunner(), weights_only, llama_inputs, out).ok
    resumed = worker_pool.run(MegatronRunner(), resumed_case("llama3-tiny", LLAMA_LR, name="resumed-weights",
                                                             source="saving-weights", tp=2), llama_inputs, out)
    assert resumed.ok, resumed.error
    verdict = judge_resume(mega["saving"], resumed, alternatives)
    assert verdict.verdict is ResumeVerdictClass.BROKEN and verdict.cause is ResumeCause.OPTIMIZER_STATE_LOST
    assert "fresh Adam" in verdict.candidates[0].what and verdict.candidates[0].max_abs_diff <= FP32


def test_a_tp2_checkpoint_resumes_into_tp1_resharded(llama_tp2_runs, llama_inputs, worker_pool):
    """dist_checkpointing reshards model and Adam state into another layout (TP=1 reads the TP=2
    folder); not bitwise (TP=2 sums its row-parallel products in another order), within FP32's threshold."""
    out, mega, ref, _ = llama_tp2_runs
    resumed = worker_pool.run(MegatronRunner(), resumed_case("llama3-tiny", LLAMA_LR, name="resumed-tp1"), llama_inputs, out)
    assert resumed.ok, resumed.error
    assert judge_resume(mega["saving"], resumed).verdict is not ResumeVerdictClass.BROKEN
    assert max_gap(resumed, ref["resumed"]) <= FP32


def test_a_dp2_resume_is_exact_per_rank_and_one_restoring_only_rank_0_is_a_shard_not_restored(
        gpt2_inputs, tmp_path, worker_pool, monkeypatch):
    full = worker_pool.run(MegatronRunner(), saving_case("gpt2-tiny", GPT2_LR, dp=2), gpt2_inputs, tmp_path)
    resumed = worker_pool.run(MegatronRunner(), resumed_case("gpt2-tiny", GPT2_LR, dp=2), gpt2_inputs, tmp_path)
    assert full.ok and resumed.ok, (full.error, resumed.error)
    ranks = full.meta["rank_losses"]
    assert sorted(ranks, key=int) == [str(s) for s in range(1, STEPS + 1)]
    assert all(len(losses) == 2 and losses[0] != losses[1] for losses in ranks.values())
    assert all(abs(sum(ranks[str(s.step)]) / 2 - s.loss) < 1e-12 for s in full.steps)
    assert sorted(resumed.meta["rank_losses"], key=int) == ["5", "6"]
    assert resumed.meta["rank_losses"]["5"] == ranks["5"]
    assert judge_resume(full, resumed).verdict is ResumeVerdictClass.EXACT

    defects.worker_env("megatron_resume_rank0_only", monkeypatch)
    broken = MegatronRunner().run(resumed_case("gpt2-tiny", GPT2_LR, name="rank0-only", dp=2), gpt2_inputs, tmp_path)
    assert broken.ok, broken.error
    verdict = judge_resume(full, broken)
    assert verdict.verdict is ResumeVerdictClass.BROKEN and verdict.cause is ResumeCause.SHARD_NOT_RESTORED, verdict.sentence()
    assert "rank(s) 1 differ" in verdict.cause_detail and "rank(s) 0 are bitwise equal" in verdict.cause_detail


def test_a_resume_from_a_missing_step_folder_fails_naming_it(gpt2_inputs, tmp_path):
    rec = MegatronRunner().run(resumed_case("gpt2-tiny", GPT2_LR), gpt2_inputs, tmp_path)
    assert not rec.ok and "megatron/saving.checkpoints/step_000004: no checkpoint of step 4" in rec.error


def test_a_folder_written_from_the_references_canonical_state_resumes_as_the_reference(
        llama_tp2_runs, llama_inputs, worker_pool, tmp_path):
    """write_megatron_checkpoint, the way in of `diagnose --at-step`: the reference's step-4 weights
    and Adam state written as megatron's own TP=2 step folder, resumed by megatron, train steps 5
    and 6 as the reference's resume does (within FP32's threshold; every broken-resume alternative
    is farther, test_a_llama_tp2_resume_restores_adam_and_is_bitwise)."""
    from lockstep.runners.checkpoint_plan import CheckpointPlan, ResumePlan
    from lockstep.runners.megatron.runner import write_megatron_checkpoint
    from lockstep.runners.pytorch.canonical_state import read_canonical_state

    out, mega, ref, _ = llama_tp2_runs
    case = resumed_case("llama3-tiny", LLAMA_LR, name="from-reference", tp=2)
    state = read_canonical_state(str(step_dir(out / "pytorch" / "saving.checkpoints", RESUME_AT)), RESUME_AT, case,
                                 str(llama_inputs.checkpoint))
    assert state.adam_step == RESUME_AT and set(state.exp_avg) == set(state.weights)
    runner = MegatronRunner()
    group = worker_pool.group(runner, case, llama_inputs)
    folder = write_megatron_checkpoint(state.weights, {"exp_avg": state.exp_avg, "exp_avg_sq": state.exp_avg_sq},
                                       RESUME_AT, case, llama_inputs, tmp_path / "written", workers=group)
    assert folder == step_dir(tmp_path / "written", RESUME_AT) and (folder / "metadata.json").is_file()
    inputs = dataclasses.replace(llama_inputs, extra={"megatron_checkpoints": CheckpointPlan(
        resume=ResumePlan(str(folder), RESUME_AT))})
    resumed = worker_pool.run(runner, case, inputs, tmp_path)
    assert resumed.ok, resumed.error
    assert max_gap(resumed, ref["resumed"]) <= FP32 and max_gap(resumed, mega["resumed"]) <= FP32
