"""The plan of a run: cases x frameworks x devices, resolved before anything trains.

`plan_run` resolves everything a run needs (device, data, weights, cases, runners) and rejects
what cannot run before any framework starts. Every (case, framework) pair that will not run here
is in the plan with the reason (`RunPlan.skip_reason`): too few devices, a framework that cannot
run the case on this machine, or a baseline run that nothing would be compared with.
`lockstep run --dry-run` prints this plan and stops.
"""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.cases.matrix import load_matrix, select_cases
from lockstep.cases.spec import CaseSpec
from lockstep.cases.twins import recompute_twins
from lockstep.compare.pairing import STEP1_DIR
from lockstep.data.corpus import default_cache_dir
from lockstep.errors import CaseError, FormatError, LockstepError
from lockstep.formats import llmc
from lockstep.formats.tokens import read_token_stream
from lockstep.fsutil import sha256_file
from lockstep.initial_weights import checkpoint_digest, ensure_initial_checkpoint
from lockstep.models import CPU_SHAPES, family, model_shape, read_checkpoint_layout
from lockstep.runners import get_runner
from lockstep.runners.base import (FrameworkRunner, RunInputs, available_devices, case_skip_reason,
                                    device_shortage)
from lockstep.runners.nodes import NodeLayout


@dataclass
class RunRequest:
    """What the user asked for; None means "the default"."""

    matrix: str = "gpt2"
    cases: list[str] | None = None
    frameworks: list[str] | None = None
    model: str | None = None
    groups: list[str] | None = None  # InfiniTrain test_config.json: its test groups by tag
    llmc: str | None = None
    data: str | None = None
    text: str | None = None
    steps: int | None = None
    device: str | None = None
    out: str | None = None
    seed: int = 42
    timeout_s: float | None = None
    # A runner spec's name -> its options (runners.framework_options_from: e.g. the infinitrain
    # build, megatron's native bf16, the command runner's TOML trainers); absent: its defaults.
    framework_options: dict = field(default_factory=dict)
    cache_dir: str | None = None
    oversubscribe: bool = False  # CPU: run cases with more ranks than cores (gloo, 1 torch thread per rank)
    nodes: NodeLayout = field(default_factory=NodeLayout)  # --nnodes/--node-rank/--rdzv-endpoint/--launcher
    # Start each framework's workers once per world size and run every case that fits in them
    # (--no-persistent-workers: one process per case).
    persistent_workers: bool = True
    # Pairs that run as processes of their own (runners' `runs_apart`) run up to this many at once
    # (--jobs); their tok/s is then measured side by side with each other, and said so.
    jobs: int = 1
    certify: bool = True  # a step-1 certificate for every FP32 pair (--no-certify)
    certify_bf16: bool = False  # and for BF16 pairs (--certify-bf16)
    # Record step 1 from inside even with one framework (no pair to certify): `bisect --expect
    # identical` judges each commit's capture against the good commit's, bit for bit.
    record_step1: bool = False
    # Measure each case's shape roofline after the runs (lockstep/roofline.py): None, on CUDA only
    # (--roofline / --no-roofline).
    roofline: bool | None = None


@dataclass(frozen=True)
class PlannedModel:
    """The model one or more cases train: a registered shape or the user's checkpoint."""

    name: str  # registered shape name, or the --llmc file's name
    family: str
    config: Any
    checkpoint: Path | None  # None until made (a seeded init is written only if some case runs it)
    seed: int | None = None


@dataclass
class RunPlan:
    out_dir: Path
    device: str
    cases: list[CaseSpec]
    inputs: dict[str, RunInputs]  # case name -> what every framework gets for it
    runners: list[FrameworkRunner]
    notes: list[str] = field(default_factory=list)  # what defaults were chosen, said to the user
    unrunnable: dict[str, str] = field(default_factory=dict)  # case -> why no framework can run it here
    nodes: NodeLayout = field(default_factory=NodeLayout)
    persistent_workers: bool = True
    jobs: int = 1  # RunRequest.jobs
    certify: bool = True
    certify_bf16: bool = False
    record_step1: bool = False  # RunRequest.record_step1
    # Each recompute case -> its twin without recompute, judged bit for bit per framework (cases/twins.py).
    twins: dict[str, str] = field(default_factory=dict)
    # Worker groups started before the plan was made (`start_first_group_early`), by (runner, key):
    # execute_plan takes the one it needs first and stops the others.
    early_groups: dict = field(default_factory=dict)
    # (case, framework) -> why that pair does not run here; None until asked (`skip_reason` fills
    # it from the runners: a plan made by hand in a test lists no skips of its own).
    skips: dict[tuple[str, str], str] | None = None
    cuda_start: Any = None  # the thread making this process's CUDA context (joined before the run ends)
    roofline: bool = False  # measure each trained case's shape roofline (RunRequest.roofline)
    cache_dir: Path | None = None  # lockstep's cache root (the rooflines' cache); None: the default

    def skip_reason(self, case: CaseSpec, runner: FrameworkRunner) -> str | None:
        """Why the pair does not run here, or None when it runs."""
        if self.skips is None:
            self.skips = pair_skips(self.cases, self.runners, self.inputs, self.unrunnable)
        return self.skips.get((case.name, runner.name))

    def runs(self, case: CaseSpec, runner: FrameworkRunner) -> bool:
        return self.skip_reason(case, runner) is None

    def certifies(self, case: CaseSpec) -> bool:
        """Whether the case's pairs get a step-1 certificate: several frameworks, FP32 (BF16 when asked),
        one node (every node would have to record the same step; a multi-node run is not certified)."""
        return self.certify and len(self.runners) > 1 and not self.nodes.multi_node and (
            not case.is_bf16 or self.certify_bf16)

    def records_step1(self, case: CaseSpec) -> bool:
        """Whether each framework records the case's step 1 from inside while it runs: for its
        certificate, or asked for alone (RunRequest.record_step1); a multi-node run records none."""
        return self.certifies(case) or (self.record_step1 and not self.nodes.multi_node)

    def capture_path(self, framework: str, case: CaseSpec) -> Path:
        return self.out_dir / STEP1_DIR / framework / f"{case.name}.npz"

    def models(self) -> list[RunInputs]:
        """One RunInputs per distinct model, in case order (for headers and run.json)."""
        seen, out = set(), []
        for case in self.cases:
            inputs = self.inputs[case.name]
            if inputs.model_name not in seen:
                seen.add(inputs.model_name)
                out.append(inputs)
        return out



def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def start_cuda_beside():
    """Make this process's CUDA context in a background thread (the driver works without the GIL):
    the first in-process case then finds it made, while the plan hashes and checks files. Returns
    the thread, which the run joins before it ends: a thread inside the driver at interpreter
    shutdown is a fatal error."""
    import threading

    import torch

    def start() -> None:
        try:
            torch.zeros(1, device="cuda")
        except Exception:  # the first case meets the same failure and says it, as a failed run
            pass

    thread = threading.Thread(target=start, name="lockstep-cuda-start", daemon=True)
    thread.start()
    return thread


def default_frameworks(notes: list[str], framework_options: dict | None = None) -> list[str]:
    """What runs without --frameworks: each registered runner that says so (runners.default_frameworks)."""
    from lockstep.runners import default_frameworks as registered_defaults

    return registered_defaults(framework_options, notes)


def resolve_case_models(cases: list[CaseSpec], req: RunRequest, device: str,
                        notes: list[str]) -> tuple[list[CaseSpec], dict[str, PlannedModel]]:
    """The model every case trains, with one meaning of "model": a case names a registered shape;
    `--model` replaces it with another shape of the same family; `--llmc FILE` replaces it with
    the file's header. The case's family, the shape and the file must agree (docs/reference/case-matrices.md).

    Returns the cases with `model` set to what will run, and the models by name.
    """
    models: dict[str, PlannedModel] = {}
    file_model = None
    if req.llmc:
        file_family, layout = read_checkpoint_layout(req.llmc)
        problems = layout.config.training_problems()
        if problems:
            raise FormatError(req.llmc, "; ".join(problems))
        file_model = PlannedModel(name=Path(req.llmc).name, family=file_family.name, config=layout.config,
                                  checkpoint=Path(req.llmc))
        if req.model:
            notes.append(f"--llmc given: the model comes from {req.llmc}'s header, not --model {req.model}")
        notes.extend(check_finite_weights(file_family, req.llmc))
    override = model_shape(req.model) if req.model else None
    resolved = []
    cpu_swaps: dict[str, str] = {}
    for case in cases:
        shape = model_shape(case.model)
        if override is not None and override.family != shape.family:
            raise CaseError(f"case {case.name} trains a {family(shape.family).title} model ({shape.name}) but "
                            f"--model {override.name} is a {family(override.family).title} model")
        if file_model is not None:
            if file_model.family != shape.family:
                raise CaseError(
                    f"case {case.name} trains a {family(shape.family).title} model ({shape.name}"
                    + (f", --model {override.name}" if override else "") + f") but {req.llmc} is a "
                    f"{family(file_model.family).title} checkpoint ({file_model.config.describe()})")
            models[file_model.name] = file_model
            resolved.append(case.with_overrides(model=file_model.name))
            continue
        if override is not None:
            shape = override
        elif device == "cpu" and shape.name != CPU_SHAPES[shape.family]:
            cpu_swaps[shape.name] = CPU_SHAPES[shape.family]
            shape = model_shape(CPU_SHAPES[shape.family])
        models.setdefault(shape.name, PlannedModel(name=shape.name, family=shape.family, config=shape.config,
                                                   checkpoint=None, seed=req.seed))
        resolved.append(case.with_overrides(model=shape.name))
    for big, tiny in cpu_swaps.items():
        notes.append(f"no GPU: cases of {big} train {tiny} instead (pass --model to choose)")
    return resolved, models


def check_finite_weights(fam, path: str) -> list[str]:
    """Refuse a checkpoint holding NaN or Inf before anything trains (naming the tensor), rather
    than fail at step 1 with "loss is nan"; padding rows may hold anything, but it is said."""
    ckpt = fam.load(path)
    padding = fam.padding_rows(ckpt.config)
    bad = llmc.non_finite_tensors(ckpt.tensors, skip_rows=padding)
    if bad:
        name, nan, inf = bad[0]
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        raise FormatError(path, f"tensor {name} holds {nan} NaN and {inf} infinite value(s){more}; "
                                "no framework can train from it")
    notes = []
    for name, first in padding.items():
        rows = ckpt.tensors[name][first:]
        if rows.size and not np.isfinite(rows).all():
            notes.append(f"{path}: {name} padding rows {first}.. hold non-finite values; they never reach a "
                         "logit, so training is unaffected, but llm.c writes zeros there")
    return notes


def machine_skip_reason(case: CaseSpec, config, device: str, oversubscribe: bool = False,
                        nodes: NodeLayout | None = None) -> str | None:
    """Why no framework can run the case on this machine (too few devices, too little memory)."""
    shortage = device_shortage(case, device, oversubscribe, nodes)
    if shortage:
        return shortage
    need = estimated_bytes_per_device(case, config)
    free = device_memory_bytes(device)
    if device == "cpu" and oversubscribe:
        free = free and free // max(1, (nodes or NodeLayout()).procs_per_node(case.world_size))  # ranks share the host
    if free and need > free:
        where = "GPU" if device == "cuda" else "host"
        return (f"needs about {need / 2**30:.0f} GiB per device for FP32 weights, gradients and optimizer state, "
                f"the {where} has {free / 2**30:.0f} GiB")
    return None


def estimated_bytes_per_device(case: CaseSpec, config) -> int:
    """FP32 parameters + gradients (+ Adam's two moments), split over TP x PP; activations aside."""
    from lockstep.models import family as model_family

    per_param = 16 if model_family(config.family).optimizer.kind == "adam" else 8
    return config.num_parameters() * per_param // (case.tp * case.pp)


def device_memory_bytes(device: str) -> int | None:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def plan_run(req: RunRequest, repeat: int = 1, make_files: bool = True) -> RunPlan:
    """The run's plan. `repeat` > 1 keeps a baseline run that nothing is compared with (its repeats
    are compared with each other). `make_files` False (`--dry-run`) prepares no tokens and writes
    no weights: the plan's inputs then name no files, and the cases are not checked against a
    token file's length."""
    notes: list[str] = []
    device = req.device or default_device()
    if device not in ("cpu", "cuda"):
        raise LockstepError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise LockstepError("--device cuda was asked for but torch sees no CUDA device")
    cuda_start = start_cuda_beside() if device == "cuda" and make_files else None
    try:
        plan = _resolve(req, repeat, make_files, device, notes)
    except BaseException:
        if cuda_start is not None:
            cuda_start.join()
        raise
    plan.cuda_start = cuda_start
    return plan


def _resolve(req: RunRequest, repeat: int, make_files: bool, device: str, notes: list[str]) -> RunPlan:
    cache = Path(req.cache_dir) if req.cache_dir else default_cache_dir()
    all_cases = load_matrix(req.matrix, model=req.model, groups=req.groups, notes=notes)
    cases = select_cases(all_cases, req.cases, source=f"matrix {req.matrix}")
    if req.steps is not None:
        cases = [c.with_overrides(steps=req.steps) for c in cases]
    cases, twins = _with_twins(cases, notes)
    cases, models = resolve_case_models(cases, req, device, notes)
    # What this machine cannot run at all is known before any file is made (an 8B init is 32 GB).
    nodes = req.nodes.check()
    fit = _machine_fit(req, cases, models, device, nodes, notes)
    runners = _runners(req, notes)
    # The pairs are judged before any file is made (a seeded init is not made yet: on its shape), and
    # again below on the real inputs.
    placeholders = {c.name: fit.inputs(req, models[c.model], Path("-")) for c in cases}
    cases = adopt_hard_coded(cases, runners, placeholders, notes)
    skip_unpaired_baselines(cases, runners, pair_skips(cases, runners, placeholders, fit.unrunnable), repeat)
    tokens = _prepare_tokens(req, cache, cases, models, notes) if make_files else {}
    if make_files:
        _make_weights(req, cache, cases, models, fit.unrunnable, notes)
    inputs = _case_inputs(req, cases, models, tokens, fit, cache, make_files)
    # Every pair that will not run here, with the reason (the runners judge the real inputs).
    skips = pair_skips(cases, runners, inputs, fit.unrunnable)
    notes.extend(skip_unpaired_baselines(cases, runners, skips, repeat))
    out_dir = Path(req.out) if req.out else Path("lockstep-out")
    for runner in runners:
        for m in {i.model_name: i for c, i in inputs.items() if c not in fit.unrunnable}.values():
            runner.preflight(m)  # e.g. a missing InfiniTrain binary stops here, before any run
    return RunPlan(out_dir=out_dir, device=device, cases=cases, inputs=inputs, runners=runners, notes=notes,
                   unrunnable=fit.unrunnable, nodes=nodes, persistent_workers=req.persistent_workers, jobs=req.jobs,
                   certify=req.certify, certify_bf16=req.certify_bf16, record_step1=req.record_step1, skips=skips,
                   twins=twins,
                   roofline=device == "cuda" if req.roofline is None else req.roofline, cache_dir=cache)


def adopt_hard_coded(cases: list[CaseSpec], runners: list, inputs: dict, notes: list[str]) -> list[CaseSpec]:
    """Where a framework's build hard-codes a hyper-parameter (runners' `hard_coded`), the case takes
    it for every framework, as the seed's baselines trained the references with the build's value;
    the plan says so."""
    out = []
    for case in cases:
        for runner in runners:
            fixed = runner.hard_coded(case, inputs[case.name])
            if fixed is not None:
                contract = inputs[case.name].family.optimizer
                case = dataclasses.replace(case, **fixed.fields)
                values = ", ".join(f"{k} = {v}" for k, v in fixed.fields.items())
                notes.append(f"case {case.name}: every framework trains with {values} ({fixed.why}; the contract's "
                             f"is {contract.label})")
                break
        out.append(case)
    return out


def _with_twins(cases: list[CaseSpec], notes: list[str]) -> tuple[list[CaseSpec], dict[str, str]]:
    """The cases with each recompute case's twin (cases/twins.py); an added twin is said."""
    names = {c.name for c in cases}
    cases, twins = recompute_twins(cases)
    for case, twin in twins.items():
        if twin not in names:
            notes.append(f"added case {twin}: {case} without recompute, which {case} must equal bit for bit "
                         "on every framework")
    found = [f"{case} = {twin}" for case, twin in twins.items() if twin in names]
    if found:
        notes.append(f"recompute cases judged bit for bit against their twins on every framework: {', '.join(found)}")
    return cases, twins


@dataclass(frozen=True)
class MachineFit:
    """What this machine can run: the cases it cannot run at all (with why), and how ranks are placed."""

    device: str
    nodes: NodeLayout
    oversubscribe: bool
    unrunnable: dict[str, str]

    def inputs(self, req: RunRequest, m: PlannedModel, tokens: Path, **files) -> RunInputs:
        """A case's inputs on this machine; `files` names the prepared files' digests and corpus."""
        return RunInputs(checkpoint=m.checkpoint if m.checkpoint is not None else Path("-"), tokens=tokens,
                         model=m.config, device=self.device, model_name=m.name, timeout_s=req.timeout_s,
                         oversubscribe=self.oversubscribe, nodes=self.nodes, **files)


def _machine_fit(req: RunRequest, cases: list[CaseSpec], models: dict, device: str, nodes, notes: list[str]) -> MachineFit:
    if nodes.multi_node:
        notes.append(f"nodes: {nodes.label}" + ("" if nodes.writes_records else
                                                 "; node 0 writes the records, the comparison and the report"))
    oversubscribe = req.oversubscribe and device == "cpu"
    if req.oversubscribe and device != "cpu":
        notes.append("--oversubscribe applies to CPU runs only: ignored on cuda")
    unrunnable = {c.name: r for c in cases
                  if (r := machine_skip_reason(c, models[c.model].config, device, oversubscribe, nodes))}
    crowded = [c for c in cases if c.name not in unrunnable and nodes.procs_per_node(c.world_size) > available_devices(device)]
    if oversubscribe and crowded:
        notes.append(f"--oversubscribe: {', '.join(c.name for c in crowded)} run "
                     f"{max(nodes.procs_per_node(c.world_size) for c in crowded)} ranks on "
                     f"{available_devices(device)} CPU cores (gloo, 1 torch thread per rank): slower, same arithmetic")
    return MachineFit(device, nodes, oversubscribe, unrunnable)


def _runners(req: RunRequest, notes: list[str]) -> list[FrameworkRunner]:
    frameworks = req.frameworks or default_frameworks(notes, req.framework_options)
    if len(set(frameworks)) != len(frameworks):
        raise LockstepError(f"--frameworks lists a framework twice: {','.join(frameworks)}")
    return [get_runner(name, req.framework_options) for name in frameworks]


def _prepare_tokens(req: RunRequest, cache: Path, cases: list[CaseSpec], models: dict,
                    notes: list[str]) -> dict[str, tuple[Path, str, str]]:
    """tokenizer -> (path, corpus, sha256): the user's token file, or Tiny Shakespeare (or the named offline
    corpus) prepared once per tokenizer the cases' families use."""
    tokens: dict[str, tuple[Path, str, str]] = {}
    for case in cases:
        fam = family(models[case.model].family)
        if fam.tokenizer in tokens:
            continue
        if req.data:
            tokens[fam.tokenizer] = (Path(req.data), f"user token file {req.data}", sha256_file(req.data))
            continue
        prepared = prepare_tokens(cache, req.text, fam.tokenizer)
        tokens[fam.tokenizer] = (prepared.train_path, prepared.corpus_name, prepared.train_sha256)
        notes.append(f"data: {prepared.corpus_name} train split ({fam.tokenizer} tokens), "
                     f"{prepared.train_tokens:,} tokens ({prepared.train_path})")
        if not prepared.is_tiny_shakespeare:
            notes.append(f"corpus: {prepared.corpus_description}")
    return tokens


def _make_weights(req: RunRequest, cache: Path, cases: list[CaseSpec], models: dict, unrunnable: dict[str, str],
                  notes: list[str]) -> None:
    """A seeded llm.c init per shape that some case will run here (cached), unless the user gave the file."""
    for name, m in list(models.items()):
        if m.checkpoint is None and any(c.model == name and c.name not in unrunnable for c in cases):
            path = ensure_initial_checkpoint(cache, name, family(m.family), m.config, req.seed)
            models[name] = PlannedModel(name, m.family, m.config, path, req.seed)
            notes.append(f"weights: llm.c init of {name} (seed {req.seed}), {path}")


def _case_inputs(req: RunRequest, cases: list[CaseSpec], models: dict, tokens: dict, fit: MachineFit, cache: Path,
                 make_files: bool) -> dict[str, RunInputs]:
    """Every case checked against its model and token file before anything runs, and its inputs.
    --dry-run: no token file, no weights made (a --llmc file is named)."""
    inputs: dict[str, RunInputs] = {}
    lengths: dict[tuple[Path, int], int] = {}
    for case in cases:
        m = models[case.model]
        if not make_files:
            case.check(max_seq_len=m.config.max_seq_len)
            inputs[case.name] = fit.inputs(req, m, Path(req.data or "-"))
            continue
        path, corpus, sha = tokens[family(m.family).tokenizer]
        if (path, m.config.vocab_size) not in lengths:
            lengths[(path, m.config.vocab_size)] = len(read_token_stream(path, vocab_size=m.config.vocab_size))
        case.check(max_seq_len=m.config.max_seq_len, available_tokens=lengths[(path, m.config.vocab_size)])
        digest = checkpoint_digest(m.checkpoint, cache) if m.checkpoint is not None else ""
        inputs[case.name] = fit.inputs(req, m, path, checkpoint_sha256=digest, tokens_sha256=sha, corpus=corpus,
                                       lora_seed=req.seed)
    return inputs


def pair_skips(cases: list[CaseSpec], runners: list[FrameworkRunner], inputs: dict[str, RunInputs],
               unrunnable: dict[str, str]) -> dict[tuple[str, str], str]:
    """(case, framework) -> why the pair cannot run on this machine: the machine's reason for the
    case (devices, memory), else the runner's own."""
    skips = {}
    order = {c.name: i for i, c in enumerate(cases)}
    for case in cases:
        for runner in runners:
            reason = (unrunnable.get(case.name) or case_skip_reason(runner, case, inputs[case.name])
                      or resume_source_problem(case, runner.name, order, skips))
            if reason:
                skips[(case.name, runner.name)] = reason
    return skips


def resume_source_problem(case: CaseSpec, framework: str, order: dict[str, int],
                          skips: dict[tuple[str, str], str]) -> str | None:
    """Why a case that resumes another case's checkpoint cannot run here: that case is not in
    this run, comes after it, or is skipped by the framework (checkpoints.md). A case resuming
    its own name resumes what an earlier run wrote into the same --out."""
    spec = case.checkpoint
    if spec is None or spec.resume_from is None or spec.resume_case in (None, case.name):
        return None
    source = spec.resume_case
    if source not in order:
        return f"resumes from {source}'s step-{spec.resume_from} checkpoint, which this run does not train (select {source} too)"
    if order[source] > order[case.name]:
        return f"resumes from {source}'s checkpoint, but {source} comes after it in the matrix"
    if (source, framework) in skips:
        return f"resumes from {source}'s checkpoint, which {framework} does not train here"
    return None


def skip_unpaired_baselines(cases: list[CaseSpec], runners: list[FrameworkRunner],
                            skips: dict[tuple[str, str], str], repeat: int = 1) -> list[str]:
    """Skip the baseline's run of a case that no test framework runs here (e.g. BF16 cases on CPU,
    where megatron-core cannot run them): nothing would be compared with it. Adds those skips to
    `skips` and returns the notes that say so. A run of the baseline alone, or one repeated (its
    repeats are compared with each other), is not touched."""
    if len(runners) < 2 or repeat > 1:
        return []
    baseline, tests = runners[0].name, runners[1:]
    # A resume and the case it resumes are compared with each other (compare/resume.py) even
    # where no other framework runs them.
    resumed = {c.name for c in cases if c.checkpoint is not None and c.checkpoint.resume_case}
    resumed |= {c.checkpoint.resume_case for c in cases if c.name in resumed}
    unpaired = [c for c in cases if (c.name, baseline) not in skips and c.name not in resumed
                and all((c.name, r.name) in skips for r in tests)]
    for c in unpaired:
        why = "; ".join(f"{r.name}: {skips[(c.name, r.name)]}" for r in tests)
        skips[(c.name, baseline)] = f"no test framework runs this case here ({why}): nothing to compare it with"
    if not unpaired:
        return []
    return [f"{baseline} skips {', '.join(c.name for c in unpaired)}: no test framework runs "
            + ("it" if len(unpaired) == 1 else "them") + " here, so nothing would be compared with "
            + ("its" if len(unpaired) == 1 else "their") + " baseline run"]


def prepare_tokens(cache: Path, text: str | None, tokenizer: str):
    from lockstep.data.prepare import ensure_prepared

    return ensure_prepared(cache_dir=cache, text_path=text, tokenizer=tokenizer)





