"""How `lockstep diagnose` gets step 1 out of each framework.

- pytorch: in this process, the family's reference module with forward hooks (reference_capture).
- megatron: its worker under torchrun with `diagnose_path` set (megatron_capture), one step.
- infinitrain: its executable for one step of SGD at a large power-of-two lr with `--save`, each
  gradient recovered as (w0 - w1)/lr (weights_only); for Adam families only the sign. The same
  step dumps its module outputs (`--precision_check`, runners/infinitrain/precision_check.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.diagnose.capture import GRAD_ADAM_SIGN, GRAD_SGD_RECOVERED, StepCapture
from lockstep.errors import LockstepError, RunError
from lockstep.models import load_checkpoint
from lockstep.models.family import split_canonical
from lockstep.runners.base import RunInputs

DIAGNOSABLE = ("pytorch", "megatron", "infinitrain")


def capture(framework: str, case: CaseSpec, inputs: RunInputs, work_dir: Path,
            reference: StepCapture | None = None, options: dict | None = None) -> StepCapture:
    """Step 1 of `case` on `framework`; `reference` (a pytorch capture) picks InfiniTrain's recovery lr."""
    start = time.perf_counter()
    if framework == "pytorch":
        cap = capture_pytorch(case, inputs, work_dir)
    elif framework == "megatron":
        cap = capture_megatron(case, inputs, work_dir)
    elif framework == "infinitrain":
        cap = capture_infinitrain(case, inputs, work_dir, reference, (options or {}).get("build_dir"))
    else:
        raise LockstepError(f"diagnose cannot look inside framework {framework!r} (it can: {', '.join(DIAGNOSABLE)})")
    cap.meta["seconds"] = time.perf_counter() - start
    return cap


def capture_pytorch(case: CaseSpec, inputs: RunInputs, work_dir: Path) -> StepCapture:
    from lockstep.runners.pytorch.train import diagnose_step

    work_dir.mkdir(parents=True, exist_ok=True)
    return diagnose_step(case, str(inputs.checkpoint), str(inputs.tokens), inputs.device,
                         str(work_dir / f"pytorch_{case.name}_step1.npz"))


def capture_megatron(case: CaseSpec, inputs: RunInputs, work_dir: Path) -> StepCapture:
    from lockstep.runners.launch import run_workers
    from lockstep.runners.megatron.job import WORKER_MODULE, MegatronJob
    from lockstep.runners.megatron.runner import megatron_core_installed

    if not megatron_core_installed():
        raise LockstepError("megatron-core is not installed (pip install 'lockstep[megatron]')")
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / f"megatron_{case.name}_step1.npz"
    log_path = work_dir / f"megatron_{case.name}_step1.log"
    with tempfile.TemporaryDirectory(prefix="lockstep-diagnose-") as td:
        error_path = Path(td) / "error.txt"
        job = MegatronJob(case=case, model=inputs.model, checkpoint=str(inputs.checkpoint), tokens=str(inputs.tokens),
                          tokens_sha256=inputs.tokens_sha256, device=inputs.device, error_path=str(error_path),
                          diagnose_path=str(path))
        try:
            run_workers(WORKER_MODULE, job.to_dict(), nproc=case.world_size, log_path=log_path,
                        timeout_s=inputs.timeout_s)
        except RunError:
            if error_path.is_file() and error_path.read_text().strip():
                raise RunError(f"{log_path}: {error_path.read_text().strip()}") from None
            raise
    return StepCapture.load(path)


def capture_infinitrain(case: CaseSpec, inputs: RunInputs, work_dir: Path, reference: StepCapture | None,
                        build_dir: str | None) -> StepCapture:
    """One InfiniTrain step at a recovery lr, saved, and its gradients recovered from the weights."""
    import numpy as np

    from lockstep.diagnose import weights_only
    from lockstep.runners.base import final_params_path
    from lockstep.runners.infinitrain import InfiniTrainRunner
    from lockstep.runners.infinitrain.precision_check import UNSUPPORTED_MARK, read_module_outputs
    from lockstep.runners.infinitrain.runner import PRECISION_CHECK_DIR

    family = inputs.family
    ckpt = load_checkpoint(inputs.checkpoint)
    w0 = split_canonical(ckpt.tensors, ckpt.config)
    if family.optimizer.kind == "sgd":
        if reference is None:
            raise LockstepError("recovering InfiniTrain's gradients needs the reference's step-1 gradients to choose the lr")
        lr = weights_only.sgd_recovery_lr(w0, reference.grads)
    else:
        lr = weights_only.ADAM_RECOVERY_LR
    step_case = case.with_overrides(steps=1, lr=lr, name=f"{case.name}_recovery_lr{lr:g}")
    # The same step also dumps every module's output (its --precision_check): step 1's forward is
    # before the update, so the huge lr does not touch it.
    check_dir = (work_dir / f"infinitrain_{case.name}_module_outputs").resolve()
    shutil.rmtree(check_dir, ignore_errors=True)
    saving = dataclasses.replace(inputs, save_final_params=True)
    record = InfiniTrainRunner(build_dir).run(
        step_case, dataclasses.replace(saving, extra={**inputs.extra, PRECISION_CHECK_DIR: str(check_dir)}), work_dir)
    forward_note = ""
    if not record.ok and "unknown command line flag" in (record.error or "") and UNSUPPORTED_MARK in record.error:
        forward_note = ("this InfiniTrain build has no --precision_check, so no module outputs: its forward is "
                        "judged from the step-1 loss and the gradients")
        record = InfiniTrainRunner(build_dir).run(step_case, saving, work_dir)
    if not record.ok:
        raise RunError(f"InfiniTrain's recovery step failed: {record.error}")
    forward = read_module_outputs(check_dir)
    output_grads = read_module_outputs(check_dir, stage="backward") if case.pp == 1 else {}
    shutil.rmtree(check_dir, ignore_errors=True)  # every activation and its gradient: large, and read now
    params_path = final_params_path(Path(record.source).with_suffix(".log"))
    with np.load(params_path) as saved:
        w1 = {name: saved[name] for name in saved.files}
    cap = StepCapture(framework="infinitrain", loss=record.steps[0].loss, forward=forward, output_grads=output_grads,
                      forward_order=[n for n in (reference.forward_order if reference else []) if n in forward]
                      or list(forward))
    if forward_note:
        cap.notes.append(forward_note)
    elif forward:
        cap.notes.append(f"infinitrain module outputs: its own --precision_check dumps of rank 0's first micro batch "
                         f"({len(forward)} modules)")
    for name, before in w0.items():
        if name not in w1:
            raise RunError(f"{params_path}: InfiniTrain's checkpoint has no tensor for {name}")
        if family.optimizer.kind == "sgd":
            cap.grads[name], cap.grad_precision[name] = weights_only.recover_sgd(before, w1[name], lr)
        else:
            cap.grads[name] = weights_only.recover_adam_sign(before, w1[name])
    if family.optimizer.kind == "sgd":
        cap.grad_kind = GRAD_SGD_RECOVERED
        worst = max(cap.grad_precision.values(), default=0.0)
        cap.notes.append(f"infinitrain gradients recovered as (w0 - w1)/lr from one SGD step at lr {lr:g} (2^"
                         f"{int(np.log2(lr))}); w1's FP32 rounding bounds each tensor's relative error by "
                         f"{worst:.1e} at worst")
    else:
        cap.grad_kind = GRAD_ADAM_SIGN
        cap.notes.append(f"infinitrain trains {family.title} with Adam, whose first step moves every weight by "
                         f"~lr·sign(g): only each gradient's sign is recoverable (lr {lr:g}); magnitudes are not")
    cap.meta = {"recovery_lr": lr, "weights_after_step": str(params_path), "log": record.source}
    return cap
