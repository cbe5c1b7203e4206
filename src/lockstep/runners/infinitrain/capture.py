"""Step 1 of an InfiniTrain build, seen from what it can show: the `infinitrain` runner's capture.

InfiniTrain has no gradient dump, but it saves its weights (`--save`): one step at a chosen lr
from the case's weights w0 gives w1, and the update w0 - w1 says what the gradient was.

- SGD without momentum moves every weight by exactly lr·g, rounded once when w1 is stored in
  FP32. With lr a power of two, lr·g is exact, and the only error of g = (w0 - w1)/lr is w1's
  rounding: |error| <= ulp(w1)/2 / lr, a relative error of 2^-24·|w1|/(lr·|g|) -- about 6e-8
  once lr·|g| dominates |w0|. `sgd_recovery_lr` picks that lr from a reference's gradient norms
  (or a large default); `grad_precision` states the bound reached per tensor.
- Adam's first step (m̂ = g, v̂ = g², bias-corrected) moves a weight by lr·g/(|g| + eps): at lr 1
  the update u = g/(|g| + eps) itself is recovered (to w1's rounding, ~1e-7), which is what the
  reference's gradient is compared through: its sign where |g| >> eps, its size below that. The
  magnitude of a large gradient is gone.

The same step dumps every module's output and the gradient arriving at it (`--precision_check`,
precision_check.py); step 1's forward is before the update, so the large lr does not touch it.

A LoRA case starts from the case's weights and lockstep's LoRA init (its `--lora_load_path`,
lora.py); InfiniTrain's model.ckpt holds both the base and the adapters, so the same recovery
gives each adapter's gradient, and the base's, which is exactly zero where the base stayed frozen
(certify/lora.py names any that moved). From the reference's state after step N (`lockstep
diagnose --at-step N`, at_step.py) the launch resumes from that state written as its own step
folder and trains step N+1 at the recovery lr; for SGD the recovered gradient is also the update
it applied (`applied/`, per unit lr).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
from pathlib import Path

import numpy as np

from lockstep.capture.request import CaptureBuilder, CaptureRequest, update_values
from lockstep.cases.spec import CaseSpec
from lockstep.errors import RunError
from lockstep.formats.infinitrain_checkpoint import OPTIMIZER_FILE
from lockstep.formats.step_capture import (GRAD_ADAM_MOMENT, GRAD_ADAM_UPDATE, GRAD_SGD_RECOVERED, StepCapture,
                                          forward_rank)
from lockstep.models import load_checkpoint
from lockstep.models.family import split_canonical

HEADROOM = 2.0 ** 10  # lr·|g| at least this many times |w|, for most tensors' typical elements
DEFAULT_SGD_RECOVERY_LR = 2.0 ** 24  # without a reference's gradient norms (GPT-2 124M needs 2^22)
ADAM_RECOVERY_LR = 1.0  # Adam moves each weight by ~lr·sign(g): 1.0 dominates every initial weight
# What a capture asks of the runner's launch, as RunInputs.extra keys (runner.py reads them):
# a directory for InfiniTrain's module-output dumps (`--precision_check`; also `lockstep diagnose`),
PRECISION_CHECK_DIR = "infinitrain_precision_check_dir"
# and to leave the weights InfiniTrain saved after the last step as its model.ckpt (meta
# "infinitrain_save") instead of a second copy as `<case>.final.npz` (a capture reads it once).
KEEP_SAVE = "infinitrain_keep_save"


def sgd_recovery_lr(weight_rms: dict[str, float], grad_rms: dict[str, float]) -> float:
    """A power of two lr with lr·rms(g) >= 2^10·rms(w) for every tensor that has a gradient."""
    need = 1.0
    for name, g_rms in grad_rms.items():
        if g_rms == 0.0 or name not in weight_rms:
            continue
        need = max(need, HEADROOM * max(weight_rms[name], 1e-3) / g_rms)
    return float(2.0 ** math.ceil(math.log2(need)))


def rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64)))) if np.size(a) else 0.0


def reference_grad_rms(path: str) -> dict[str, float]:
    """Each gradient's RMS from a reference capture (exact norms are stored beside every sketch)."""
    ref = StepCapture.load(path)
    out = {}
    for name in ref.names("grad"):
        s = ref.sketch("grad", name)
        if s is not None:
            out[name] = s.norm / math.sqrt(max(s.numel, 1))
        else:
            out[name] = rms(ref.grads[name])
    return out


def sgd_lr_for(reference: str | None, w0: dict[str, np.ndarray]) -> float:
    """The SGD recovery lr: the reference's own where it recovered its gradients this way too (another
    InfiniTrain build: two recoveries at one lr round alike, so identical builds give identical
    captures, as `--expect identical` needs), else one from the reference's gradient sizes."""
    if not reference:
        return DEFAULT_SGD_RECOVERY_LR
    ref = StepCapture.load(reference)
    if ref.grad_kind == GRAD_SGD_RECOVERED and ref.meta.get("recovery_lr"):
        return float(ref.meta["recovery_lr"])
    return sgd_recovery_lr({n: rms(w) for n, w in w0.items()}, reference_grad_rms(reference))


def recover_sgd(w0: np.ndarray, w1: np.ndarray, lr: float) -> tuple[np.ndarray, float]:
    """g = (w0 - w1)/lr, and the bound on ||error||/||g|| that w1's FP32 rounding allows."""
    g = (np.asarray(w0, dtype=np.float64) - np.asarray(w1, dtype=np.float64)) / lr
    g_norm = float(np.linalg.norm(g.ravel()))
    bound = 2.0 ** -24 * float(np.linalg.norm(np.asarray(w1, dtype=np.float64).ravel())) / lr
    return g.astype(np.float32), (bound / g_norm if g_norm > 0 else 0.0)


def recover_adam_update(w0: np.ndarray, w1: np.ndarray, lr: float = ADAM_RECOVERY_LR) -> np.ndarray:
    """u = (w0 - w1)/lr after Adam's first step, g/(|g| + eps) (0 where the weight did not move), as
    `adam_update_sign` keeps it: the sign where it is saturated, 0 below, a ramp between (int8,
    `update_signs`)."""
    from lockstep.capture.request import adam_update_sign, on_gpu_if_large, to_gpu, update_signs

    d0 = on_gpu_if_large(w0)
    if d0 is not w0:  # large, and room on the GPU: both go there (FP32 across), the same FP64 arithmetic
        import torch

        moved = d0.to(torch.float64) - to_gpu(w1).to(torch.float64)
    else:
        moved = np.asarray(w0, dtype=np.float64) - np.asarray(w1, dtype=np.float64)
    return update_signs(adam_update_sign(moved / lr))


def capture_step(runner, case: CaseSpec, inputs, work_dir: Path, request: CaptureRequest) -> StepCapture:
    """One InfiniTrain step at a recovery lr, saved; the gradients recovered from the weights; the
    module outputs from its own dumps of the same first micro batch (or of its first `rows`
    sequences only, from a launch of that micro batch alone, when the case's is larger: the dumps
    of a whole micro batch of a 1B model are ~18 GB)."""
    return launch_step(runner, case, inputs, work_dir, request)()


def launch_step(runner, case: CaseSpec, inputs, work_dir: Path, request: CaptureRequest):
    """`capture_step`'s launches of InfiniTrain (and the reading of its dumps, removed before the
    next launch); returns what finishes the capture from its saved weights, which starts no process
    (a diagnose runs it beside InfiniTrain's drift launches)."""

    work_dir = Path(work_dir)
    # A saving case's step 1 is the plain case's: the capture's own launches save only for themselves.
    case = dataclasses.replace(case, checkpoint=None)
    family = inputs.family
    start = request.start_step if request.start_state is not None else 0
    w0 = initial_weights(case, inputs, request)
    sgd = family.optimizer.kind == "sgd"
    if sgd:
        lr = sgd_lr_for(request.reference, w0)
    else:
        lr = ADAM_RECOVERY_LR
    at = f"_step{start + 1}" if start else ""
    # The recovery step trains at its own lr, so no schedule (a warm-up from 0 would move nothing).
    step_case = dataclasses.replace(case, steps=1, lr=lr, name=f"{case.name}{at}_recovery_lr{lr:g}", lr_schedule=None)
    rows = request.rows
    # The dumps come from the recovery step itself, or from one micro batch of `rows` sequences (the
    # same first sequences: a sequence's forward does not depend on the others in its batch).
    small = rows is not None and case.micro_batch > rows
    dump_case = (case.first_steps(1, micro_batch=rows, total_batch=rows * case.seq_len, dp=1,
                                  name=f"{case.name}{at}_first{rows}") if small else step_case)
    states = []  # the reference's state written for each launch (at_step.py), removed once launched
    before = None  # Adam from a state: (InfiniTrain's parameter order, the reference's first moments at step N)
    if start:
        from lockstep.runners.infinitrain.at_step import adam_state, resumed, write_reference_state

        step_case = resumed(step_case, start)
        dump_case = resumed(dump_case, start) if small else step_case
        optimizer_state = None
        if not sgd:
            state = start_state(request, case, inputs)
            order = probe_parameter_order(runner, case, inputs, work_dir)
            optimizer_state = adam_state(order, state.exp_avg, state.exp_avg_sq,
                                         state.adam_step if state.adam_step is not None else start)
            # the moments InfiniTrain loads: the file written for it (a wrong one shows in its update, not its gradient)
            before = (order, {name: optimizer_state[f"adam.m.{i}"] for i, name in enumerate(order)})
        for launch in ([step_case, dump_case] if small else [step_case]):
            # beside the launch's log (FrameworkRunner.run logs into <work_dir>/<runner>/), where its --load looks
            states.append(write_reference_state(w0, start, launch, inputs, work_dir / runner.name, case.total_batch,
                                                optimizer=optimizer_state).parent)
    try:
        finish = _launch(runner, case, inputs, work_dir, request, w0, lr, sgd, step_case, dump_case, small, before)
    finally:
        for folder in states:
            shutil.rmtree(folder, ignore_errors=True)
    return finish


def start_state(request: CaptureRequest, case: CaseSpec, inputs):
    """The reference's saved state the request starts from, under canonical names (its declared service)."""
    from lockstep.runners.reference import SavedState, reference_services

    return reference_services().read_state(SavedState(request.start_step, Path(request.start_state)), case, inputs)


def initial_weights(case: CaseSpec, inputs, request: CaptureRequest) -> dict[str, np.ndarray]:
    """The weights the recovery step starts from, canonical names: the case's init (and its LoRA
    init, the one the launch loads: `lora_A.qkvw[0]`), or the reference's after step N."""
    if request.start_state is not None:
        return start_state(request, case, inputs).weights
    ckpt = load_checkpoint(inputs.checkpoint)
    w0 = split_canonical(ckpt.tensors, ckpt.config)
    if case.lora is not None:
        from lockstep.models.lora import lora_init_tensors

        w0 |= lora_init_tensors(inputs.model.family, inputs.model, case.lora, inputs.lora_seed)
    return w0


def _launch(runner, case: CaseSpec, inputs, work_dir: Path, request: CaptureRequest, w0: dict, lr: float, sgd: bool,
            step_case: CaseSpec, dump_case: CaseSpec, small: bool, before=None):
    from lockstep.runners.infinitrain.precision_check import UNSUPPORTED_MARK, read_module_outputs

    family = inputs.family
    rows = request.rows
    check_dir = (work_dir / f"infinitrain_{case.name}_module_outputs").resolve()
    shutil.rmtree(check_dir, ignore_errors=True)
    plain = dataclasses.replace(inputs, capture=None)
    dumping = dataclasses.replace(plain, extra={**inputs.extra, PRECISION_CHECK_DIR: str(check_dir)})
    forward_note = ""
    dumped = runner.run(dump_case, dumping if small else _saving(dumping, KEEP_SAVE), work_dir)
    if not dumped.ok and "unknown command line flag" in (dumped.error or "") and UNSUPPORTED_MARK in dumped.error:
        forward_note = ("this InfiniTrain build has no --precision_check, so no module outputs: its forward is "
                        "judged from the step-1 loss and the gradients")
        dumped = None if small else runner.run(step_case, _saving(plain, KEEP_SAVE), work_dir)
    elif not dumped.ok:
        raise RunError(f"InfiniTrain's step-1 capture failed: {dumped.error}")
    builder = CaptureBuilder(dataclasses.replace(request, adam_eps=None, whole_grads=True), runner.name)
    cap = builder.capture
    forward = read_module_outputs(check_dir)
    for name, value in forward.items():
        builder.add("fwd", name, value)
    if case.pp == 1:
        # The dumps' backward is of the mean over their own micro batch; the reference's of the case's
        # first micro batch's mean / accum: scale to it.
        scale = (dump_case.micro_batch * dump_case.accum) / (case.micro_batch * case.accum)
        for name, value in read_module_outputs(check_dir, stage="backward").items():
            builder.add("outgrad", name, value * np.float32(scale) if scale != 1 else value)
    shutil.rmtree(check_dir, ignore_errors=True)  # every activation and its gradient: read now
    cap.forward_order = sorted(forward, key=forward_rank)  # its dumps come in file-name order
    if forward_note:
        cap.notes.append(forward_note)
    elif forward:
        cap.notes.append("infinitrain module outputs: its own --precision_check dumps of rank 0's first micro batch"
                         + (f" (its first {rows} sequences, from a launch of those alone)" if small else "")
                         + f" ({len(forward)} modules)")
    record = dumped if (dumped is not None and not small) else runner.run(step_case, _saving(plain, KEEP_SAVE), work_dir)
    if not record.ok:
        raise RunError(f"InfiniTrain's recovery step failed: {record.error}")
    saved_path = Path(record.meta["infinitrain_save"])
    cap.loss = record.steps[0].loss
    cap.meta = {"recovery_lr": lr, "log": record.source, "case": case.to_dict()}
    applied_step = request.step if request.start_state is not None else None
    return lambda: _recover(builder, w0, saved_path, lr, sgd, family, inputs.model, applied_step, before)


# m = fp32((1 - beta1)·g) after one step from m = 0: g = m / (1 - beta1) within m's rounding (2^-24), and
# the division's own (FP64, then FP32).
MOMENT_PRECISION = 1.2e-7
PAIRING_SAMPLE = 4096  # elements of each tensor the moments are first paired on
PAIRING_LIMIT = 1e-3  # |u(m) - (w0 - w1)/lr| for the pair: FP32's rounding of w1 at lr 1 (~1e-7), a sign flip is ~1


def _one_minus_beta1(optimizer) -> float:
    """1 - beta1 as InfiniTrain's Adam kernel computes it, in FP32 (0.9f -> 0.100000024)."""
    return float(np.float32(1) - np.float32(optimizer.beta1))


def read_moments(opt_path: Path) -> dict[int, np.ndarray] | None:
    """The first moments `adam.m.<i>` of an InfiniTrain optimizer.ckpt, by index; None without the file."""
    from lockstep.formats.infinitrain_checkpoint import read_infinitrain_checkpoint

    if not opt_path.is_file():
        return None
    state = read_infinitrain_checkpoint(opt_path)
    return {int(k.rsplit(".", 1)[1]): a for k, a in state.items() if re.fullmatch(r"adam\.m\.\d+", k)} or None


def pair_moments(moments: dict[int, np.ndarray], w0: dict, w1: dict, lr: float, optimizer) -> dict[int, str] | None:
    """InfiniTrain's parameter order from its first Adam step: each `adam.m.<i>` paired with the canonical
    parameter of its shape that moved by the update it implies, lr·g/(|g| + eps) with g = m/(1 - beta1).
    Its state is indexed by its own parameter order (Module::Parameters walks hash maps). None when a moment
    pairs with no parameter. Tensors of zeros (LoRA A at step 1, a frozen parameter) pair with any zero move."""
    one_minus_beta1 = _one_minus_beta1(optimizer)
    by_shape: dict[tuple, list[str]] = {}
    for name, w in w0.items():
        by_shape.setdefault(tuple(np.shape(w)), []).append(name)

    def update(g: np.ndarray) -> np.ndarray:
        return g / (np.abs(g) + optimizer.eps)

    def moved(name: str, sample: slice) -> np.ndarray:
        return (np.asarray(w0[name], np.float64).reshape(-1)[sample] - np.asarray(w1[name], np.float64).reshape(-1)[sample]) / lr

    order: dict[int, str] = {}
    for i in sorted(moments):
        g = np.asarray(moments[i], np.float64).reshape(-1) / one_minus_beta1
        head = slice(0, PAIRING_SAMPLE)
        taken = set(order.values())
        free = [n for n in by_shape.get(tuple(np.shape(moments[i])), []) if n not in taken and n in w1]
        scored = sorted((float(np.max(np.abs(update(g[head]) - moved(n, head)), initial=0.0)), n) for n in free)
        if not scored or scored[0][0] > PAIRING_LIMIT:
            return None
        name = scored[0][1]
        if float(np.max(np.abs(update(g) - moved(name, slice(None))), initial=0.0)) > PAIRING_LIMIT:
            return None
        order[i] = name
    return order


def moment_gradients(opt_path: Path, w0: dict, w1: dict, lr: float, optimizer) -> dict[str, np.ndarray] | None:
    """The gradients of InfiniTrain's first Adam step from the optimizer state it saved, canonical names:
    g = m/(1 - beta1) of each `adam.m.<i>`, paired with its parameter (`pair_moments`). None when there is
    no such file or a moment pairs with no parameter (the capture then compares the update's saturation,
    as without a saved state). A parameter without a moment (frozen) has a gradient of zeros."""
    moments = read_moments(opt_path)
    order = pair_moments(moments, w0, w1, lr, optimizer) if moments else None
    if order is None:
        return None
    return {name: (np.asarray(moments[i], np.float64) / _one_minus_beta1(optimizer)).astype(np.float32)
            for i, name in order.items()}


def moments_step_gradient(m_after: np.ndarray, m_before: np.ndarray, optimizer) -> tuple[np.ndarray, float]:
    """Step N+1's gradient from the first moment before it (loaded) and after it (saved): m' = beta1·m +
    (1 - beta1)·g in FP32, so g = (m' - beta1·m)/(1 - beta1); and the bound on ||error||/||g|| that the
    FP32 rounding of m' and of beta1·m allows (cancellation makes it larger than a first step's)."""
    beta1 = float(np.float32(optimizer.beta1))
    after, before = np.asarray(m_after, np.float64), np.asarray(m_before, np.float64)
    g = (after - beta1 * before) / _one_minus_beta1(optimizer)
    g_norm = float(np.linalg.norm(g.ravel()))
    bound = 2.0 ** -24 * (float(np.linalg.norm(after.ravel())) + beta1 * float(np.linalg.norm(before.ravel())))
    bound = 2 * bound / _one_minus_beta1(optimizer)
    return g.astype(np.float32), (bound / g_norm if g_norm > 0 else 0.0)


def probe_parameter_order(runner, case: CaseSpec, inputs, work_dir: Path) -> list[str]:
    """InfiniTrain's parameter order (canonical names, optimizer.ckpt's index order), from one Adam step of
    the case's own init that it saved with its optimizer state (`pair_moments`); its folder removed."""
    plain = dataclasses.replace(inputs, capture=None)
    probe = dataclasses.replace(case, steps=1, lr=ADAM_RECOVERY_LR, name=f"{case.name}_parameter_order",
                                lr_schedule=None)
    record = runner.run(probe, _saving(plain, KEEP_SAVE), work_dir)
    if not record.ok:
        raise RunError(f"InfiniTrain's parameter-order step failed: {record.error}")
    saved_path = Path(record.meta["infinitrain_save"])
    try:
        ckpt = load_checkpoint(inputs.checkpoint)
        w0 = split_canonical(ckpt.tensors, ckpt.config)
        w1 = saved_weights(saved_path, inputs.family, inputs.model)
        moments = read_moments(saved_path.with_name(OPTIMIZER_FILE))
        order = pair_moments(moments, w0, w1, ADAM_RECOVERY_LR, inputs.family.optimizer) if moments else None
    finally:
        shutil.rmtree(saved_path.parent.parent, ignore_errors=True)
    if order is None or sorted(order) != list(range(len(order))) or set(order.values()) != set(w0):
        raise RunError("InfiniTrain's parameter order could not be learnt from its saved optimizer state "
                       f"({saved_path.with_name(OPTIMIZER_FILE)}): a moment pairs with no parameter")
    return [order[i] for i in range(len(order))]


def saved_weights(saved_path: Path, family, model) -> dict[str, np.ndarray]:
    """InfiniTrain's model.ckpt under canonical names: the base's LLMC names and a LoRA case's
    adapters' (`lora_A.qkvw[0]`, lora.py)."""
    from lockstep.formats.infinitrain_checkpoint import read_infinitrain_checkpoint
    from lockstep.runners.infinitrain.families import adapter_for
    from lockstep.runners.infinitrain.lora import canonical_adapters

    saved = read_infinitrain_checkpoint(saved_path)
    return adapter_for(family.name).canonical_state(saved, model) | canonical_adapters(saved)


def _recover(builder: CaptureBuilder, w0: dict, saved_path: Path, lr: float, sgd: bool, family, model,
             applied_step: int | None = None, before=None) -> StepCapture:
    """The gradients (SGD) or Adam update signs recovered from InfiniTrain's saved weights, tensor by
    tensor, and the capture written; from a saved state (`applied_step`, SGD) the same gradients as
    the update applied per unit lr."""
    from lockstep.capture.request import make_sketch
    from lockstep.formats.step_capture import APPLIED

    cap = builder.capture
    # Its own checkpoint, memory-mapped, its file removed at once: its space is freed as its last
    # tensor is let go, before the capture is written, so the disk never holds w1 twice.
    w1 = saved_weights(saved_path, family, model)
    optimizer_file = saved_path.with_name(OPTIMIZER_FILE)
    moments = None if sgd or applied_step is not None else moment_gradients(optimizer_file, w0, w1, lr,
                                                                            family.optimizer)
    stepped = None if sgd or applied_step is None else _stepped_gradients(optimizer_file, applied_step, before,
                                                                          family)
    shutil.rmtree(saved_path.parent.parent, ignore_errors=True)  # <case>.save/ (lockstep's own)
    applied_precision = {}
    for name, before_w in w0.items():
        if name not in w1:
            raise RunError(f"{saved_path}: InfiniTrain's checkpoint has no tensor for {name}")
        after = w1.pop(name)
        applied = None
        if sgd:
            g, cap.grad_precision[name] = recover_sgd(before_w, after, lr)
            applied, applied_precision[name] = g, cap.grad_precision[name]  # SGD's update is the gradient
        elif stepped is not None:
            g, cap.grad_precision[name] = stepped.pop(name)
            applied, applied_precision[name] = recover_sgd(before_w, after, lr)  # the update per unit lr
        elif moments is not None:
            g, cap.grad_precision[name] = moments.pop(name, np.zeros_like(before_w)), MOMENT_PRECISION
        else:
            g = recover_adam_update(before_w, after, lr)
        builder.add("grad", name, g)
        if applied_step is not None:
            cap.sketches[f"{APPLIED}/{name}"] = make_sketch(update_values(applied))
    if applied_step is not None:
        cap.meta[APPLIED] = {"step": applied_step, "lr": lr, "precision": applied_precision}
    cap.grad_kind, note = _recovery_note(cap, lr, sgd, stepped is not None, moments is not None, applied_step, family)
    cap.notes.append(note)
    del w1
    return builder.finish()


def _stepped_gradients(optimizer_file: Path, applied_step: int, before, family) -> dict:
    """Adam from a state: step N+1's gradients from the first moments it loaded (`before`: its parameter
    order and moments) and saved."""
    order, m_before = before
    saved_m = read_moments(optimizer_file)
    if saved_m is None or sorted(saved_m) != list(range(len(order))):
        raise RunError(f"{optimizer_file}: InfiniTrain saved no first moment of each of its "
                       f"{len(order)} parameters after step {applied_step}")
    return {name: moments_step_gradient(saved_m[i], m_before[name], family.optimizer) for i, name in enumerate(order)}


def _recovery_note(cap, lr: float, sgd: bool, stepped: bool, moments: bool, applied_step: int | None,
                   family) -> tuple[str, str]:
    """(the capture's gradient kind, the note that says how its gradients were recovered and how precisely)."""
    worst = max(cap.grad_precision.values(), default=0.0)
    if sgd:
        return GRAD_SGD_RECOVERED, (
            f"infinitrain gradients recovered as (w0 - w1)/lr from one SGD step at lr {lr:g} (2^"
            f"{int(np.log2(lr))}); w1's FP32 rounding bounds each tensor's relative error by {worst:.1e} at worst")
    if stepped:
        return GRAD_ADAM_MOMENT, (
            f"infinitrain's step {applied_step} from the reference's Adam state (its moments written in "
            "its own parameter order, learnt from a probe step): gradients recovered as (m' - beta1·m)/"
            f"(1 - beta1) of the moments it loaded and saved, within {worst:.1e} relative (FP32 rounding), "
            f"and the update it applied as (w_before - w_after)/lr at lr {lr:g}")
    if moments:
        return GRAD_ADAM_MOMENT, (
            f"infinitrain gradients recovered as m/(1 - beta1) from the first moment its Adam step "
            f"saved (optimizer.ckpt, its moments paired with its parameters by the update each moved "
            f"them by); m's FP32 rounding bounds each element's relative error by {MOMENT_PRECISION:.1e}")
    return GRAD_ADAM_UPDATE, (
        f"infinitrain trains {family.title} with Adam, whose first step moves every weight by "
        f"lr·g/(|g| + eps): its update direction is recovered (lr {lr:g}) and compared with the "
        "reference's; a large gradient's magnitude is not recoverable (no optimizer state saved)")


def _saving(inputs, keep_key: str):
    """The inputs of the recovery step: its weights saved after the step, kept as InfiniTrain wrote them."""
    return dataclasses.replace(inputs, save_final_params=True, extra={**inputs.extra, keep_key: True})
