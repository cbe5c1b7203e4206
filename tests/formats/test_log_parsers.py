"""Log parsers on the exact real-format lines of docs/reference/logs.md, and writer/parser round trips."""

from __future__ import annotations

import math

import pytest

from lockstep.errors import FormatError
from lockstep.formats.logs import (LLMC_STEP_RE, LOCKSTEP_MEGATRON_MARKER, MEGATRON_ITERATION_RE, PERF_STEP_RE,
                                   PERF_SUMMARY_RE, correct_megatron_step2, detect_log_format,
                                   infinitrain_step_line, llmc_step_line, load_run, megatron_iteration_line,
                                   parse_infinitrain_log, parse_log_file, perf_step_line, perf_summary_line)
from lockstep.formats.run_record import RunRecord, StepRecord, write_run_record

# docs/reference/logs.md#infinitrain, verbatim.
INFINITRAIN_LINE = ("E20251021 14:16:23.511394 140590029197312 main.cc:262] step    1/10 | train loss 5.356193 | "
                    "lr 1.00e-04 | (2506.24 ms | 102 tok/s)")
# InfiniTrain main.cc's newer format (peak-memory tail), as its std::format string renders it.
INFINITRAIN_TAIL_LINE = ("E20251021 14:16:25.911394 140590029197312 main.cc:262] step    2/10 | train loss 5.060843 | "
                         "lr 1.00e-04 | (2400.10 ms | 107 tok/s | peak used:  1234 MB | peak reserved:  2048 MB, "
                         "DP=2, TP=1, SP=1, PP=1)")
LLMC_LINE = "step    1/10 | train loss 5.356193 | norm -1.0000 | lr 1.00e-04 | (12.34 ms | 20746 tok/s)"
MEGATRON_LINE_1 = (" [2026-09-10 03:40:58.636444] iteration        1/      10 | consumed samples:            4 | "
                   "elapsed time per iteration (ms): 660.2 | learning rate: 1.000000E-04 | global batch size:     4 | "
                   "lm loss: 5.357338E+00 | loss scale: 1.0 | grad norm: 38.621 | number of skipped iterations:   0 | "
                   "number of nan iterations:   0 |")


def megatron_line(step: int, loss: float, elapsed_ms: float = 660.2) -> str:
    return (MEGATRON_LINE_1.replace("iteration        1/", f"iteration {step:8d}/")
            .replace("5.357338E+00", f"{loss:.6E}").replace("(ms): 660.2", f"(ms): {elapsed_ms}"))


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- InfiniTrain

def test_infinitrain_line_among_other_lines(tmp_path):
    text = "\n".join([
        "I20251021 14:16:20.000000 140590029197312 main.cc:100] Rank 0: start training",
        "some unprefixed noise: step 3/10 is not a step line",
        INFINITRAIN_LINE,
        "I20251021 14:16:26.000000 140590029197312 main.cc:200] Rank 0: finish backward",
        INFINITRAIN_TAIL_LINE,
        "W20251021 14:16:27.000000 140590029197312 net.cc:12] whatever",
    ])
    rec = parse_infinitrain_log(text, source=str(tmp_path / "gpt2_1.log"))
    assert rec.origin == "infinitrain-log"
    assert rec.framework == "infinitrain"
    assert rec.case == "gpt2_1"
    assert [s.step for s in rec.steps] == [1, 2]
    s1, s2 = rec.steps
    assert s1.loss == 5.356193 and s1.step_ms == 2506.24 and s1.tokens_per_s == 102 and s1.lr == 1e-4
    assert s1.peak_mem_mb is None
    assert s2.loss == 5.060843 and s2.step_ms == 2400.10 and s2.tokens_per_s == 107 and s2.peak_mem_mb == 1234
    assert rec.meta["peak_reserved_mb"] == 2048
    assert rec.meta["parallel"] == {"dp": 2, "tp": 1, "sp": 1, "pp": 1}
    assert rec.meta["steps_planned"] == 10


def test_infinitrain_detected_by_parse_log_file_with_old_glog_date(tmp_path):
    old = INFINITRAIN_LINE.replace("E20251021", "E1021")  # glog before 0.7 writes MMDD only
    rec = parse_log_file(write(tmp_path, "gpt2_1_bfloat16.log", "[COMMAND] ./gpt2 --dtype bfloat16\n" + old + "\n"))
    assert rec.origin == "infinitrain-log"
    assert rec.case == "gpt2_1_bfloat16"
    assert rec.steps[0].loss == 5.356193
    assert rec.meta["command"] == "./gpt2 --dtype bfloat16"


def test_infinitrain_without_step_lines_is_an_error_naming_the_source():
    with pytest.raises(FormatError, match="crash.log"):
        parse_infinitrain_log("I20251021 14:16:20.000000 1 main.cc:1] start\nSegmentation fault\n", "x/crash.log")


def test_infinitrain_nan_loss_is_kept_for_the_finiteness_check():
    line = INFINITRAIN_LINE.replace("5.356193", "-nan")
    rec = parse_infinitrain_log(line, "gpt2_1.log")
    assert math.isnan(rec.steps[0].loss)


# Branch feat/support_moe's tiny_mixtral (b7e0760 main.cc:141-143): std::cout, no glog prefix.
TINY_MIXTRAL_LINE = "step    1/10 | train loss 11.771182 | norm -1.0000 | lr 1.00e-04 | (14567.44 ms | 18 tok/s)"


def test_infinitrain_stdout_step_lines_without_glog_prefix():
    text = ("[COMMAND] /b/tiny_mixtral --input_bin t.bin\nF20261203 10:51:58.344971 1 x.cc:1] step 9/10 | train loss "
            "1.0 | lr 1.00e-04 | (1.00 ms | 1 tok/s)\n" + TINY_MIXTRAL_LINE + "\nfinal 9 iters avg: 14012.345ms\n")
    rec = parse_infinitrain_log(text, "runs/mixtral_1.log", glog=False)
    assert rec.framework == "infinitrain" and rec.origin == "infinitrain-log" and rec.case == "mixtral_1"
    # Only the stdout line: a glog-prefixed line is not this executable's step line.
    assert [(s.step, s.loss, s.lr, s.step_ms, s.tokens_per_s) for s in rec.steps] == [(1, 11.771182, 1e-4, 14567.44,
                                                                                       18.0)]
    assert rec.meta["command"] == "/b/tiny_mixtral --input_bin t.bin"
    stdout_lines = r"holds no InfiniTrain step lines \(`step N/M \| train loss ...` on stdout\)"
    with pytest.raises(FormatError, match=stdout_lines):
        parse_infinitrain_log(INFINITRAIN_LINE, "x.log", glog=False)
    # The glog reading (gpt2/llama3) finds none of the stdout lines.
    assert [s.step for s in parse_infinitrain_log(text, "runs/mixtral_1.log").steps] == [9]


def test_infinitrain_writer_round_trip():
    prefix = "E20251021 14:16:23.511394 140590029197312 main.cc:262] "
    assert infinitrain_step_line(prefix, 1, 10, 5.356193, 1e-4, 2506.24, 102) == INFINITRAIN_LINE
    line = infinitrain_step_line(INFINITRAIN_TAIL_LINE[:55], 2, 10, 5.060843, 1e-4, 2400.1, 107, peak_used_mb=1234,
                                 peak_reserved_mb=2048, dp=2)
    assert line == INFINITRAIN_TAIL_LINE
    rec = parse_infinitrain_log(line, "a.log")
    assert rec.steps[0].peak_mem_mb == 1234


def test_a_zero_peak_in_an_infinitrain_line_is_unknown_not_zero():
    """A build that tracks no device memory prints `peak used:     0 MB`: no training step peaks at
    nothing, so the record says nothing (and the throughput table "-"), not 0."""
    from lockstep.compare.throughput import throughput_of

    line = infinitrain_step_line(INFINITRAIN_TAIL_LINE[:55], 2, 10, 5.060843, 1e-4, 2400.1, 107, peak_used_mb=0,
                                 peak_reserved_mb=0)
    assert "peak used:     0 MB | peak reserved:     0 MB" in line
    rec = parse_infinitrain_log(line, "a.log")
    assert rec.steps[0].peak_mem_mb is None and "peak_reserved_mb" not in rec.meta
    t = throughput_of(rec)
    assert t.peak_allocated_mb is None and t.peak_reserved_mb is None


# ---------------------------------------------------------------- llm.c / PyTorch

def test_llmc_line(tmp_path):
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", "using device cpu\n" + LLMC_LINE + "\nval loss 5.1\n"))
    assert rec.origin == "llmc-log"
    assert rec.steps == [StepRecord(step=1, loss=5.356193, step_ms=12.34, tokens_per_s=20746, lr=1e-4)]


def test_llmc_writer_round_trip():
    line = llmc_step_line(7, 10, 4.123456, 1e-4, 12.34, 20746.4)
    assert line == "step    7/10 | train loss 4.123456 | lr 1.00e-04 | (12.34 ms | 20746 tok/s)"
    m = LLMC_STEP_RE.match(line)
    assert m and int(m["step"]) == 7 and float(m["loss"]) == 4.123456 and float(m["tps"]) == 20746


def test_llmc_log_with_perf_lines(tmp_path):
    text = "\n".join([llmc_step_line(1, 2, 5.0, 1e-4, 10.0, 100.0), perf_step_line(1, 2, 10.0, 100.0),
                      llmc_step_line(2, 2, 4.9, 1e-4, 8.0, 125.0), perf_step_line(2, 2, 8.0, 125.0),
                      perf_summary_line(1, 8.0, 125.0)])
    rec = parse_log_file(write(tmp_path, "c.log", text))
    assert [s.tokens_per_s for s in rec.steps] == [100.0, 125.0]
    assert rec.meta["perf_summary"] == {"measured_steps": 1, "avg_step_ms": 8.0, "avg_tokens_per_s": 125.0}


# ---------------------------------------------------------------- Megatron-LM

def test_megatron_lm_line(tmp_path):
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", "noise\n" + MEGATRON_LINE_1 + "\n"))
    assert rec.origin == "megatron-lm-log"
    assert rec.framework == "megatron"
    (s,) = rec.steps
    assert s.step == 1 and s.loss == 5.357338 and s.lr == 1e-4
    # Upstream's elapsed time of iteration 1 is not a step time.
    assert s.step_ms is None and s.tokens_per_s is None
    assert rec.meta["global_batch_size"] == 4


def test_megatron_lm_tok_s_from_elapsed_time_and_seq_length_argument(tmp_path):
    text = "\n".join(megatron_line(i, 5.0 - 0.1 * i, elapsed_ms=500.0) for i in range(1, 5))
    path = write(tmp_path, "gpt2_1.log", text)
    rec = parse_log_file(path, seq_length=64)
    assert [s.tokens_per_s for s in rec.steps[:2]] == [None, None]  # iterations 1-2 unusable for timing
    assert rec.steps[2].tokens_per_s == pytest.approx(4 * 64 / 0.5)
    assert rec.steps[2].step_ms == 500.0
    assert rec.meta["seq_length"] == 64 and rec.meta["seq_length_from"] == "argument"
    assert rec.mean_tokens_per_s(1) == pytest.approx(512.0)
    # Without any sequence length the losses still parse; tok/s is unknown and said so.
    rec = parse_log_file(path)
    assert all(s.tokens_per_s is None for s in rec.steps)
    assert "seq" in rec.meta["throughput_note"]


@pytest.mark.parametrize("seq_line", ["    seq_length ...................................... 128",
                                      "[CONFIG] model=gpt2 seq=128 batch=4",
                                      "torchrun pretrain_gpt.py --seq-length 128 --micro-batch-size 4"])
def test_megatron_lm_seq_length_from_the_log_wins(tmp_path, seq_line):
    text = seq_line + "\n" + "\n".join(megatron_line(i, 5.0, elapsed_ms=1000.0) for i in range(1, 4))
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", text), seq_length=64)
    assert rec.meta["seq_length"] == 128
    assert rec.steps[2].tokens_per_s == pytest.approx(4 * 128)


def test_megatron_perf_lines_give_throughput(tmp_path):
    text = "\n".join([megatron_line(1, 5.0), perf_step_line(1, 3, 100.0, 2560.0),
                      megatron_line(2, 4.9), perf_step_line(2, 3, 50.0, 5120.0),
                      megatron_line(3, 4.8), perf_step_line(3, 3, 40.0, 6400.0)])
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", text))
    assert [s.tokens_per_s for s in rec.steps] == [2560.0, 5120.0, 6400.0]
    assert [s.step_ms for s in rec.steps] == [100.0, 50.0, 40.0]


def test_megatron_writer_round_trip():
    line = megatron_iteration_line("2026-09-10 03:40:58.636444", 1, 10, 4, 660.2, 1e-4, 4, 5.357338, grad_norm=38.621)
    assert line == MEGATRON_LINE_1
    m = MEGATRON_ITERATION_RE.search(line)
    assert m and m["step"] == "1" and m["steps"] == "10"
    m = MEGATRON_ITERATION_RE.search(megatron_iteration_line("t", 3, 10, 12, 10.0, 1e-4, 4, 4.9))
    assert m and m["step"] == "3"


def test_perf_writers_round_trip():
    m = PERF_STEP_RE.search(perf_step_line(2, 10, 12.34, 20746.2))
    assert m and (m["step"], m["steps"], m["ms"], m["tps"]) == ("2", "10", "12.34", "20746")
    assert perf_step_line(2, 10, 12.34, 20746) == "PERF step 2/10 | 12.34 ms | 20746 tok/s"
    line = perf_summary_line(9, 12.34, 20746)
    assert line == "PERF summary | measured_steps 9 | avg 12.34 ms | avg 20746 tok/s"
    m = PERF_SUMMARY_RE.search(line)
    assert m and (m["n"], m["ms"], m["tps"]) == ("9", "12.34", "20746")


# ---------------------------------------------------------------- the step-2 running-mean quirk

def test_megatron_step2_correction_example_from_spec(tmp_path):
    text = "\n".join([MEGATRON_LINE_1, megatron_line(2, 5.209259), megatron_line(3, 4.9)])
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", text))
    assert rec.steps[1].loss == 5.209259  # parsers keep what was logged
    fixed = correct_megatron_step2(rec)
    assert fixed.steps[1].loss == pytest.approx(5.061180, abs=1e-9)
    assert abs(fixed.steps[1].loss - 5.060843) < 5e-4  # InfiniTrain's step 2 in the same real run
    assert fixed.steps[0].loss == 5.357338 and fixed.steps[2].loss == 4.9
    assert fixed.meta["megatron_step2_logged_loss"] == 5.209259
    assert rec.steps[1].loss == 5.209259  # the input record is untouched
    assert correct_megatron_step2(fixed).steps[1].loss == fixed.steps[1].loss  # never twice


def test_lockstep_megatron_log_is_recognised_and_never_corrected(tmp_path):
    text = "\n".join(["[COMMAND] torchrun -m lockstep.runners.megatron ...",
                      f"[INFO] written by {LOCKSTEP_MEGATRON_MARKER} (true per-step losses)",
                      "[CONFIG] seq=64",
                      megatron_line(1, 5.357338, 100.0), perf_step_line(1, 2, 100.0, 2560.0),
                      megatron_line(2, 5.060843, 50.0), perf_step_line(2, 2, 50.0, 5120.0)])
    rec = parse_log_file(write(tmp_path, "gpt2_1.log", text))
    assert rec.origin == "lockstep-megatron-log"
    assert [s.tokens_per_s for s in rec.steps] == [2560.0, 5120.0]
    with pytest.raises(FormatError, match="lockstep's own"):
        correct_megatron_step2(rec)
    with pytest.raises(FormatError, match="lockstep's own"):
        correct_megatron_step2(RunRecord("megatron", "gpt2_1", list(rec.steps), origin="lockstep"))


def test_marker_far_below_the_top_does_not_count(tmp_path):
    text = "\n".join([megatron_line(i, 5.0) for i in range(1, 30)] + [LOCKSTEP_MEGATRON_MARKER])
    assert detect_log_format(text) == "megatron-lm-log"


# ---------------------------------------------------------------- errors and load_run

def test_unknown_format_and_empty_and_missing_files_name_the_file(tmp_path):
    with pytest.raises(FormatError, match="notes.log.*no step records"):
        parse_log_file(write(tmp_path, "notes.log", "hello\nworld\n"))
    with pytest.raises(FormatError, match="empty.log"):
        parse_log_file(write(tmp_path, "empty.log", ""))
    with pytest.raises(FormatError, match="absent.log.*no such file"):
        parse_log_file(tmp_path / "absent.log")


def test_load_run_reads_records_and_logs(tmp_path):
    rec = RunRecord("pytorch", "gpt2_1", [StepRecord(1, 5.0, 10.0, 100.0)], meta={"device": "cpu"})
    write_run_record(tmp_path / "gpt2_1.jsonl", rec)
    got = load_run(tmp_path / "gpt2_1.jsonl")
    assert got.origin == "lockstep" and got.steps == rec.steps
    got = load_run(write(tmp_path, "gpt2_1.log", LLMC_LINE))
    assert got.origin == "llmc-log"
