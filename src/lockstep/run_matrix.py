"""`lockstep run`'s data flow: cases -> runners -> records -> comparison -> report.

`plan_run` resolves everything a run needs (device, data, weights, cases, runners) and
rejects what cannot run before any framework starts; `execute_plan` then runs every
(case, framework) pair, listing the ones this machine cannot run as skipped with the reason,
each FP32 pair recording its step 1 from inside; `certify_outcomes` turns those captures into
each pair's step-1 certificate, and `gather_evidence` runs what the verdict policy asks for to
tell Adam's amplification of rounding from a defect (an FP64 reference run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lockstep.cases.matrix import load_matrix, select_cases
from lockstep.cases.spec import CaseSpec
from lockstep.compare.pairing import EVIDENCE_DIR, STEP1_DIR
from lockstep.data.corpus import default_cache_dir
from lockstep.errors import CaseError, FormatError, LockstepError
from lockstep.formats import llmc
from lockstep.formats.run_record import RunRecord, StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.fsutil import atomic_write, sha256_file, write_once
from lockstep.models import CPU_SHAPES, family, model_shape, read_checkpoint_layout
from lockstep.runners import get_runner, reference_framework
from lockstep.runners.base import FrameworkRunner, RunInputs, available_devices, device_shortage
from lockstep.runners.nodes import NodeLayout
from lockstep.step_contract import Stopwatch


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
    # A runner spec's name -> its options (runners.framework_options_from: e.g. the infinitrain
    # build, megatron's native bf16, the command runner's TOML trainers); absent: its defaults.
    framework_options: dict = field(default_factory=dict)
    cache_dir: str | None = None
    oversubscribe: bool = False  # CPU: run cases with more ranks than cores (gloo, 1 torch thread per rank)
    nodes: NodeLayout = field(default_factory=NodeLayout)  # --nnodes/--node-rank/--rdzv-endpoint/--launcher
    # Start each framework's workers once per world size and run every case that fits in them
    # (--no-persistent-workers: one process per case).
    persistent_workers: bool = True
    certify: bool = True  # a step-1 certificate for every FP32 pair (--no-certify)
    certify_bf16: bool = False  # and for BF16 pairs (--certify-bf16)


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
    certify: bool = True
    certify_bf16: bool = False
    # Worker groups started before the plan was made (`start_first_group_early`), by (runner, key):
    # execute_plan takes the one it needs first and stops the others.
    early_groups: dict = field(default_factory=dict)

    def certifies(self, case: CaseSpec) -> bool:
        """Whether the case's pairs get a step-1 certificate: several frameworks, FP32 (BF16 when asked),
        one node (every node would have to record the same step; a multi-node run is not certified)."""
        return self.certify and len(self.runners) > 1 and not self.nodes.multi_node and (
            not case.is_bf16 or self.certify_bf16)

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


@dataclass
class CaseOutcome:
    case: CaseSpec
    framework: str
    record: RunRecord | None = None
    skipped: str | None = None  # reason


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def start_cuda_beside() -> None:
    """Make this process's CUDA context in a background thread (the driver works without the GIL):
    the first in-process case then finds it made, while the plan hashes and checks files."""
    import threading

    import torch

    def start() -> None:
        try:
            torch.zeros(1, device="cuda")
        except Exception:  # the first case meets the same failure and says it, as a failed run
            pass

    threading.Thread(target=start, name="lockstep-cuda-start", daemon=True).start()


def default_frameworks(notes: list[str], framework_options: dict | None = None) -> list[str]:
    from lockstep.runners import default_frameworks as registered_defaults

    return registered_defaults(framework_options, notes)


def resolve_case_models(cases: list[CaseSpec], req: RunRequest, device: str,
                        notes: list[str]) -> tuple[list[CaseSpec], dict[str, PlannedModel]]:
    """The model every case trains, with one meaning of "model": a case names a registered shape;
    `--model` replaces it with another shape of the same family; `--llmc FILE` replaces it with
    the file's header. The case's family, the shape and the file must agree (SPEC section 5).

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


def plan_run(req: RunRequest) -> RunPlan:
    notes: list[str] = []
    device = req.device or default_device()
    if device not in ("cpu", "cuda"):
        raise LockstepError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise LockstepError("--device cuda was asked for but torch sees no CUDA device")
        start_cuda_beside()
    cache = Path(req.cache_dir) if req.cache_dir else default_cache_dir()

    all_cases = load_matrix(req.matrix)
    cases = select_cases(all_cases, req.cases, source=f"matrix {req.matrix}")
    if req.steps is not None:
        cases = [c.with_overrides(steps=req.steps) for c in cases]
    cases, models = resolve_case_models(cases, req, device, notes)

    # What this machine cannot run at all is known before any file is made (an 8B init is 32 GB).
    nodes = req.nodes.check()
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

    # Tokens: the user's token file, or Tiny Shakespeare (or the named offline corpus) prepared
    # once per tokenizer the cases' families use.
    tokens: dict[str, tuple[Path, str, str]] = {}  # tokenizer -> (path, corpus, sha256)
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

    # Weights: a seeded llm.c init per shape that some case will run (cached), or the user's file.
    for name, m in list(models.items()):
        if m.checkpoint is None and any(c.model == name and c.name not in unrunnable for c in cases):
            path = ensure_initial_checkpoint(cache, name, family(m.family), m.config, req.seed)
            models[name] = PlannedModel(name, m.family, m.config, path, req.seed)
            notes.append(f"weights: llm.c init of {name} (seed {req.seed}), {path}")

    # Every case is checked against its model and token file before anything runs.
    inputs: dict[str, RunInputs] = {}
    lengths: dict[tuple[Path, int], int] = {}
    for case in cases:
        m = models[case.model]
        path, corpus, sha = tokens[family(m.family).tokenizer]
        if (path, m.config.vocab_size) not in lengths:
            lengths[(path, m.config.vocab_size)] = len(read_token_stream(path, vocab_size=m.config.vocab_size))
        case.check(max_seq_len=m.config.max_seq_len, available_tokens=lengths[(path, m.config.vocab_size)])
        inputs[case.name] = RunInputs(
            checkpoint=m.checkpoint if m.checkpoint is not None else Path("-"), tokens=path, model=m.config,
            device=device, model_name=m.name,
            checkpoint_sha256=checkpoint_digest(m.checkpoint, cache) if m.checkpoint is not None else "",
            tokens_sha256=sha, corpus=corpus, timeout_s=req.timeout_s, oversubscribe=oversubscribe, nodes=nodes)

    frameworks = req.frameworks or default_frameworks(notes, req.framework_options)
    if len(set(frameworks)) != len(frameworks):
        raise LockstepError(f"--frameworks lists a framework twice: {','.join(frameworks)}")
    runners = [get_runner(name, req.framework_options) for name in frameworks]

    out_dir = Path(req.out) if req.out else Path("lockstep-out")
    for runner in runners:
        for m in {i.model_name: i for c, i in inputs.items() if c not in unrunnable}.values():
            runner.preflight(m)  # e.g. a missing InfiniTrain binary stops here, before any run
    return RunPlan(out_dir=out_dir, device=device, cases=cases, inputs=inputs, runners=runners, notes=notes,
                   unrunnable=unrunnable, nodes=nodes, persistent_workers=req.persistent_workers,
                   certify=req.certify, certify_bf16=req.certify_bf16)


def prepare_tokens(cache: Path, text: str | None, tokenizer: str):
    from lockstep.data.prepare import ensure_prepared

    return ensure_prepared(cache_dir=cache, text_path=text, tokenizer=tokenizer)


_digests: dict[Path, str] = {}


def checkpoint_digest(path: Path, cache: Path | None = None) -> str:
    """sha256 of a checkpoint, once per process (a 1B-parameter file takes seconds). One in
    lockstep's own `cache` (its seeded inits) keeps its digest beside it (`<file>.sha256.json`,
    with the size and modification time it was taken at) and is hashed again only when those change."""
    if path not in _digests:
        _digests[path] = _cached_digest(path) if cache is not None and _inside(path, cache) else sha256_file(path)
    return _digests[path]


def _inside(path: Path, directory: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(directory).resolve())
    except ValueError:
        return False
    return True


def _cached_digest(path: Path) -> str:
    side = Path(f"{path}.sha256.json")
    st = os.stat(path)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        kept = json.loads(side.read_text())
        if {k: kept.get(k) for k in stamp} == stamp and isinstance(kept.get("sha256"), str):
            return kept["sha256"]
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    try:
        with atomic_write(side, "w", what="checkpoint digest") as f:
            json.dump({**stamp, "sha256": digest}, f)
    except LockstepError:
        pass  # a cache that cannot take it: hashed again next time
    return digest


def ensure_initial_checkpoint(cache: Path, model_name: str, fam, config, seed: int,
                              on_wait: Callable[[Path], None] | None = None) -> Path:
    """The cached llm.c init of a shape and seed, written once. Several lockstep processes may
    need it at once (CI jobs sharing a cache): one writes it (aside, then renamed) while the
    others wait on its lock file, then reuse it unwritten; none ever sees a torn file."""
    from lockstep.models.init import INIT_SCHEME, write_initial_checkpoint

    path = cache / "checkpoints" / f"{model_name}_llmc_init_seed{seed}_{INIT_SCHEME}.bin"

    def is_complete(p: Path) -> bool:
        if not p.is_file():
            return False
        try:
            return fam.read_layout(p).config == config
        except LockstepError:
            return False  # a damaged cache entry (e.g. left by an older lockstep) is rewritten

    what = f"llm.c init of {model_name} (seed {seed})"
    write_once(path, is_complete, lambda p: write_initial_checkpoint(p, fam, config, seed, what=what),
               on_wait=lambda: (on_wait or say_waiting)(path))
    return path


def say_waiting(path: Path) -> None:
    """Said at once (not among the plan's notes): a wait of minutes must not look like a hang."""
    print(f"waiting for another lockstep writing {path}", file=sys.stderr, flush=True)


def execute_plan(plan: RunPlan, on_start: Callable[[CaseSpec, str], None] | None = None,
                 on_step: Callable[[StepRecord], None] | None = None,
                 on_end: Callable[[CaseOutcome], None] | None = None, repeat: int = 1,
                 on_groups: Callable[[], None] | None = None) -> list[CaseOutcome]:
    """Run every pair `repeat` times; repeat 1's record is the outcome's (and where compare reads
    it), repeats 2..N go under `<out>/repeats/<k>/` for the determinism check.

    Pairs that run on their own (in this process or a process each: the one-device pytorch cases,
    InfiniTrain) run first, in plan order (case by case, each framework in turn), while the first
    persistent worker group (`worker_group_key`) starts up beside them; then, for each group in
    plan order, every pair of that runner and key, in one group (start once, run many).
    `plan.persistent_workers` False runs every pair on its own. Outcomes come back in plan order.
    Every node of a multi-node run computes the same order from the same plan. `on_groups` is
    called once, when this process starts to only wait on worker groups (idle until the end)."""
    from lockstep.determinism import repeat_dir

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    out_dirs = [repeat_dir(plan.out_dir, k) for k in range(1, repeat + 1)]
    pairs = [(case, runner) for case in plan.cases for runner in plan.runners]
    outcomes: dict[tuple[str, str], CaseOutcome] = {}

    def skip_reason(case: CaseSpec, runner: FrameworkRunner) -> str | None:
        return plan.unrunnable.get(case.name) or runner.skip_reason(case, plan.inputs[case.name])

    def key_of(case: CaseSpec, runner: FrameworkRunner):
        return runner.worker_group_key(case, plan.inputs[case.name]) if plan.persistent_workers else None

    def finished(runner: FrameworkRunner):
        def on_done(case: CaseSpec, records: list[RunRecord]) -> None:
            outcome = CaseOutcome(case, runner.name, record=records[0])
            outcomes[(case.name, runner.name)] = outcome
            if on_end:
                on_end(outcome)
        return on_done

    groups: dict[tuple[str, object], object] = {}  # (runner, key) -> its open WorkerGroup

    def group_of(case: CaseSpec, runner: FrameworkRunner, key):
        if (runner.name, key) not in groups:
            groups[(runner.name, key)] = runner.open_workers(case, plan.inputs[case.name])
        return groups[(runner.name, key)]

    def prestart_first_group() -> None:
        """The first worker group starts up while the pairs that need none run in this process (one
        node only: every node must start its groups in the same order); one started before the
        plan for the same runner and key is that group."""
        early = dict(plan.early_groups)
        plan.early_groups.clear()
        if not plan.nodes.multi_node:
            for c, r in pairs:
                key = None if skip_reason(c, r) else key_of(c, r)
                if key is not None:
                    if (r.name, key) in early:
                        groups[(r.name, key)] = early.pop((r.name, key))
                    group_of(c, r, key).prestart(c.to_dict(), plan.out_dir / r.name)
                    break
        for unneeded in early.values():
            unneeded.discard()  # it ran no case: nothing to wait for

    def run_pair(case: CaseSpec, runner: FrameworkRunner, key) -> None:
        batch = [case] if key is None else [
            c for c, r in pairs if r is runner and (c.name, r.name) not in outcomes
            and not skip_reason(c, r) and key_of(c, r) == key]
        runner.run_many([(c, inputs_for(plan, c, runner)) for c in batch], out_dirs, on_start=on_start,
                        on_step=on_step, on_done=finished(runner), persistent=key is not None,
                        group=group_of(case, runner, key) if key is not None else None)
        if key is not None:
            groups.pop((runner.name, key)).close()  # every case of its key ran: free its devices

    try:
        for case, runner in pairs:
            reason = skip_reason(case, runner)
            if reason:
                outcome = outcomes[(case.name, runner.name)] = CaseOutcome(case, runner.name, skipped=reason)
                if on_end:
                    on_end(outcome)
        # Pairs that run on their own (in this process, or a process each) first, while the first
        # worker group starts beside them; then each group's pairs, a group at a time.
        prestart_first_group()
        for grouped in (False, True):
            if grouped and on_groups is not None:
                on_groups()  # this process only waits on worker groups from here on
            for case, runner in pairs:
                if (case.name, runner.name) in outcomes:
                    continue  # skipped, or ran earlier in a worker group with an earlier case
                key = key_of(case, runner)
                if (key is not None) == grouped:
                    run_pair(case, runner, key)
    except BaseException:
        for g in groups.values():
            g.__exit__(*sys.exc_info())  # interrupted or failing: no rank may outlive lockstep
        raise
    for g in groups.values():
        g.close()  # prestarted for a pair that did not need it after all
    return [outcomes[(case.name, runner.name)] for case, runner in pairs]


def start_first_group_early(req: RunRequest) -> dict:
    """Start the worker group the run will most likely need first, before the plan is made: a
    group's start-up (megatron-core: interpreter, torch, CUDA, NCCL, its imports; ~12 s on an
    H200) then overlaps the plan (importing torch, CUDA's start, hashing the weights) as well as
    the pairs that run on their own. Only the common case is guessed, from what is cheap to know
    without torch: one node, the first (case, runner) pair in plan order whose runner has worker
    groups, when that case needs one device. The device is `--device`, else CUDA when an NVIDIA
    driver is present. `execute_plan` uses the group when the plan agrees (same runner and key)
    and stops it otherwise. Returns {(runner name, key): group}; {} when nothing is guessed."""
    if not req.persistent_workers or req.nodes.multi_node or req.nodes.launcher == "slurm" or req.llmc:
        return {}
    device = req.device or ("cuda" if _nvidia_driver_present() else "cpu")
    try:
        cases = select_cases(load_matrix(req.matrix), req.cases, source=f"matrix {req.matrix}")
        frameworks = req.frameworks or default_frameworks([], req.framework_options)
        runners = [get_runner(name, req.framework_options) for name in frameworks]
    except LockstepError:
        return {}  # the plan says what is wrong
    for case in cases:
        if case.world_size != 1 or (req.model is None and device == "cpu"):
            continue  # several devices: how many there are needs torch; CPU shapes are swapped in by the plan
        shape = model_shape(req.model or case.model)
        inputs = RunInputs(checkpoint=Path("-"), tokens=Path("-"), model=shape.config, device=device,
                           oversubscribe=req.oversubscribe, nodes=req.nodes)
        for runner in runners:
            # No skip_reason here: it may import torch (counting devices), seconds before the spawn.
            # A group the plan does not want is stopped by execute_plan.
            key = runner.worker_group_key(case, inputs)
            if key is not None:
                group = runner.open_workers(case, inputs)
                group.prestart(case.to_dict(), Path(req.out or "lockstep-out") / runner.name)
                return {(runner.name, key): group}
    return {}


def close_early_groups(groups: dict) -> None:
    """Stop groups started early that no run took: they ran no case, so they are killed at once."""
    for group in groups.values():
        group.discard()
    groups.clear()


def _nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def inputs_for(plan: RunPlan, case: CaseSpec, runner: FrameworkRunner) -> RunInputs:
    """The case's inputs, asking the runner to record step 1 where the case is certified."""
    from lockstep.capture.request import CAPTURE_ROWS, CaptureRequest

    inputs = plan.inputs[case.name]
    if not plan.certifies(case):
        return inputs
    optimizer = inputs.family.optimizer
    baseline = plan.runners[0].name
    request = CaptureRequest(path=str(plan.capture_path(runner.name, case)),
                             adam_eps=optimizer.eps if optimizer.kind == "adam" else None, rows=CAPTURE_ROWS,
                             reference=str(plan.capture_path(baseline, case)) if runner.name != baseline else None)
    return dataclasses.replace(inputs, capture=request)


def certify_outcomes(plan: RunPlan, outcomes: list[CaseOutcome], say=lambda text: None) -> list:
    """Each certified pair's captures compared (certify/), the certificate written beside the test's
    record for the comparison to read; a pair without both captures gets one saying why."""
    from lockstep.certify.certificate import Certificate, certificate_path, certify, write_certificate
    from lockstep.formats.step_capture import StepCapture

    baseline = plan.runners[0].name
    by_pair = {(o.case.name, o.framework): o for o in outcomes}
    made = []
    fp64s: dict = {}  # case -> the reference's step 1 in FP64, made once for every test framework
    for case in plan.cases:
        base = by_pair.get((case.name, baseline))
        if not plan.certifies(case) or base is None or base.record is None or not base.record.ok:
            continue
        ref, ref_problem = _capture_of(base)
        for runner in plan.runners[1:]:
            test = by_pair.get((case.name, runner.name))
            if test is None or test.record is None or not test.record.ok:
                continue
            cert = Certificate(case=case.name, baseline=baseline, test=runner.name, dtype=case.dtype)
            other, other_problem = _capture_of(test)
            if ref is None or other is None:
                cert.problem = "; ".join(p for p in (ref_problem, other_problem) if p)
            else:
                optimizer = plan.inputs[case.name].family.optimizer
                eps = optimizer.eps if optimizer.kind == "adam" else 1e-8
                try:
                    cert = certify(StepCapture.load(ref), StepCapture.load(other), case, adam_eps=eps)
                    if cert.close_call and baseline == reference_framework():
                        say(f"step-1 certificate {runner.name} vs {baseline} on {case.name}: a close call; measuring "
                            "what FP32 moves the reference itself (its step 1 in FP64)")
                        if case.name not in fp64s:
                            fp64s[case.name] = fp64_capture(plan, case)
                        cert = certify(StepCapture.load(ref), StepCapture.load(other), case, adam_eps=eps,
                                       fp64=fp64s[case.name])
                except (LockstepError, ValueError) as e:
                    cert.problem = f"the captures cannot be compared: {e}"
            write_certificate(certificate_path(plan.out_dir / runner.name, case.name), cert)
            say(f"step-1 certificate {runner.name} vs {baseline} on {case.name}: {cert.summary_line()}")
            made.append(cert)
    return made


def fp64_capture(plan: RunPlan, case: CaseSpec):
    """The reference's step 1 of the case in FP64, sketched like the certificate's captures."""
    reference = reference_framework()
    return get_runner(reference).fp64_step1(case, plan.inputs[case.name], plan.capture_path(f"{reference}-fp64", case))


def _capture_of(outcome: CaseOutcome) -> tuple[str | None, str | None]:
    """(the capture's path from the record, None), or (None, a sentence saying why there is none)."""
    meta = outcome.record.meta
    path = meta.get("step1_capture")
    if path and Path(path).is_file():
        return path, None
    return None, f"{outcome.framework} recorded no step 1 ({meta.get('step1_capture_error') or 'no capture written'})"


def gather_evidence(plan: RunPlan, summary: dict, say=lambda text: None) -> bool:
    """Run what the policy asked for in `summary` (an FP64 reference run per case whose clean step 1
    may be Adam amplifying rounding); True when something new was written (compare again)."""
    reference = reference_framework()
    wanted = sorted({c["case"] for comp in summary.get("comparisons", []) for c in comp.get("cases", [])
                     if c.get("evidence_wanted") == "fp64-reference"})
    wrote = False
    for name in wanted:
        case = next((c for c in plan.cases if c.name == name), None)
        path = plan.out_dir / EVIDENCE_DIR / f"{name}.fp64.jsonl"
        if case is None or path.exists():
            continue
        say(f"evidence: {name} in FP64 on the {reference} reference (is the FP32 difference Adam amplifying rounding?)")
        record = get_runner(reference).train_fp64(case, plan.inputs[name], path)
        if not record.ok:
            say(f"evidence for {name} could not be made: {record.error}")
        wrote = True
    return wrote


class RunTiming:
    """Where `lockstep run`'s wall time goes: its stages (planning, the runs, the certificates, the
    comparison, ...) and, per framework and case, the phases each runner measured (start-up,
    weights, data, training, teardown). Written to run.json's "timing"."""

    def __init__(self):
        self.began = time.perf_counter()
        self.stage = Stopwatch()  # `with timing.stage("plan"): ...`

    @property
    def stages(self) -> dict[str, float]:
        return self.stage.seconds

    def to_json(self, outcomes: list[CaseOutcome]) -> dict:
        pairs = []
        for o in outcomes:
            if o.record is None:
                continue
            meta = o.record.meta
            pair = {"framework": o.framework, "case": o.case.name, "wall_s": meta.get("wall_s"),
                    "phases": meta.get("phases", {}), "step1_capture_s": meta.get("step1_capture_seconds")}
            if meta.get("worker_startup"):  # the first case of a worker group: where the group's start-up went
                pair["worker_startup"] = meta["worker_startup"]
            pairs.append(pair)
        return {"total_s": round(time.perf_counter() - self.began, 3), "stages": self.stages, "pairs": pairs}
