"""`megatron` runner: NVIDIA megatron-core's GPTModel trained by megatron-core, one torchrun process per device.

The parent process never imports megatron-core (importing it takes seconds and it may be
absent); it checks what it can cheaply, hands the case to `worker.py` under torchrun through
launch.run_workers, and turns the workers' step results into the run record. With persistent
workers (runners/workers.py) one torchrun per world size runs every such case of the plan, each
case making and releasing its own TP/PP/DP grid inside the one process group (parallel.py).

On the CPU (CI) the workers use gloo and a few small shims (cpu_shims.py) and otherwise run
the same megatron-core code as on CUDA -- GPTModel, the TP layers and vocab-parallel cross
entropy, the pipeline schedules and their p2p settings (model.pipeline_p2p), megatron's DDP and
its optimizers. What differs on the CPU: parameters are created on the CPU
(`use_cpu_initialization`), and BF16 and sequence-parallel cases are skipped (megatron-core's
bf16 autocast backward needs CUDA; its local-spec LayerNorm supports SP only through Apex).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from lockstep.capture.request import CaptureRequest
from lockstep.cases.spec import NEEDS_CHECKPOINT, NEEDS_LORA, CaseSpec, CheckpointSpec
from lockstep.errors import RunError
from lockstep.formats.tokens import read_token_stream
from lockstep.runners.base import (ExecuteResult, FrameworkRunner, StepInspector, RunInputs, StepCallback, final_params_path,
                                   launch_meta, oversubscribed_env)
from lockstep.runners.checkpoint_plan import plan_for
from lockstep.runners.launch import run_workers
from lockstep.runners.megatron.options import INSTALL_HINT, megatron_core_installed  # noqa: F401 (also read from here)
from lockstep.runners.megatron.job import (DEFAULT_TIMEOUT_S, WORKER_MODULE, MegatronFastOptions, MegatronJob,
                                           MegatronTEOptions, MegatronOptions, missing_checkpoint)
from lockstep.runners.workers import WorkerGroup, WorkerGroupDied

def apex_installed() -> bool:
    try:
        return importlib.util.find_spec("apex") is not None
    except (ImportError, ValueError):
        return False


def megatron_core_version() -> str:
    """The installed megatron-core's version, read from package metadata (no import of megatron)."""
    for dist_name in ("megatron-core", "megatron_core"):
        try:
            return importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import megatron.core  # a source checkout without distribution metadata

    return getattr(megatron.core, "__version__", "unknown")


def worker_timeout(inputs: RunInputs) -> float:
    """--timeout, or the default every runner has: a hung rank never holds the run forever."""
    return inputs.timeout_s if inputs.timeout_s is not None else DEFAULT_TIMEOUT_S


class MegatronRunner(StepInspector, FrameworkRunner):
    name = "megatron"
    # Save/resume through megatron-core's dist_checkpointing (checkpoint.py, docs/reference/checkpoints.md);
    # LoRA through lockstep's own adapter on the parallel linears (lora.py, docs/reference/lora.md).
    supports = frozenset({NEEDS_CHECKPOINT, NEEDS_LORA})
    options_type = MegatronOptions

    def __init__(self, **options):
        self.options = self.options_type(**options)

    def version(self) -> str:
        return f"megatron-core {megatron_core_version()}"

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        if not megatron_core_installed():
            return f"megatron-core is not installed ({INSTALL_HINT})"
        unsupported = self.unsupported_family(inputs)
        if unsupported:
            return unsupported
        if case.is_bf16 and inputs.device != "cuda":
            if self.options.native_bf16:
                return "megatron-core's native bf16 (Float16Module and its optimizer) needs CUDA"
            return "megatron-core's bf16 autocast backward needs CUDA"
        if case.zero == 2:
            # Its distributed optimizer shards the optimizer state (ZeRO-1) and reduce-scatters the
            # gradients into a full-size buffer; sharded gradients are Megatron-FSDP's, not used here.
            return ("megatron-core's distributed optimizer is ZeRO-1 (zero = 1); ZeRO-2 (sharded gradient "
                    "buffers) is Megatron-FSDP, which this runner does not use")
        if case.zero == 1 and inputs.device != "cuda":
            return ("megatron-core's distributed optimizer (ZeRO-1) needs CUDA (it accepts only torch.cuda "
                    "parameter tensors, distrib_optimizer.py)")
        if case.zero == 1 and inputs.family.optimizer.kind != "adam":
            return (f"megatron-core's distributed optimizer (ZeRO-1) accepts only Adam (an assertion in "
                    f"distrib_optimizer.py), the {inputs.family.title} contract is {inputs.family.optimizer.label}")
        from lockstep.runners.megatron.families import adapter_for

        adapter = adapter_for(inputs.model)
        if case.sp and not adapter.sequence_parallel_norms and (inputs.device != "cuda" or not apex_installed()):
            # The local layer spec's LayerNorm is Apex's FusedLayerNorm when Apex is installed (CUDA
            # only), else torch's, which megatron-core refuses to use with sequence parallelism.
            return "sequence parallel with megatron-core's local layer spec needs NVIDIA Apex's FusedLayerNorm (CUDA)"
        if case.lora is not None:
            if case.sp:
                return "lockstep's LoRA adapter on megatron-core does not implement sequence parallelism yet"
            if self.options.native_bf16:
                return "lockstep's LoRA adapter on megatron-core keeps A and B in FP32, which native bf16 (Float16Module) would cast"
            if case.checkpoint is not None:
                return "the megatron runner does not save and resume LoRA cases yet"
        problem = adapter.layout_problem(case, inputs.model)
        if problem:
            return f"megatron-core cannot lay this model out: {problem}"
        return super().skip_reason(case, inputs)

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        return self.skip_reason(case, inputs)  # it records step 1 of any case it can train

    def at_step_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        """The reference's state goes in through write_megatron_checkpoint, which seeds the moments
        of megatron-core's FP32 optimizer parameter by parameter: neither the distributed optimizer's
        flat shards (ZeRO-1) nor native bf16's FP32 main copies take them that way."""
        if case.zero >= 1:
            return ("megatron cannot start from the reference's state under its distributed optimizer (ZeRO-1): the "
                    "state is written into its FP32 optimizer's per-parameter moments (write_megatron_checkpoint); "
                    "diagnose the case with zero = 0")
        if case.lora is not None:
            return ("megatron cannot start a LoRA case from the reference's state: the canonical state and "
                    "write_megatron_checkpoint hold the base weights and their Adam moments, not the adapters")
        if self.options.native_bf16 and case.is_bf16:
            return ("megatron cannot start from the reference's state in native bf16 (its FP32 main parameters are "
                    "not written by write_megatron_checkpoint): diagnose without native_bf16")
        return self.capture_problem(case, inputs)  # then as its step 1: any case it can train here

    def capture(self, case: CaseSpec, inputs: RunInputs, work_dir: Path, request: CaptureRequest):
        """A one-step run of the case that records its step 1 (the update after it changes nothing recorded)."""
        from lockstep.formats.step_capture import StepCapture

        work_dir = Path(work_dir)
        # Step 1 from the initial weights (or the step after the reference's state: execute resumes
        # from it): never the case's own resume, and never a save that would replace its step folders.
        one_step = case.first_steps(request.step, checkpoint=None)
        log_path = work_dir / f"megatron_{case.name}_step{request.step}.log"
        work_dir.mkdir(parents=True, exist_ok=True)
        self.execute(one_step, dataclasses.replace(inputs, capture=request, save_final_params=False), log_path, None)
        return StepCapture.load(request.path)

    def worker_group_key(self, case: CaseSpec, inputs: RunInputs):
        # Cases of one world size share a torchrun; each sets up its own TP/PP/DP grid inside it.
        return ("torchrun", case.world_size, inputs.device, inputs.nodes,
                tuple(sorted(oversubscribed_env(case, inputs).items())))

    def open_workers(self, case: CaseSpec, inputs: RunInputs) -> WorkerGroup:
        # One rank on one machine needs no torchrun (seconds of its own start-up on a GPU machine).
        single = case.world_size == 1 and not inputs.nodes.multi_node and inputs.nodes.launcher != "slurm"
        return WorkerGroup(WORKER_MODULE, case.world_size, inputs.device, env=oversubscribed_env(case, inputs),
                           nodes=inputs.nodes, label=f"megatron-core, {case.world_size} rank(s)",
                           use_torchrun=not single)

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None,
                workers: WorkerGroup | None = None) -> ExecuteResult:
        # Checked here too (cheap: header only) so an impossible case fails before torchrun starts.
        case.check(max_seq_len=inputs.model.max_seq_len,
                   available_tokens=len(read_token_stream(inputs.tokens, check_ids=False)))
        written = None
        if inputs.capture is not None and inputs.capture.start_state is not None:
            case, inputs, written = self._from_reference_state(case, inputs, log_path, workers)
        try:
            return self._execute(case, inputs, log_path, on_step, workers)
        finally:
            if written is not None:
                shutil.rmtree(written, ignore_errors=True)  # hundreds of MB for a 1B model's Adam

    def _from_reference_state(self, case: CaseSpec, inputs: RunInputs, log_path: Path,
                              workers: WorkerGroup | None) -> tuple[CaseSpec, RunInputs, Path]:
        """diagnose --at-step N: the reference's saved state after step N (its DCP folder, read under
        canonical names) written as this runner's own step folder for the case's layout, and the
        case as a resume of it that trains step N+1 (the step the capture records)."""
        from lockstep.runners.checkpoint_plan import CheckpointPlan, ResumePlan
        from lockstep.runners.reference import SavedState, reference_services

        request = inputs.capture
        state = reference_services().read_state(SavedState(request.start_step, Path(request.start_state)), case, inputs)
        adam = ({"exp_avg": state.exp_avg, "exp_avg_sq": state.exp_avg_sq}
                if inputs.family.optimizer.kind == "adam" else None)
        if adam is not None and state.adam_step != request.start_step:
            raise RunError(f"{request.start_state}: Adam's step count is {state.adam_step}, not {request.start_step}: "
                           f"not the state after step {request.start_step}")
        root = log_path.parent / f"{case.name}.reference_state"
        shutil.rmtree(root, ignore_errors=True)
        folder = write_megatron_checkpoint(state.weights, adam, request.start_step, case, inputs, root,
                                           workers=workers, options=self.options)
        resumed = case.first_steps(request.step, checkpoint=CheckpointSpec(resume_from=request.start_step))
        plan = CheckpointPlan(resume=ResumePlan(str(folder), request.start_step))
        return resumed, dataclasses.replace(inputs, extra={**inputs.extra, "megatron_checkpoints": plan}), root

    def _execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None,
                 workers: WorkerGroup | None) -> ExecuteResult:
        # A plan of the caller's (a resume of a folder written by write_megatron_checkpoint), or the case's.
        checkpoints = inputs.extra.get("megatron_checkpoints") or plan_for(case, log_path)
        if checkpoints is not None:
            checkpoints.clear_earlier_saves()  # a resume after a failed save must not find an older run's
            if checkpoints.resume is not None:  # before torchrun starts: the folder must be there
                problem = missing_checkpoint(checkpoints.resume.directory, checkpoints.resume.step)
                if problem:
                    raise RunError(problem)
        with tempfile.TemporaryDirectory(prefix="lockstep-megatron-") as td:
            error_path = Path(td) / "error.txt"
            job = MegatronJob(case=case, model=inputs.model, checkpoint=str(inputs.checkpoint), tokens=str(inputs.tokens),
                              tokens_sha256=inputs.tokens_sha256, device=inputs.device, options=self.options,
                              error_path=str(error_path),
                              capture=inputs.capture if self.capture_problem(case, inputs) is None else None,
                              final_params_path=str(final_params_path(log_path)) if inputs.save_final_params else None,
                              checkpoints=checkpoints, lora_seed=inputs.lora_seed, framework=self.name)
            env = oversubscribed_env(case, inputs)
            try:
                if workers is not None:
                    steps, info = workers.run_job(job.to_dict(), log_path, timeout_s=worker_timeout(inputs), on_step=on_step)
                else:
                    steps, info = run_workers(WORKER_MODULE, job.to_dict(), nproc=case.world_size, log_path=log_path,
                                              timeout_s=worker_timeout(inputs), on_step=on_step, env=env, nodes=inputs.nodes)
            except RunError as e:
                # A worker that failed with a known cause left one sentence naming it (tensor, rank, ...).
                if error_path.is_file() and error_path.read_text().strip():
                    ended = f"; {e.what}{e.tail}" if isinstance(e, WorkerGroupDied) else ""
                    raise RunError(f"{log_path}: {error_path.read_text().strip()}{ended}") from None
                raise
        meta = {**info, **launch_meta(case, inputs, env), "runner_options": asdict(self.options)}
        if workers is not None and not workers.use_torchrun:
            meta["launcher"] = "one process (a single rank: no torchrun, its environment set by lockstep)"
        if self.options.native_bf16 and case.is_bf16:
            meta["notes"] = ("diagnostic mode native_bf16: Megatron's native bf16 parameters (Float16Module, fp32 main "
                             "params), not the contract's autocast with fp32 parameters")
        return ExecuteResult(steps=steps, meta=meta)


class MegatronFastRunner(MegatronRunner):
    """`megatron-fast`: the same runner and worker with megatron-fast's options (fast.py: SDPA core
    attention, megatron-core's fusions, CUDA graphs where asked for and possible)."""

    name = "megatron-fast"
    options_type = MegatronFastOptions
    # Its speed is what it adds; LoRA and save/resume are judged on `megatron`, and were never run
    # with SDPA and the fusions: not claimed here until they are.
    supports = frozenset()

    def version(self) -> str:
        o = self.options
        parts = [f"{o.core_attention} attention", "fusions" if o.fusions else "no fusions",
                 "CUDA graphs (CUDA only)" if o.cuda_graphs else "no CUDA graphs"]
        return f"{super().version()} (megatron-fast: {', '.join(parts)})"


# Transformer Engine's cuBLASLt GEMM (common/gemm/cublaslt_gemm.cu, "Use TF32 only for pure FP32 GEMM"), with no
# switch: measured on the H100, gpt2_2 FP32 parts from pytorch by 2.9e-05 at step 1 and 3.3e-05 by step 5.
TE_FP32_GEMMS = ("Transformer Engine computes pure-FP32 GEMMs in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32, no switch), "
                 "where the contract's FP32 keeps TF32 off")


class MegatronTERunner(MegatronRunner):
    """`megatron-te`: the same runner and worker with Transformer Engine's layer spec (te_spec.py)."""

    name = "megatron-te"
    options_type = MegatronTEOptions
    # Loss and speed only: its step 1 cannot be recorded from inside (the norms live inside TE's
    # fused linear layers, where megatron's capture hooks do not reach), nor LoRA or save/resume.
    supports = frozenset()

    def skip_reason(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        from lockstep.runners.megatron.te_spec import transformer_engine_missing

        if inputs.device != "cuda":
            return "Transformer Engine runs on CUDA only"
        missing = transformer_engine_missing()
        if missing:
            return missing
        if case.world_size != 1:
            return "megatron-te runs one-device cases only (its parallel layouts were never tried)"
        return super().skip_reason(case, inputs)

    def execute(self, case: CaseSpec, inputs: RunInputs, log_path: Path, on_step: StepCallback | None,
                workers: WorkerGroup | None = None) -> ExecuteResult:
        result = super().execute(case, inputs, log_path, on_step, workers=workers)
        if not case.is_bf16:
            result.meta["departures"] = [TE_FP32_GEMMS]
        return result

    def capture_problem(self, case: CaseSpec, inputs: RunInputs) -> str | None:
        # Recorded anyway, its "ln1" would be the identity TE's spec leaves in the norm's place (on
        # the H100, a false forward finding at ln1[0]).
        return self.skip_reason(case, inputs) or (
            "megatron-te cannot show its step 1 from inside: its norms are inside Transformer Engine's fused "
            "LayerNorm+Linear layers, where megatron's capture hooks see only the identity left in their place")

    def version(self) -> str:
        import importlib.metadata as md

        try:
            te = md.version("transformer_engine")
        except md.PackageNotFoundError:
            te = "not installed"
        return f"{super().version()} (megatron-te: Transformer Engine {te} layer spec)"


def stacked_llmc_tensors(canonical: dict, config) -> dict:
    """Canonical tensors, per layer (`qkvw[3]`, as final.npz and the captures name them) or already
    stacked over layers (`qkvw`), as the LLMC file's stacked tensors."""
    import numpy as np

    out = {}
    for name, shape in config.tensor_shapes():
        if name in canonical:
            out[name] = np.asarray(canonical[name], dtype=np.float32)
        elif name in config.PER_LAYER:
            try:
                out[name] = np.stack([np.asarray(canonical[f"{name}[{layer}]"], dtype=np.float32)
                                      for layer in range(config.num_layers)])
            except KeyError as e:
                raise RunError(f"the canonical parameters have no {e.args[0]}") from None
        else:
            raise RunError(f"the canonical parameters have no {name}")
        if tuple(out[name].shape) != tuple(shape):
            raise RunError(f"canonical tensor {name} has shape {tuple(out[name].shape)}, the model needs {tuple(shape)}")
    return out


def write_megatron_checkpoint(canonical_params: dict, adam_state: dict | None, step: int, case: CaseSpec,
                              inputs: RunInputs, dest: Path, workers: WorkerGroup | None = None,
                              options: MegatronOptions | None = None) -> Path:
    """Write the state of a run after `step` updates as the megatron runner's own step folder,
    `dest/step_NNNNNN/` (megatron-core dist_checkpointing, checkpoint.py), from canonical tensors:
    `canonical_params` (LLMC names, per layer `qkvw[3]` or stacked `qkvw`; the values the model
    has after `step` updates) and, for an Adam family, `adam_state` =
    `{"exp_avg": {name: array}, "exp_avg_sq": {name: array}}` under the same names (torch Adam's
    step count is `step`); None for SGD. The case's layout (TP, PP, VPP, DP) is the one the
    folder is written for; the megatron workers build the model from the parameters, put the
    moments in its FP32 optimizer, and save as a run that made `step` updates (data position
    `step`, scheduler at `step`). Returns the step folder.

    Resume it with `dataclasses.replace(inputs, extra={**inputs.extra, "megatron_checkpoints":
    CheckpointPlan(resume=ResumePlan(str(folder), step))})` and a case whose `checkpoint` has
    `resume_from = step`: the run trains steps step+1..steps exactly as a resume of its own save."""
    import dataclasses as _dc

    import numpy as np

    if (inputs.family.optimizer.kind == "adam") != (adam_state is not None):
        raise RunError(f"a megatron checkpoint of {inputs.family.title} ({inputs.family.optimizer.label}) needs "
                       + ("Adam's moments (adam_state)" if adam_state is None else "no optimizer state (adam_state None)"))
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    options = options or MegatronOptions()
    with tempfile.TemporaryDirectory(prefix="lockstep-megatron-write-", dir=dest) as td:
        weights = Path(td) / "weights.bin"
        inputs.family.write(weights, inputs.model, stacked_llmc_tensors(canonical_params, inputs.model))
        moments = None
        if adam_state is not None:
            moments = Path(td) / "moments.npz"
            np.savez(moments, **{f"{kind}.{name}": np.asarray(v, dtype=np.float32)
                                 for kind in ("exp_avg", "exp_avg_sq") for name, v in adam_state[kind].items()})
        error_path = Path(td) / "error.txt"
        job = MegatronJob(case=_dc.replace(case, checkpoint=None), model=inputs.model, checkpoint=str(weights),
                          tokens=str(inputs.tokens), tokens_sha256=inputs.tokens_sha256, device=inputs.device,
                          options=options, error_path=str(error_path),
                          write_state={"root": str(dest), "step": int(step), "moments": str(moments) if moments else None})
        log_path = dest / f"write_step_{step:06d}.log"
        try:
            if workers is not None:
                _, info = workers.run_job(job.to_dict(), log_path, timeout_s=worker_timeout(inputs))
            else:
                _, info = run_workers(WORKER_MODULE, job.to_dict(), nproc=case.world_size, log_path=log_path,
                                      timeout_s=worker_timeout(inputs), env=oversubscribed_env(case, inputs), nodes=inputs.nodes)
        except RunError as e:
            if error_path.is_file() and error_path.read_text().strip():
                raise RunError(f"{log_path}: {error_path.read_text().strip()}") from None
            raise
    return Path(info["checkpoint_written"])
