"""`lockstep diagnose`'s data flow: plan (as `lockstep run` plans) -> step-1 captures -> drift ->
verdicts -> <out>/diagnose/<case>_<base>_vs_<test>.{json,npz...}.

With `at_step` N (> 0; stepcheck/state.py): first the reference's state after step N, made once;
then every framework's capture of step N+1 from it (with the update its optimizer applied), and
the same comparison; no drift (it runs from step 0) and no FP64 allowance (it is of step 1).

Two ways in: a fresh plan from the same options as `lockstep run` (`--case NAME` of a matrix),
or an existing run directory, whose run.json gives the case, the checkpoint, the tokens and the
device; there the losses of the run itself serve as the drift at the case's lr.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.capture.request import CaptureRequest, make_sketch, update_values
from lockstep.cases.spec import CaseSpec, CheckpointSpec
from lockstep.compare.pairing import DIAGNOSE_DIR
from lockstep.diagnose.verdict import DriftRun, DriftStep, Verdict, diagnose_captures
from lockstep.formats.step_capture import GRAD_ADAM_MOMENT, GRAD_ADAM_UPDATE, GRAD_EXACT, SKETCH_KINDS, StepCapture
from lockstep.step_contract import LOGGED_LOSS_WORDS
from lockstep.errors import LockstepError
from lockstep.formats import run_manifest
from lockstep.formats.run_record import read_run_record
from lockstep.fsutil import atomic_write, check_free_space
from lockstep.models import read_checkpoint_layout
from lockstep.plan import RunRequest, plan_run
from lockstep.runners import get_runner, reference_framework, spec_for
from lockstep.runners.base import Background, RunInputs, capture_problem, unsupported_needs
from lockstep.runners.reference import SavedState, reference_services
from lockstep.stepcheck.judge import Fp64Step, judge
from lockstep.stepcheck.request import adam_eps as adam_eps_of
from lockstep.stepcheck.request import capture_request, optimizer_of
from lockstep.stepcheck.state import check_at_step, make_start_state, remove_start_state, start_note

DRIFT_LRS = (1e-12, 1e-5)  # frozen weights, a small step; the case's own lr is added
DEFAULT_DRIFT_STEPS = 5



@dataclass
class DiagnoseRequest:
    case: str
    run_dir: str | None = None
    frameworks: list[str] | None = None
    matrix: str = "gpt2"
    model: str | None = None
    llmc: str | None = None
    data: str | None = None
    text: str | None = None
    device: str | None = None
    out: str | None = None
    seed: int = 42
    timeout_s: float | None = None
    framework_options: dict = field(default_factory=dict)  # as RunRequest's: a runner spec's name -> its options
    drift: bool = True
    drift_steps: int = DEFAULT_DRIFT_STEPS
    keep_tensors: bool = False  # keep the step-1 captures' whole tensors, not only their sketches
    at_step: int = 0  # > 0: compare step at_step+1, every framework from the reference's state after at_step


@dataclass
class DiagnosePlan:
    case: CaseSpec
    inputs: RunInputs
    frameworks: list[str]  # baseline first
    out_dir: Path  # <out>/diagnose
    run_dir: Path | None = None  # an existing run whose losses are the drift at the case's lr
    options: dict = field(default_factory=dict)  # a runner spec's name -> its options (RunRequest.framework_options)
    at_step: int = 0  # see DiagnoseRequest

    def runner(self, framework: str):
        return get_runner(framework, framework_options=self.options)


def plan_diagnose(req: DiagnoseRequest) -> DiagnosePlan:
    if req.at_step < 0:  # said before anything is planned or trained
        raise LockstepError(f"--at-step {req.at_step}: a step cannot be negative (0, or no --at-step, compares step 1)")
    plan = _plan_from_run_dir(req) if req.run_dir else _plan_fresh(req)
    plan.at_step = req.at_step
    check_at_step(plan.case, plan.at_step, plan.frameworks, plan.runner, plan.inputs)
    return plan


def _plan_fresh(req: DiagnoseRequest) -> DiagnosePlan:
    run_req = RunRequest(matrix=req.matrix, cases=[req.case], frameworks=req.frameworks, model=req.model,
                         llmc=req.llmc, data=req.data, text=req.text, device=req.device, out=req.out or "lockstep-out",
                         seed=req.seed, timeout_s=req.timeout_s, framework_options=req.framework_options)
    plan = plan_run(run_req)
    case = plan.cases[0]
    if case.name in plan.unrunnable:
        raise LockstepError(f"case {case.name} cannot run here: {plan.unrunnable[case.name]}")
    frameworks = [r.name for r in plan.runners]
    _check_pair(frameworks)
    return DiagnosePlan(case=case, inputs=plan.inputs[case.name], frameworks=frameworks,
                        out_dir=plan.out_dir / DIAGNOSE_DIR,
                        options=dict(req.framework_options))


def _check_pair(frameworks: list[str]) -> None:
    if len(frameworks) < 2:
        raise LockstepError(f"diagnose compares two frameworks, got {', '.join(frameworks) or 'none'}; "
                            "pass --frameworks BASE,TEST")


def _plan_from_run_dir(req: DiagnoseRequest) -> DiagnosePlan:
    run_dir = Path(req.run_dir)
    manifest_path = run_manifest.manifest_path(run_dir)
    if not manifest_path.is_file():
        raise LockstepError(f"{run_dir}: no run.json, so not a directory `lockstep run` wrote")
    manifest = run_manifest.read_manifest(run_dir)
    cases = {c["name"]: CaseSpec.from_dict(c) for c in manifest.get("cases", [])}
    if req.case not in cases:
        raise LockstepError(f"{manifest_path}: has no case {req.case!r} (cases: {', '.join(cases)})")
    case = cases[req.case]
    model = next((m for m in manifest.get("models", [manifest.get("model")]) if m and m.get("name") == case.model),
                 manifest.get("model"))
    checkpoint, tokens = Path(model["checkpoint"]), Path(model["data"])
    for what, p in (("checkpoint", checkpoint), ("token file", tokens)):
        if not p.is_file():
            raise LockstepError(f"{manifest_path}: the run's {what} {p} no longer exists")
    fam, layout = read_checkpoint_layout(checkpoint)
    frameworks = req.frameworks or _failed_pair(run_dir, manifest, case.name)
    # A LoRA case's adapters start from the run's seed, as its records say (models/lora.py).
    seeds = [m["lora_seed"] for fw in frameworks if (m := _recorded_meta(run_dir, fw, case.name)) and "lora_seed" in m]
    inputs = RunInputs(checkpoint=checkpoint, tokens=tokens, model=layout.config, device=manifest.get("device", "cpu"),
                       model_name=model.get("name", ""), checkpoint_sha256=model.get("checkpoint_sha256", ""),
                       tokens_sha256=model.get("data_sha256", ""), corpus=model.get("corpus", ""),
                       timeout_s=req.timeout_s, **({"lora_seed": seeds[0]} if seeds else {}))
    _check_pair(frameworks)
    options = dict(req.framework_options)
    for fw in frameworks:
        spec = spec_for(fw, options)
        recorded = _recorded_meta(run_dir, fw, case.name)
        if spec.from_record is not None and recorded is not None:
            options[spec.name] = spec.from_record(spec.options(options.get(spec.name)), {**recorded, "framework": fw})
        get_runner(fw, framework_options=options).preflight(inputs)  # e.g. no build at all: said now, before any capture
    return DiagnosePlan(case=case, inputs=inputs, frameworks=frameworks, out_dir=run_dir / DIAGNOSE_DIR,
                        run_dir=run_dir, options=options)


def _recorded_meta(run_dir: Path, framework: str, case: str) -> dict | None:
    """What the run recorded of `framework` on `case` (its record's meta: e.g. the build it used)."""
    path = run_dir / framework / f"{case}.jsonl"
    if not path.is_file():
        return None
    try:
        return read_run_record(path).meta
    except LockstepError:
        return None


def _failed_pair(run_dir: Path, manifest: dict, case: str) -> list[str]:
    """The baseline and every framework whose comparison on `case` failed (all of them when unknown)."""
    baseline = manifest.get("baseline") or manifest["frameworks"][0]
    summary_path = run_dir / "summary.json"
    failed = []
    if summary_path.is_file():
        for comp in json.loads(summary_path.read_text()).get("comparisons", []):
            if any(c.get("case") == case and not c.get("passed") for c in comp.get("cases", [])):
                failed.append(comp["test_framework"])
    return [baseline] + (failed or [f for f in manifest["frameworks"] if f != baseline])


def pair_drift(plan: DiagnosePlan, losses: dict[str, dict[float, dict[int, float]]], base: str,
               test: str) -> list[DriftRun]:
    """Both frameworks' losses at lr 1e-12, 1e-5 and the case's lr, paired step by step, up to the
    first lr either could not measure (the drift is evidence beside step 1: it never stops a verdict)."""
    out = []
    for lr in drift_lrs(plan.case):
        ref, other = losses.get(base, {}).get(lr), losses.get(test, {}).get(lr)
        if ref is None or other is None:
            break
        from_run_dir = "from the run directory's records" if lr == plan.case.lr and plan.run_dir else ""
        out.append(DriftRun(lr, [DriftStep(s, ref[s], other[s]) for s in sorted(set(ref) & set(other))], from_run_dir))
    return out


def step1_and_drift(plan: DiagnosePlan, fw: str, request: CaptureRequest, drift: bool,
                    steps: int, seconds: dict[str, float] | None = None) -> tuple[StepCapture, dict[float, dict[int, float]], str]:
    """One framework's step 1 with whole tensors, and its losses at the drift lrs (up to the first
    it could not measure, and why not). Where the runner has persistent workers for them, the
    one-step capture and the drift runs go to one worker group: one megatron start-up, not two.
    `seconds` gets where the time went: "capture" (its runs), "drift", and for a capture read in the
    background, "capture reading" (what lockstep still had to read of it once the drift was done)."""
    seconds = {} if seconds is None else seconds
    start = time.perf_counter()
    runner = plan.runner(fw)
    problem = capture_problem(runner, plan.case, plan.inputs)
    if problem:
        raise LockstepError(f"diagnose cannot look inside {fw} on case {plan.case.name}: {problem}")
    got, todo, note = drift_runs(plan, fw, steps) if drift else ({}, [], "")
    step1 = captured_case(plan, request)
    key = runner.worker_group_key(step1, plan.inputs)
    together = (key is not None and runner.skip_reason(step1, plan.inputs) is None
                and all(runner.worker_group_key(c, plan.inputs) == key for _, c in todo))
    pairs = [(c, plan.inputs) for _, c in todo]
    if together:
        pairs.insert(0, (step1, dataclasses.replace(plan.inputs, capture=request)))
    else:
        # The drift runs while lockstep reads what the capture's launches wrote (InfiniTrain's weights).
        capture = runner.start_capture(plan.case, plan.inputs, plan.out_dir, request)
        seconds["capture"] = time.perf_counter() - start
    keys = {runner.worker_group_key(c, i) for c, i in pairs}
    drift_start = time.perf_counter()
    records = runner.run_many(pairs, [plan.out_dir / "drift"], persistent=len(keys) == 1 and None not in keys)
    seconds["capture and drift" if together else "drift"] = time.perf_counter() - drift_start
    if together:
        (first, *_), records = records[0], records[1:]
        if not first.ok or not first.meta.get("step1_capture"):
            raise LockstepError(f"{fw}'s step 1 could not be captured: "
                                f"{first.error or first.meta.get('step1_capture_error') or 'no capture written'}")
    else:
        waited = time.perf_counter()
        capture.result()
        if capture.in_background:
            seconds["capture reading"] = time.perf_counter() - waited
    for (lr, _), (record, *_) in zip(todo, records):
        if not record.ok:
            note = f"drift not measured from lr {lr:g} on: {fw} failed ({record.error})"
            break
        got[lr] = {s.step: s.loss for s in record.steps}
    return StepCapture.load(request.path), got, note


def drift_runs(plan: DiagnosePlan, fw: str, steps: int) -> tuple[dict, list, str]:
    """The drift losses the run directory already holds, the drift cases still to run ((lr, case)),
    and why none can run (or "")."""
    runner = plan.runner(fw)
    got: dict[float, dict[int, float]] = {}
    todo = []
    for lr in drift_lrs(plan.case):
        reused = _run_dir_losses(plan, fw) if lr == plan.case.lr else None
        if reused is not None:
            got[lr] = reused
            continue
        drift_case = plan.case.first_steps(min(steps, plan.case.steps), lr=lr, name=f"{plan.case.name}_lr{lr:g}")
        if fw == reference_framework() and (drift_case.tp > 1 or drift_case.pp > 1):
            # The reference trains the same global batch on one device (its step-1 capture does too).
            drift_case = drift_case.with_overrides(tp=1, pp=1, vpp=1, sp=False, pp_layout=None)
        reason = runner.skip_reason(drift_case, plan.inputs)
        if reason:
            return got, [], f"drift not measured: {fw} cannot run case {plan.case.name} here ({reason})"
        todo.append((lr, drift_case))
    return got, todo, ""


def captured_case(plan: DiagnosePlan, request: CaptureRequest) -> CaseSpec:
    """The case a runner that captures as it trains (megatron's workers) runs: step 1 alone, or from a
    saved state a resume at the state's step that trains the one step after it."""
    if request.start_state is None:
        return plan.case.first_steps(1, name=f"{plan.case.name}_step1")
    return plan.case.first_steps(request.step, name=f"{plan.case.name}_step{request.step}",
                                 checkpoint=CheckpointSpec(resume_from=request.start_step))


def drift_lrs(case) -> list[float]:
    return [lr for lr in DRIFT_LRS if lr != case.lr] + [case.lr]


def _run_dir_losses(plan: DiagnosePlan, framework: str) -> dict[int, float] | None:
    if plan.run_dir is None:
        return None
    path = plan.run_dir / framework / f"{plan.case.name}.jsonl"
    if not path.is_file():
        return None
    record = read_run_record(path)
    return {s.step: s.loss for s in record.steps} if record.ok else None


def run_diagnose(plan: DiagnosePlan, drift: bool = True, drift_steps: int = DEFAULT_DRIFT_STEPS,
                 say=lambda text: None, keep_tensors: bool = False) -> list[Verdict]:
    """The verdicts of every test against the baseline, written to plan.out_dir. The step-1
    captures are kept as sketches only once the verdicts are written (`keep_sketches_only`), unless
    `keep_tensors`."""
    verdicts, kept, state = _run_diagnose(plan, drift and not plan.at_step, drift_steps, say)
    if state is not None and not keep_tensors:
        remove_start_state(state)
    if not keep_tensors:
        before = sum(p.stat().st_size for p in kept)
        for path in kept:
            keep_sketches_only(path)
        after = sum(p.stat().st_size for p in kept)
        say(f"{'step-1 ' if not plan.at_step else ''}captures kept as sketches: {after / 1e6:.1f} MB instead of {before / 1e6:.1f} MB of whole "
            "tensors (--keep-tensors keeps them whole)")
    return verdicts


def keep_sketches_only(path: Path) -> None:
    """Rewrite a diagnose capture with every whole tensor replaced by its sketch and exact norm
    (capture/sketch.py: what the certificate of `lockstep run` keeps, a few MB whatever the model):
    the verdict is made from the whole tensors, and what is left can still be compared and named."""
    capture = StepCapture.load(path)
    sketches = dict(capture.sketches)
    for kind in SKETCH_KINDS:
        store = capture.store(kind)
        for name in store:
            sketches.setdefault(f"{kind}/{name}", make_sketch(update_values(store[name], capture.update_levels)))
    dataclasses.replace(capture, forward={}, output_grads={}, grads={}, updates={}, tie_parts={}, sketches=sketches,
                        meta={**capture.meta, "whole_tensors": "sketched after the verdict (--keep-tensors keeps them)"}
                        ).save(path)


@dataclass
class Looking:
    """What one diagnose gathers on its way to the verdicts: each framework's capture of the step,
    its drift losses and notes, where its time went, and the reference's FP64 step 1."""

    plan: DiagnosePlan
    state: SavedState | None  # the reference's state the step starts from (--at-step), or None (step 1)
    drift: bool
    drift_steps: int
    captures: dict[str, StepCapture] = field(default_factory=dict)
    losses: dict[str, dict[float, dict[int, float]]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    fp64: Fp64Step | None = None
    beside: bool = False  # the reference ran in a thread beside the others

    @property
    def step(self) -> int:
        return self.plan.at_step + 1

    @property
    def fp64_path(self) -> Path:
        return self.plan.out_dir / f"{reference_framework()}-fp64_{self.plan.case.name}_step1.npz"


def _run_diagnose(plan: DiagnosePlan, drift: bool, drift_steps: int,
                  say) -> tuple[list[Verdict], list[Path], SavedState | None]:
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    tests = plan.frameworks[1:]
    check_frameworks(plan)
    check_free_space(plan.out_dir, diagnose_scratch_bytes(plan, tests), "lockstep diagnose's step-1 captures")
    reference = reference_services(plan.options)
    state = make_start_state(reference, plan.case, plan.inputs, plan.at_step, plan.out_dir, say) if plan.at_step else None
    looking = Looking(plan, state, drift, drift_steps)
    looking.fp64 = Fp64Step.for_pair(plan.frameworks[0], reference.name, looking.step, lambda: fp64_step1(looking))
    capture_every_framework(looking, say)
    verdicts = [judge_pair(looking, test, say) for test in tests]
    if looking.fp64.capture is not None and not looking.fp64.used:
        looking.fp64_path.unlink(missing_ok=True)  # made in advance for a close call that did not come
    kept = [Path(c.source) for c in looking.captures.values() if c.source and Path(c.source).is_file()]
    return verdicts, sorted(set(kept)), state


def check_frameworks(plan: DiagnosePlan) -> None:
    """What the case needs (LoRA, resume) every framework must implement, the reference included; the
    reference runs in this process whatever the case's DP/TP/PP (the math is the same), the others
    must be able to run the case here, as `lockstep run` would."""
    for fw in plan.frameworks:
        lacking = unsupported_needs(plan.case, plan.runner(fw))
        if lacking:
            raise LockstepError(f"{fw} cannot run case {plan.case.name}: {lacking}")
        problem = capture_problem(plan.runner(fw), plan.case, plan.inputs)
        if problem:
            raise LockstepError(f"diagnose cannot look inside {fw} on case {plan.case.name}: {problem}")
        if fw != reference_framework():
            reason = plan.runner(fw).skip_reason(plan.case, plan.inputs)
            if reason:
                raise LockstepError(f"{fw} cannot run case {plan.case.name} here: {reason}")


def fp64_step1(looking: Looking) -> StepCapture:
    """The reference's step 1 of the case in FP64 (the close call's yardstick)."""
    start = time.perf_counter()
    capture = reference_services(looking.plan.options).fp64_step1(looking.plan.case, looking.plan.inputs,
                                                                 looking.fp64_path)
    looking.seconds["fp64 step 1"] = time.perf_counter() - start
    return capture


def capture_every_framework(looking: Looking, say) -> None:
    """Every framework's capture of the step, the reference first (it has the structure). The
    reference trains in this process, in a thread of its own beside the other frameworks' processes
    where the device holds both (diagnose measures no speed); a capture that reads the reference's
    waits for it. Beside the others, with room for it, the reference's FP64 step 1 is made in
    advance (it costs nothing there) and removed unused if no call is close."""
    plan = looking.plan
    ref = reference_framework()

    def reference_and_fp64(fw: str) -> None:
        capture_one(looking, fw, say)
        if plan.frameworks[0] == ref and beside_fits(plan, extra=1) and not looking.fp64.unavailable:
            looking.fp64 = Fp64Step.ready(fp64_step1(looking))

    looking.beside = beside_fits(plan) and not plan.at_step
    reference = Background(reference_and_fp64, ref, name=f"lockstep-diagnose-{ref}") if looking.beside else None
    if reference is None:
        capture_one(looking, ref, say)
    for fw in [f for f in plan.frameworks if f != ref]:
        if reference is not None and plan.runner(fw).capture_needs_reference(plan.case, plan.inputs):
            reference.result()
        capture_one(looking, fw, say)
    if reference is not None:
        reference.result()


def capture_one(looking: Looking, fw: str, say) -> None:
    """One framework's whole-tensor capture of the step (and its drift), with where its time went."""
    plan, state, step = looking.plan, looking.state, looking.step
    drift = looking.drift and fw in plan.frameworks
    say(f"step {step} on {fw}" + (f" from the reference's state after step {plan.at_step}" if state else "")
        + (f", and its drift at lr {', '.join(f'{lr:g}' for lr in drift_lrs(plan.case))}" if drift else "") + " ...")
    start = time.perf_counter()
    ref = reference_framework()
    signs_only = adam_view_only(plan, plan.frameworks[1:])
    request = capture_request(plan.out_dir / f"{fw}_{plan.case.name}_step{step}.npz", optimizer_of(plan.case, plan.inputs),
                              reference=(plan.out_dir / f"{ref}_{plan.case.name}_step{step}.npz" if fw != ref else None),
                              full=True, whole_grads=not (fw == plan.frameworks[0] and signs_only), applied=True,
                              start=state)
    parts: dict[str, float] = {}
    looking.captures[fw], looking.losses[fw], looking.notes[fw] = step1_and_drift(plan, fw, request, drift,
                                                                                  looking.drift_steps, parts)
    looking.seconds[fw] = time.perf_counter() - start
    looking.phases[fw] = {k: round(v, 2) for k, v in parts.items()}
    say(f"{fw}: {looking.seconds[fw]:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in parts.items())})"
        + (f" ({looking.notes[fw]})" if looking.notes[fw] else ""))


def judge_pair(looking: Looking, test: str, say) -> Verdict:
    """The baseline against `test`: one judgement (the close-call rule in stepcheck/judge.py), its
    notes and where the time went; written to the diagnose folder."""
    plan, base = looking.plan, looking.plan.frameworks[0]
    t1 = time.perf_counter()
    runs = pair_drift(plan, looking.losses, base, test) if looking.drift else []
    captures = looking.captures
    verdict = judge(lambda fp64, diffs: diagnose_captures(
        captures[base], captures[test], plan.case, drift=runs, structure=captures[reference_framework()],
        adam_eps=adam_eps_of(optimizer_of(plan.case, plan.inputs)), fp64=fp64, diffs=diffs), looking.fp64, say)
    if looking.state is not None:
        verdict.notes.insert(0, start_note(looking.state))
    drift_note = looking.notes[base] or looking.notes[test]
    verdict.notes += [drift_note] if drift_note else []
    verdict.notes += [f"logged loss, {fw}: {LOGGED_LOSS_WORDS[plan.runner(fw).logged_loss]}" for fw in (base, test)]
    verdict.seconds = pair_seconds(looking, base, test) | {"compare": round(time.perf_counter() - t1, 2)}
    write_verdict(plan.out_dir, verdict)
    return verdict


def pair_seconds(looking: Looking, base: str, test: str) -> dict[str, float]:
    """Where a pair's time went, for its verdict."""
    state, seconds = looking.state, looking.seconds
    out = {(f"step{looking.step}_{fw}" if state else f"step1_and_drift_{fw}"): round(seconds[fw], 2) for fw in (base, test)}
    out |= {f"{fw} {k}": v for fw in (base, test) for k, v in looking.phases[fw].items()}
    if state is not None:
        out[f"reference's state after step {state.step}"] = round(state.seconds, 2)
    if "fp64 step 1" in seconds:
        out["reference's fp64 step 1" + (" (beside)" if looking.beside else ", in compare")] = \
            round(seconds["fp64 step 1"], 2)
    return out


def beside_fits(plan: DiagnosePlan, extra: int = 0) -> bool:
    """Whether the reference can train beside the other frameworks: a GPU that holds every framework's
    weights, gradients and optimizer state at once (on a CPU they would only share its cores), and
    `extra` more of them (the reference's FP64 step 1 is about one)."""
    from lockstep.plan import device_memory_bytes, estimated_bytes_per_device

    if plan.inputs.device != "cuda" or reference_framework() not in plan.frameworks:
        return False
    memory = device_memory_bytes("cuda")
    need = estimated_bytes_per_device(plan.case.with_overrides(tp=1, pp=1, vpp=1), plan.inputs.model)
    return bool(memory) and 2 * need * (len(plan.frameworks) + extra) < memory


def capture_grad_kinds(plan: DiagnosePlan, frameworks: list[str]) -> list[str]:
    return [plan.runner(f).capture_grad_kind(plan.case, plan.inputs) for f in frameworks]


def adam_view_only(plan: DiagnosePlan, tests: list[str]) -> bool:
    """Whether every test shows only its first Adam update, so that the baseline need keep no more."""
    return (plan.inputs.family.optimizer.kind == "adam"
            and all(k == GRAD_ADAM_UPDATE for k in capture_grad_kinds(plan, tests)))


def diagnose_scratch_bytes(plan: DiagnosePlan, tests: list[str]) -> int:
    """Disk a diagnose needs at its peak, with a quarter more for what rides along (module outputs,
    a framework's save holding a tied head twice): the baseline's capture (FP32 gradients, or int8
    Adam update signs when every test shows only that), every test's capture (FP32 gradients, or
    int8 signs), and the largest FP32 checkpoint a test saves its step into (InfiniTrain: its
    gradients are recovered from it, read and let go before its own capture is written; with
    Adam, its optimizer state's two moments beside the weights). Captures
    are compared one tensor at a time, never loaded whole."""
    n = plan.inputs.model.num_parameters()
    kinds = capture_grad_kinds(plan, tests)
    captures = (1 if adam_view_only(plan, tests) else 4) * n + sum((1 if k == GRAD_ADAM_UPDATE else 4) * n for k in kinds)
    # the step's save: FP32 weights, and with Adam's moments (GRAD_ADAM_MOMENT) its optimizer.ckpt's two more
    saves = max(((12 if k == GRAD_ADAM_MOMENT else 4) * n for k in kinds if k != GRAD_EXACT), default=0)
    return (captures + saves) * 5 // 4


def verdict_path(out_dir: Path, verdict: Verdict) -> Path:
    at = f".at_step{verdict.at_step}" if verdict.at_step else ""
    return out_dir / f"{verdict.case}_{verdict.reference}_vs_{verdict.test}{at}.json"


def write_verdict(out_dir: Path, verdict: Verdict) -> Path:
    path = verdict_path(out_dir, verdict)
    with atomic_write(path, "w", what="diagnose verdict") as f:
        json.dump(verdict.to_json(), f, indent=2, allow_nan=True)
        f.write("\n")
    return path
