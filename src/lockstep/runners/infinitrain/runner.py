"""`infinitrain` runner: an external InfiniTrain build's `gpt2` / `llama3` / `qwen3` / `tiny_mixtral` executable
as a subprocess.

The user points lockstep at a build directory (`--infinitrain-build DIR`, or the environment
variable `LOCKSTEP_INFINITRAIN_BUILD`). The executable gets the case as gflags, the same way
InfiniTrain's own test script (`scripts/run_models_and_profile.bash`) passes them; its stdout
and stderr go verbatim into `<case>.log` under a `[COMMAND] ...` line, and the glog step lines
in that log are the run's results (docs/reference/logs.md#infinitrain, docs/reference/infinitrain.md).

Facts about InfiniTrain this module relies on (example/gpt2/main.cc at commit b24d92f):
- `--nthread_per_process` is the WHOLE world size: data parallel size = nthread / (TP * PP).
  Any run with more than one thread puts every thread on a CUDA device, whatever `--device`
  says, so parallel cases cannot run on CPU.
- With PP > 1 each DP rank reads one batch of B*accum sequences per step instead of accum
  batches of B interleaved with the other ranks; every step still covers the same tokens
  as the contract's data order (docs/reference/training-contract.md#data), so the step loss is the same mean.
- ZeRO is `--zero_stage N` (0 disables its DistributedOptimizer), applied to its DDP.
- Several nodes: its launcher `infini_run --nnodes --nproc_per_node --node_rank
  --rdzv_endpoint -- EXE FLAGS` forks the processes and sets PROC_WORLD_SIZE = nnodes x
  nproc_per_node; the world is PROC_WORLD_SIZE x nthread_per_process. lockstep starts one
  process per node with world / nnodes threads.
- Its data loader never wraps: it reads floor(N/T) sequences of which the last one only
  serves as the targets' tail, and a batch past the end crashes. So it needs
  steps * total_batch + T tokens, T - 1 more than lockstep's own `tokens_needed`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from lockstep.cases.spec import NEEDS_CHECKPOINT, NEEDS_LORA, CaseSpec
from lockstep.errors import CaseError, LockstepError, RunError
from lockstep.formats.infinitrain_checkpoint import read_infinitrain_checkpoint
from lockstep.formats.logs import parse_infinitrain_log
from lockstep.formats.run_record import StepRecord
from lockstep.formats.tokens import read_token_stream
from lockstep.runners.base import (ExecuteResult, FrameworkRunner, HardCoded, StepInspector, RunInputs, StepCallback,
                                   final_params_path, first_step, write_final_params)
from lockstep.runners.infinitrain.options import BUILD_ENV_VAR, COMMIT_FILE, LOGGED_LR_DIGITS, LR_SCHEDULE_FLAGS, RECOMPUTE_FLAGS
from lockstep.runners.infinitrain.capture import KEEP_SAVE, PRECISION_CHECK_DIR
from lockstep.runners.infinitrain.checkpoints import checkpoint_load_seconds, checkpoint_save_seconds, checkpoints_for
from lockstep.runners.infinitrain.families import adapter_for
from lockstep.runners.infinitrain.lora import check_lora_loaded, lora_flags, write_lora_init
from lockstep.runners.infinitrain.precision_check import precision_check_flag
from lockstep.runners.infinitrain.probe import ExecutableFacts, executable_flags, llmc_version_read
from lockstep.runners.launch import shared_cores_env, worker_env
from lockstep.runners.logged_process import check_finished, run_logged
from lockstep.runners.nodes import srun_per_node
from lockstep.step_contract import LOGGED_FP32_SEQUENTIAL

LAUNCHER_EXECUTABLE = "infini_run"
DEFAULT_TIMEOUT_S = 1800.0
# InfiniTrain reads its multi-process layout from these; a stray value inherited from the
# user's shell would silently change the world size, so the runner never passes them on.
INFINITRAIN_PROCESS_ENV = ("NNODES", "NPROC_PER_NODE", "PROC_WORLD_SIZE", "GLOBAL_PROC_RANK", "LOCAL_PROC_RANK")


class InfiniTrainRunner(StepInspector, FrameworkRunner):
    name = "infinitrain"
    # Its cross entropy adds the per-token losses one by one in FP32, and it prints 6 decimals.
    logged_loss = LOGGED_FP32_SEQUENTIAL
    # LoRA through its --lora_* flags with lockstep's init loaded (lora.py); save/resume through its
    # own --save/--load checkpoints (checkpoints.py).
    supports = frozenset({NEEDS_LORA, NEEDS_CHECKPOINT})
    runs_apart = True  # the build's executable, a process of its own

    def __init__(self, build_dir: str | os.PathLike | None = None, name: str | None = None):
        self.name = name or type(self).name  # `infinitrain@NAME` for a named build (options.py)
        given = build_dir if build_dir else (None if name and "@" in name else os.environ.get(BUILD_ENV_VAR))
        self.build_dir: Path | None = Path(given).expanduser() if given else None
        self._facts: dict[Path, ExecutableFacts] = {}  # what each probed executable said (probe.py)

    def facts(self, family: str) -> ExecutableFacts | None:
        """The family's executable as it answered the probes (asked once per runner), or None for an
        adapter that needs none: its executable is taken to have b24d92f's flags."""
        adapter = adapter_for(family)
        if adapter.probe_magic is None:
            return None
        exe = self.executable(family)
        if exe not in self._facts:
            facts = ExecutableFacts(exe, executable_flags(exe), llmc_version_read(exe, adapter.probe_magic))
            self._facts[exe] = adapter.probe(facts)
        return self._facts[exe]

    # ------------------------------------------------------------------ checks before running

    def executable(self, family: str = "gpt2") -> Path:
        if self.build_dir is None:
            raise LockstepError(f"no InfiniTrain build given: pass --infinitrain-build DIR or set {BUILD_ENV_VAR}")
        return self.build_dir / adapter_for(family).executable

    def preflight(self, inputs: RunInputs) -> None:
        if self.unsupported_family(inputs):
            return  # the family's cases are skipped with the reason (skip_reason)
        adapter = adapter_for(inputs.model.family)
        exe = self.executable(inputs.model.family)
        build = exe.parent
        if not build.is_dir():
            raise LockstepError(f"InfiniTrain build directory {build} does not exist")
        if not exe.is_file():
            if adapter.optional:
                return  # the family's cases are skipped with the reason (skip_reason)
            raise LockstepError(f"InfiniTrain executable {exe} does not exist (build the {exe.name} target in {build})")
        if not os.access(exe, os.X_OK):
            raise LockstepError(f"InfiniTrain executable {exe} is not executable (chmod +x it or rebuild)")
        launcher = build / LAUNCHER_EXECUTABLE
        if inputs.nodes.multi_node and not (launcher.is_file() and os.access(launcher, os.X_OK)):
            raise LockstepError(f"runs over several nodes start InfiniTrain with its launcher {launcher}, which does "
                                f"not exist or is not executable (build the {LAUNCHER_EXECUTABLE} target in {build})")
        adapter.preflight(inputs.model, inputs.checkpoint, inputs.family.optimizer)

    def version(self) -> str:
        if self.build_dir is None:
            return "no build given"
        commit = find_build_commit(self.build_dir)
        return f"InfiniTrain {commit}" if commit else f"unknown build at {self.build_dir}"

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        unsupported = self.unsupported_family(inputs)
        if unsupported:
            return unsupported
        adapter = adapter_for(inputs.model.family)
        if adapter.one_device_only and (case.world_size > 1 or case.ep > 1 or case.zero):
            return (f"InfiniTrain's {adapter.executable} trains on one device only, not {case.parallel_label}: "
                    f"{adapter.one_device_only}")
        if inputs.device == "cpu" and case.is_bf16:
            return "InfiniTrain --dtype bfloat16 crashes on CPU (segfault; docs/reference/infinitrain.md)"
        if inputs.device == "cpu" and case.world_size > 1:
            return (f"InfiniTrain runs every thread of a parallel run ({case.parallel_label}) on a CUDA device, "
                    "so parallel cases need --device cuda")
        if adapter.optional and self.build_dir is not None and not (self.build_dir / adapter.executable).is_file():
            return (f"this InfiniTrain build has no {adapter.executable} executable ({adapter.missing_note})"
                    if adapter.missing_note else f"this InfiniTrain build has no {adapter.executable} executable")
        if case.lora is not None and case.tp > 1:
            return ("InfiniTrain reads one --lora_load_path file into every TP rank, so lockstep's LoRA init "
                    "reaches it at TP=1 only (docs/reference/lora.md)")
        reason = adapter.skip_reason(case, inputs.model, inputs.checkpoint)
        facts = self.facts(inputs.model.family) if self.build_dir is not None else None
        if not reason and facts is not None:
            reason = (adapter.build_skip_reason(case, inputs.model, case.optimizer_of(inputs.family.optimizer), facts)
                      or _flag_skip_reason(case, facts))
        return reason or super().skip_reason(case, inputs)

    def hard_coded(self, case: CaseSpec, inputs: RunInputs) -> HardCoded | None:
        """A build whose executable hard-codes Adam's beta2 (feat/add_Qwen3-8B's qwen3: 0.95): the
        case's references train with it too (the seed's baselines did), so every step compares."""
        if self.build_dir is None or self.unsupported_family(inputs):
            return None
        adapter = adapter_for(inputs.model.family)
        if not (self.build_dir / adapter.executable).is_file():
            return None
        facts = self.facts(inputs.model.family)
        built = adapter.hard_coded_optimizer(facts) if facts is not None else None
        contract = case.optimizer_of(inputs.family.optimizer)
        if built is None or built == contract or dataclasses.replace(built, beta2=contract.beta2) != contract:
            return None  # nothing hard-coded, or more than beta2 differs (then the build skips the case)
        return HardCoded({"adam_beta2": built.beta2}, f"this InfiniTrain build's {facts.path.name} hard-codes "
                                                      f"{built.label}")

    # ------------------------------------------------------------------ step 1 from inside

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """The reference's state goes in as InfiniTrain's own step folder for its --load (at_step.py);
        then step N+1 is captured as step 1 is."""
        from lockstep.runners.infinitrain.at_step import at_step_problem

        # A resumed case (`lockstep run` certifies its first step from the reference's state) is
        # captured as its plain case: the capture's launch is its own resume of the written state.
        return at_step_problem(case, inputs) or self.capture_problem(dataclasses.replace(case, checkpoint=None), inputs)

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        reason = self.skip_reason(case, inputs)
        if reason:
            return reason
        if case.world_size > 1:
            return ("InfiniTrain's step 1 is captured from one process's saved weights; its --save of a parallel "
                    "run is untested here")
        if first_step(case) > 1:
            return f"a case resumed after step {case.checkpoint.resume_from} does not train step 1"
        facts = self.facts(inputs.model.family) if self.build_dir is not None else None
        if facts is not None and not facts.has_flag("save"):
            return (f"this InfiniTrain build's {facts.path.name} has no --save, and its step 1 is captured from the "
                    "weights it saves")
        return None

    def capture_needs_reference(self, case: CaseSpec, inputs: RunInputs) -> bool:
        # SGD's recovery lr is chosen from the reference's gradient sizes (capture.sgd_recovery_lr).
        return inputs.family.optimizer.kind == "sgd"

    def capture_grad_kind(self, case: CaseSpec, inputs: RunInputs) -> str:
        from lockstep.formats.step_capture import GRAD_ADAM_MOMENT, GRAD_SGD_RECOVERED

        # Adam: the gradient from the first moment its saved optimizer state holds (capture.moment_gradients);
        # a capture that cannot pair the moments with the parameters falls back to the update's saturation.
        return GRAD_ADAM_MOMENT if inputs.family.optimizer.kind == "adam" else GRAD_SGD_RECOVERED

    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request):
        """One step at a recovery lr, its weights saved and its module outputs dumped (capture.py)."""
        from lockstep.runners.infinitrain.capture import capture_step

        return capture_step(self, case, inputs, Path(work_dir), request)

    def start_capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request):
        """Its launches, then its saved weights read (and the update recovered) in the background."""
        from lockstep.runners.base import Background
        from lockstep.runners.infinitrain.capture import launch_step

        return Background(launch_step(self, case, inputs, Path(work_dir), request),
                          name=f"lockstep-infinitrain-{case.name}-capture")

    # ------------------------------------------------------------------ running

    def command(self, case: CaseSpec, inputs: RunInputs, run_dir: Path | None = None) -> list[str]:
        """The executable and its gflags, as InfiniTrain's test script passes them (`--flag value`);
        over several nodes, under its launcher `infini_run` (and under `srun` with --launcher slurm).
        `run_dir` is the log's directory, where a LoRA case's init and a checkpoint case's folders go.

        Paths are absolute: the executable runs in the log's directory, not the caller's.
        """
        nodes = inputs.nodes
        args = self.training_command(case, inputs, threads=nodes.procs_per_node(case.world_size), run_dir=run_dir)
        if not nodes.multi_node:
            return args
        launcher = str(_absolute(self.executable(inputs.model.family).parent / LAUNCHER_EXECUTABLE))

        def infini_run(node_rank: str) -> list[str]:
            return [launcher, f"--nnodes={nodes.nnodes}", "--nproc_per_node=1", f"--node_rank={node_rank}",
                    f"--rdzv_endpoint={nodes.rdzv_endpoint}", "--", *args]

        if nodes.launcher != "slurm":
            return infini_run(str(nodes.node_rank))
        script = " ".join(a if a.startswith("--node_rank=") else shlex.quote(a) for a in infini_run("$SLURM_NODEID"))
        return srun_per_node(nodes, "exec " + script)

    def training_command(self, case: CaseSpec, inputs: RunInputs, threads: int,
                         run_dir: Path | None = None) -> list[str]:
        """One InfiniTrain process: `threads` of the world's ranks (all of them on one node)."""
        args = [
            str(_absolute(self.executable(inputs.model.family))),
            "--input_bin", str(_absolute(inputs.tokens)),
            "--llmc_filepath", str(_absolute(inputs.checkpoint)),
            "--device", inputs.device,
            "--dtype", case.dtype,
            "--sequence_length", str(case.seq_len),
            "--num_iteration", str(case.steps),
            "--learning_rate", repr(float(case.lr)),
            # B, the step's batch and this process's ranks; InfiniTrain's world is (processes x threads)
            # and DP = world / (TP * PP).
            *adapter_for(inputs.model.family).batch_flags(case, threads),
            *adapter_for(inputs.model.family).flags,
        ]
        if case.tp > 1:
            args += ["--tensor_parallel", str(case.tp)]
        if case.sp:
            # A gflags bool takes no separate value (`--sequence_parallel true` would leave a stray "true").
            args += ["--sequence_parallel=true"]
        if case.pp > 1:
            args += ["--pipeline_parallel", str(case.pp)]
        if case.vpp > 1:
            args += ["--virtual_pipeline_parallel", str(case.vpp)]
        if case.zero:
            facts = self.facts(inputs.model.family)
            if facts is None or facts.has_flag("zero_stage"):
                args += ["--zero_stage", str(case.zero)]
            else:  # older builds: DistributedOptimizer on or off, which is ZeRO-1 (_flag_skip_reason)
                args += ["--use_distributed_optimizer=true"]
        args += lr_schedule_flags(case) + recompute_flags(case)
        if case.lora is not None or case.checkpoint is not None:
            if run_dir is None:
                raise ValueError(f"case {case.name}'s LoRA init and checkpoints go beside its log: give run_dir")
            run_dir = _absolute(Path(run_dir))
            if case.lora is not None:
                args += lora_flags(case.lora, lora_init_path(case, run_dir))
            checkpoints = checkpoints_for(case, run_dir)
            if checkpoints is not None:
                args += checkpoints.flags()
        return args

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None) -> ExecuteResult:
        self.preflight(inputs)
        check_enough_tokens(case, inputs.tokens)
        facts = self.facts(inputs.model.family)
        llmc = inputs.checkpoint
        if facts is not None:
            llmc = adapter_for(inputs.model.family).checkpoint_for(facts, inputs.checkpoint, inputs.checkpoint_sha256,
                                                                   inputs.model, Path(log_path).parent)
            if inputs.save_final_params and not facts.has_flag("save"):
                raise LockstepError(f"{facts.path} has no --save, so lockstep cannot read its final weights")
        run_dir = Path(log_path).parent
        cmd = self.command(case, dataclasses.replace(inputs, checkpoint=llmc) if llmc != inputs.checkpoint else inputs,
                           run_dir=run_dir)
        check_dir = inputs.extra.get(PRECISION_CHECK_DIR)
        if check_dir:
            cmd.append(precision_check_flag(_absolute(Path(check_dir))))
        lora_tensors = 0
        if case.lora is not None:
            lora_file, lora_tensors = write_lora_init(case, inputs.model.family, inputs.model, inputs.lora_seed,
                                                        run_dir)
        checkpoints = checkpoints_for(case, run_dir)
        if checkpoints is not None:
            checkpoints.prepare()
        # The weights after the last step: the case's own last save where it saves (InfiniTrain always
        # saves after the last step), else a save of lockstep's own, weights only, removed once read.
        own_save = checkpoints is None or checkpoints.save_root is None
        save_dir = Path(log_path).with_name(f"{case.name}.save") if own_save else checkpoints.save_root
        if inputs.save_final_params and own_save:
            shutil.rmtree(save_dir, ignore_errors=True)
            # A capture's Adam step keeps its optimizer state: the first moment is (1 - beta1)·g, the gradient whole.
            moments = bool(inputs.extra.get(KEEP_SAVE)) and inputs.family.optimizer.kind == "adam"
            cmd += ["--save", str(_absolute(save_dir)), "--save_interval", str(case.steps),
                    f"--save_optimizer_state={'true' if moments else 'false'}"]
        env = worker_env({"GLOG_logtostderr": "1", **shared_cores_env(inputs.jobs)})
        for key in INFINITRAIN_PROCESS_ENV:
            env.pop(key, None)
        timeout_s = inputs.timeout_s if inputs.timeout_s is not None else DEFAULT_TIMEOUT_S
        log_path = Path(log_path)
        # cwd = the log's directory: anything the executable drops in its working directory
        # (profiles, checkpoints) stays with the run, not in the user's cwd.
        parse = _parse_steps if adapter_for(inputs.model.family).glog_step_lines else _parse_plain_steps
        run = run_logged(cmd, log_path, parse, env=env, cwd=log_path.parent, timeout_s=timeout_s,
                         on_step=on_step, what="InfiniTrain")
        text, steps = run.text, run.steps
        check_finished(run, log_path, case.steps, "InfiniTrain", timeout_s, writes_records=inputs.nodes.writes_records,
                       first=first_step(case))
        if case.lora is not None:
            check_lora_loaded(text, log_path, lora_file, lora_tensors)
        if checkpoints is not None and inputs.nodes.writes_records:
            checkpoints.check_saved()
        saved = {}
        if inputs.save_final_params and inputs.nodes.writes_records:
            if inputs.extra.get(KEEP_SAVE):
                saved = {"infinitrain_save": str(saved_checkpoint(save_dir, case))}
            else:
                write_final_params_from_save(save_dir, case, inputs, final_params_path(log_path), remove=own_save)
        save_s = checkpoint_save_seconds(text) if checkpoints is not None else None
        load_s = checkpoint_load_seconds(text) if checkpoints is not None else None
        meta = {
            **saved,
            **({"lora_init": str(lora_file), "lora_init_tensors": lora_tensors, "lora_seed": inputs.lora_seed}
               if case.lora is not None else {}),
            **({"checkpoint_save_s": save_s} if save_s is not None else {}),
            **({"checkpoint_load_s": load_s} if load_s is not None else {}),
            **({"infinitrain_checkpoints": str(checkpoints.save_root)}
               if checkpoints is not None and checkpoints.save_root is not None else {}),
            **log_phases(text),
            "worker_command": shlex.join(cmd),
            "infinitrain_build": str(self.build_dir),
            **({"infinitrain_llmc": str(llmc), "infinitrain_llmc_version": facts.llmc_version}
               if llmc != inputs.checkpoint else {}),
            "infinitrain_commit": find_build_commit(self.build_dir) or "unknown",
            "lr_significant_digits": LOGGED_LR_DIGITS,
            "launcher": ("subprocess" + (f", {case.world_size} threads" if case.world_size > 1 else "")
                         if not inputs.nodes.multi_node else f"infini_run on {inputs.nodes.label}"),
        }
        return ExecuteResult(steps=steps, meta=meta)


# ---------------------------------------------------------------------- helpers


def lr_schedule_flags(case: CaseSpec) -> list[str]:
    """The case's lr schedule as InfiniTrain's flags of the same names (none without a schedule:
    the build's default, a constant --learning_rate). --lr_decay_iters is passed as the case
    resolves it (0 means the run's steps in both)."""
    schedule = case.lr_schedule
    if schedule is None:
        return []
    return ["--lr_decay_style", schedule.lr_decay_style, "--lr_warmup_iters", str(schedule.lr_warmup_iters),
            "--lr_warmup_init", repr(float(schedule.lr_warmup_init)),
            "--lr_decay_iters", str(schedule.decay_iters(case.steps)), "--min_lr", repr(float(schedule.min_lr))]


def recompute_flags(case: CaseSpec) -> list[str]:
    """The case's activation recompute as InfiniTrain's flags of the same names (none when off)."""
    if not case.activation_recompute:
        return []
    return ["--activation_recompute=true", "--recompute_granularity", case.recompute_granularity,
            "--recompute_method", case.recompute_method, "--recompute_num_layers", str(case.recompute_num_layers)]


def _flag_skip_reason(case: CaseSpec, facts: ExecutableFacts) -> str | None:
    """A case the probed executable has no flag for."""
    if case.lora is not None and not (facts.has_flag("lora_rank") and facts.has_flag("lora_load_path")):
        return f"this InfiniTrain build's {facts.path.name} has no --lora_rank/--lora_load_path"
    if case.checkpoint is not None:
        lacking = [f"--{f}" for f in ("save", "load", "save_interval", "max_checkpoint_keep", "save_optimizer_state")
                   if not facts.has_flag(f)]
        if lacking:
            return f"this InfiniTrain build's {facts.path.name} has no {', '.join(lacking)}"
    if case.lr_schedule is not None:
        lacking = [f"--{f}" for f in LR_SCHEDULE_FLAGS if not facts.has_flag(f)]
        if lacking:
            return f"this InfiniTrain build's {facts.path.name} has no {', '.join(lacking)} (the case's lr schedule)"
    if case.activation_recompute:
        lacking = [f"--{f}" for f in RECOMPUTE_FLAGS if not facts.has_flag(f)]
        if lacking:
            return f"this InfiniTrain build's {facts.path.name} has no {', '.join(lacking)} (the case's recompute)"
    if case.zero and not facts.has_flag("zero_stage"):
        if not facts.has_flag("use_distributed_optimizer"):
            return f"this InfiniTrain build's {facts.path.name} has no ZeRO flag"
        if case.zero > 1:
            return (f"this InfiniTrain build's {facts.path.name} has only --use_distributed_optimizer (ZeRO-1), "
                    f"not ZeRO stage {case.zero}")
    return None


def saved_checkpoint(save_dir: Path, case: CaseSpec) -> Path:
    """The model.ckpt InfiniTrain saved after the case's last step."""
    ckpt = save_dir / f"checkpoint_step_{case.steps:06d}" / "model.ckpt"
    if not ckpt.is_file():
        raise RunError(f"{ckpt}: InfiniTrain saved no checkpoint after step {case.steps} "
                       "(this build's --save/--save_interval flags may differ)")
    return ckpt


def write_final_params_from_save(save_dir: Path, case: CaseSpec, inputs: RunInputs, out_path: Path,
                                 remove: bool = True) -> None:
    """InfiniTrain's checkpoint after the last step -> `<case>.final.npz` under LLMC names; the
    checkpoint itself (a second copy of the model) is removed when it is lockstep's own save
    (`remove`), kept when it is the case's (a resume reads it)."""
    ckpt = saved_checkpoint(save_dir, case)
    saved = read_infinitrain_checkpoint(ckpt)
    state = adapter_for(inputs.model.family).canonical_state(saved, inputs.model)
    if case.lora is not None:  # the adapters too, by the names the other runners give them (lora_A.qkvw[0])
        from lockstep.runners.infinitrain.lora import canonical_adapters

        state |= canonical_adapters(saved)
    write_final_params(out_path, state)
    if remove:
        shutil.rmtree(save_dir, ignore_errors=True)



_GLOG_TIME = re.compile(r"^[IWEF](\d{8} \d{2}:\d{2}:\d{2}\.\d{6}) ")


def log_phases(text: str) -> dict:
    """Its phases from its own glog timestamps (local time): until its first line, start-up; until
    "start training", weights (the checkpoint and the data loader, which it does not tell apart);
    until its last step line, training; the rest (after the last step) is teardown."""
    import datetime as dt

    stamps, start_training, last_step = [], None, None
    for line in text.splitlines():
        m = _GLOG_TIME.match(line)
        if not m:
            continue
        t = dt.datetime.strptime(m.group(1), "%Y%m%d %H:%M:%S.%f").timestamp()
        stamps.append(t)
        if start_training is None and line.rstrip().endswith("] start training"):
            start_training = t
        if " | train loss " in line:
            last_step = t
    if not stamps or start_training is None or last_step is None:
        return {}
    return {"phases": {"weights": round(start_training - stamps[0], 3), "training": round(last_step - start_training, 3)},
            "case_started_wall": stamps[0], "case_finished_wall": last_step}


def lora_init_path(case: CaseSpec, run_dir: Path) -> Path:
    from lockstep.runners.infinitrain.lora import LORA_INIT_SUFFIX

    return Path(run_dir) / f"{case.name}{LORA_INIT_SUFFIX}"


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def infinitrain_tokens_needed(case: CaseSpec) -> int:
    """Tokens InfiniTrain's loader needs: every step's sequences plus one whole extra sequence.

    It cuts the file into floor(N/T) sequences and uses only the first floor(N/T) - 1 as
    samples (sample i's targets end in sequence i+1), and it never wraps.
    """
    return case.steps * case.total_batch + case.seq_len


def check_enough_tokens(case: CaseSpec, tokens_path: Path) -> None:
    stream = read_token_stream(tokens_path, check_ids=False)  # header count and payload size only
    need = infinitrain_tokens_needed(case)
    if len(stream) < need:
        raise CaseError(f"{tokens_path}: holds {len(stream)} tokens but InfiniTrain needs {need} for case {case.name} "
                        f"({case.steps} steps x {case.total_batch} tokens + one {case.seq_len}-token sequence, "
                        "since it never wraps)")


def find_build_commit(build_dir: Path) -> str | None:
    """The InfiniTrain source commit of a build: a COMMIT_FILE in or above the build dir, the
    build dir's own git checkout, or the git checkout of the source dir in CMakeCache.txt."""
    build_dir = Path(build_dir)
    for d in (build_dir, build_dir.parent):
        f = d / COMMIT_FILE
        if f.is_file():
            text = f.read_text(errors="replace").split()
            if text:
                return text[0]
    candidates = [build_dir]
    source = _cmake_source_dir(build_dir)
    if source is not None:
        candidates.insert(0, source)
        if (source / COMMIT_FILE).is_file():
            text = (source / COMMIT_FILE).read_text(errors="replace").split()
            if text:
                return text[0]
    for d in candidates:
        commit = _git_commit(d)
        if commit:
            return commit
    return None


def _cmake_source_dir(build_dir: Path) -> Path | None:
    cache = build_dir / "CMakeCache.txt"
    try:
        lines = cache.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(("infini_train_SOURCE_DIR:", "CMAKE_HOME_DIRECTORY:")):
            path = Path(line.split("=", 1)[1].strip())
            if path.is_dir():
                return path
    return None


def _git_commit(directory: Path) -> str | None:
    if not directory.is_dir():
        return None
    try:
        out = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _parse_steps(text: str, source: str) -> list[StepRecord]:
    return parse_infinitrain_log(text, source).steps


def _parse_plain_steps(text: str, source: str) -> list[StepRecord]:
    """An executable that prints its step lines to stdout, without glog's prefix (tiny_mixtral)."""
    return parse_infinitrain_log(text, source, glog=False).steps
