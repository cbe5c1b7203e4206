"""`lockstep run`'s data flow: cases -> runners -> records -> comparison -> report.

`plan_run` resolves everything a run needs (device, data, weights, cases, runners) and
rejects what cannot run before any framework starts; `execute_plan` then runs every
(case, framework) pair, listing the ones this machine cannot run as skipped with the reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lockstep.cases.matrix import load_matrix, select_cases
from lockstep.cases.spec import CaseSpec
from lockstep.data.corpus import default_cache_dir
from lockstep.errors import CaseError, LockstepError
from lockstep.formats.llmc_gpt2 import read_gpt2_header
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.fsutil import sha256_file
from lockstep.models.configs import GPT2Config, model_shape
from lockstep.runners import get_runner
from lockstep.runners.base import FrameworkRunner, RunInputs


@dataclass
class RunRequest:
    """What the user asked for; None means "the default"."""

    matrix: str = "gpt2"
    cases: list[str] | None = None
    frameworks: list[str] | None = None
    model: str | None = None
    llmc: str | None = None
    data: str | None = None
    text: str | None = None
    steps: int | None = None
    device: str | None = None
    out: str | None = None
    seed: int = 42
    timeout_s: float | None = None
    infinitrain_build: str | None = None
    megatron_native_bf16: bool = False
    cache_dir: str | None = None


@dataclass
class RunPlan:
    out_dir: Path
    device: str
    inputs: RunInputs
    cases: list[CaseSpec]
    runners: list[FrameworkRunner]
    notes: list[str] = field(default_factory=list)  # what defaults were chosen, said to the user


@dataclass
class CaseOutcome:
    case: CaseSpec
    framework: str
    record: RunRecord | None = None
    skipped: str | None = None  # reason


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_frameworks(notes: list[str]) -> list[str]:
    from lockstep.runners.megatron.runner import megatron_core_installed

    names = ["pytorch"]
    if megatron_core_installed():  # found without importing it (seconds, and noisy warnings)
        names.append("megatron")
    else:
        notes.append("megatron-core is not installed (pip install 'lockstep[megatron]'): running pytorch only")
    if os.environ.get("LOCKSTEP_INFINITRAIN_BUILD"):
        names.append("infinitrain")
    return names


def plan_run(req: RunRequest) -> RunPlan:
    notes: list[str] = []
    device = req.device or default_device()
    if device not in ("cpu", "cuda"):
        raise LockstepError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise LockstepError("--device cuda was asked for but torch sees no CUDA device")
    cache = Path(req.cache_dir) if req.cache_dir else default_cache_dir()

    # Weights: the user's LLMC file (its header gives the shape) or a seeded llm.c init, cached.
    if req.llmc:
        if req.model:
            notes.append(f"--llmc given: the model shape comes from {req.llmc}'s header, not --model {req.model}")
        _, config = read_gpt2_header(req.llmc)
        checkpoint = Path(req.llmc)
    else:
        model_name = req.model or ("gpt2" if device == "cuda" else "gpt2-tiny")
        config = model_shape(model_name)
        checkpoint = ensure_initial_checkpoint(cache, model_name, config, req.seed)
        notes.append(f"weights: llm.c init of {model_name} (seed {req.seed}), {checkpoint}")

    # Tokens: the user's token file, or Tiny Shakespeare (or the named offline corpus) prepared once.
    if req.data:
        tokens_path, corpus = Path(req.data), f"user token file {req.data}"
        stream = read_token_stream(tokens_path, vocab_size=config.vocab_size)
        tokens_sha = sha256_file(tokens_path)
    else:
        from lockstep.data.prepare import ensure_prepared

        prepared = ensure_prepared(cache_dir=cache, text_path=req.text)
        tokens_path, corpus, tokens_sha = prepared.train_path, prepared.corpus_name, prepared.train_sha256
        stream = read_token_stream(tokens_path, vocab_size=config.vocab_size)
        notes.append(f"data: {prepared.corpus_name} train split, {prepared.train_tokens:,} tokens ({tokens_path})")
        if not prepared.is_tiny_shakespeare:
            notes.append(f"corpus: {prepared.corpus_description}")

    # Cases: every one is checked against the model and the token file before anything runs.
    all_cases = load_matrix(req.matrix)
    cases = select_cases(all_cases, req.cases, source=f"matrix {req.matrix}")
    if req.steps is not None:
        cases = [c.with_overrides(steps=req.steps) for c in cases]
    for c in cases:
        c.check(max_seq_len=config.max_seq_len, available_tokens=len(stream))
    if config.family != "gpt2":
        raise CaseError(f"only GPT-2 checkpoints are supported by the runners so far, not {config.family}")

    frameworks = req.frameworks or default_frameworks(notes)
    if len(set(frameworks)) != len(frameworks):
        raise LockstepError(f"--frameworks lists a framework twice: {','.join(frameworks)}")
    runners = [get_runner(name, **runner_options(name, req)) for name in frameworks]

    out_dir = Path(req.out) if req.out else Path("lockstep-out")
    inputs = RunInputs(checkpoint=checkpoint, tokens=Path(tokens_path), model=config, device=device,
                       checkpoint_sha256=sha256_file(checkpoint), tokens_sha256=tokens_sha, corpus=corpus,
                       timeout_s=req.timeout_s)
    for runner in runners:
        runner.preflight(inputs)  # e.g. a missing InfiniTrain binary stops here, before any run
    return RunPlan(out_dir=out_dir, device=device, inputs=inputs, cases=cases, runners=runners, notes=notes)


def runner_options(name: str, req: RunRequest) -> dict:
    if name == "infinitrain":
        return {"build_dir": req.infinitrain_build}
    if name == "megatron" and req.megatron_native_bf16:
        return {"native_bf16": True}
    return {}


def ensure_initial_checkpoint(cache: Path, model_name: str, config: GPT2Config, seed: int) -> Path:
    from lockstep.models.init import INIT_SCHEME, write_initial_checkpoint

    path = cache / "checkpoints" / f"{model_name}_llmc_init_seed{seed}_{INIT_SCHEME}.bin"
    if path.is_file():
        try:
            _, cached = read_gpt2_header(path)
            if cached == config:
                return path
        except LockstepError:
            pass  # a damaged cache entry is rewritten below
    write_initial_checkpoint(path, config, seed)
    return path


def execute_plan(plan: RunPlan, on_start: Callable[[CaseSpec, str], None] | None = None,
                 on_step: Callable[[StepRecord], None] | None = None,
                 on_end: Callable[[CaseOutcome], None] | None = None) -> list[CaseOutcome]:
    outcomes = []
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    for case in plan.cases:
        for runner in plan.runners:
            reason = runner.skip_reason(case, plan.inputs)
            if reason:
                outcome = CaseOutcome(case, runner.name, skipped=reason)
            else:
                if on_start:
                    on_start(case, runner.name)
                outcome = CaseOutcome(case, runner.name, record=runner.run(case, plan.inputs, plan.out_dir, on_step))
            outcomes.append(outcome)
            if on_end:
                on_end(outcome)
    return outcomes
