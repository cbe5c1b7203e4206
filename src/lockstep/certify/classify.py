"""From tensor differences to findings: where two frameworks first part, and what kind of defect it is.

Rules, in order (each one line in the verdict):
1. *Forward at module X*: the first module output, in forward order, beyond the tolerance.
   Without forward outputs (InfiniTrain), the step-1 loss stands in for them.
2. *Tied weights not tied*: a tied tensor's gradient (GPT-2's wte) that equals the gradient of
   one of its uses alone (embedding or head) rather than their sum.
3. With the forward in agreement, gradients are walked in backward order (the reverse of the
   order the forward pass uses the parameters):
   - every gradient from some point on differs (>= 90% of them): the module just before that
     point in backward order hands a wrong *input gradient* upstream ("backward of X's input
     gradient", e.g. a LayerNorm backward with a spurious term); tensors far worse than the
     rest of that group (30x the median) are named on their own as in the next rule;
   - otherwise each differing gradient whose neighbours agree is *gradient of X only
     (backward kernel)*: a leaf computation (e.g. a bias gradient reduced along the wrong axis).
4. *Micro batches paired wrong*: micro batch 0's module outputs agree but a later micro batch's
   outputs or loss differ (from the first module that differs on it): the framework fed that micro
   batch the wrong input, labels or gradient (e.g. a pipeline's p2p exchange that swaps them).
5. *Optimizer update*: forward and gradients agree, but the update the optimizer applied differs
   (a capture that steps its optimizer from a saved state: diagnose --at-step), or the losses after
   step 1 part (drift). Where every tensor's applied update is one factor c of the expected, in
   the same direction, the step trained at c times the contract's lr of the step; when that is the
   contract's lr of another step, the finding is the *learning rate* of the step: the schedule is
   that many steps late or early (a warm-up one step late is the classic).
6. *Logging precision only*: forward and gradients agree, and the step-1 loss differs by no more
   than an FP32 sequential sum of the per-token losses can move the mean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from lockstep.certify.tensors import ADAM_UPDATE, TensorDiff, tie_diff
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE, StepCapture
from lockstep.step_contract import fp32_sequential_loss

# Relative tolerance of tensors, by dtype: FP32 frameworks that agree land near 1e-7..1e-6.
TENSOR_TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2}
ADAM_SIGN_SHARE = 1e-4  # share of a tensor's saturated Adam-update signs allowed to differ
BLOCK_SHARE = 0.9  # share of differing gradients upstream of a point that makes it one finding
OUTLIER_FACTOR = 30.0

FORWARD = "forward"
TIE = "tied weights not tied"
BACKWARD_INPUT = "input gradient of a module's backward"
GRADIENT_ONLY = "gradient only (backward kernel)"
DOWNSTREAM = "downstream of the forward difference"
MICRO_BATCH = "micro batches paired wrong"
OPTIMIZER = "optimizer update"
LR_SCHEDULE = "learning rate of the step"
LOGGING = "logging precision only"
NONE = "no divergence"
# Losses that part at the case's lr by no more than this many times what they part by with frozen
# weights are the logged loss's precision, not training (an update that differs grows with the lr).
FROZEN_FACTOR = 2.0


@dataclass(frozen=True)
class Finding:
    kind: str
    where: str  # the module or tensor named (`qkvb[0..11]` for one tensor of every layer)
    line: str  # the one-line classification people read
    tensors: tuple[str, ...] = ()  # every tensor the finding covers, when it is more than one

    def to_json(self) -> dict:
        return {"kind": self.kind, "where": self.where, "classification": self.line,
                **({"tensors": list(self.tensors)} if self.tensors else {})}


@dataclass
class LossCheck:
    ref: float | None
    test: float | None
    tolerance: float
    fp32_sum_shift: float | None = None  # how far an FP32 sequential loss sum moves the reference's mean

    @property
    def delta(self) -> float | None:
        if self.ref is None or self.test is None:
            return None
        return abs(self.test - self.ref)

    def to_json(self) -> dict:
        return {"reference": self.ref, "test": self.test, "abs_diff": self.delta, "threshold": self.tolerance,
                "fp32_sequential_sum_shift": self.fp32_sum_shift}


def module_of(tensor: str) -> str:
    """The canonical module a parameter belongs to: its LLMC name without the weight/bias letter
    (`qkvb[1]` -> `qkv[1]`, `ln2w[0]` -> `ln2[0]`, `fcw2[3]` -> `fc2[3]`); others unchanged."""
    m = re.match(r"^([a-z_0-9]*?[a-z0-9])(w|b)(\d?)((?:\[\d+\])*)$", tensor)
    if not m:
        return tensor
    return m.group(1) + m.group(3) + m.group(4)


def loss_check(ref: StepCapture, test: StepCapture, tolerance: float) -> LossCheck:
    check = LossCheck(ref.loss, test.loss, tolerance)
    if ref.token_losses is not None and ref.loss is not None:
        exact = float(np.mean(ref.token_losses.astype(np.float64)))
        check.fp32_sum_shift = abs(fp32_sequential_loss(ref.token_losses) - exact)
    return check


def allowance(d: TensorDiff, tol: float) -> float:
    """The relative error a tensor may have and still agree: the tolerance, or more where the test's
    recovery precision or FP32 rounding allows more (diagnose shows it beside each row)."""
    if d.kind == ADAM_UPDATE:
        # Saturations of Adam updates (±1 where saturated, 0 below, a ramp between: capture/request
        # adam_update_sign): n sign mismatches among N elements give a relative error of 1..2 x
        # sqrt(n/N); an element on the ramp moves by about its gradient's rounding only. A tensor
        # differs when more than ADAM_SIGN_SHARE of its elements would flip.
        return 2 * ADAM_SIGN_SHARE ** 0.5
    return max(tol, 10 * d.precision, d.rounding)


def differs(d: TensorDiff, tol: float) -> bool:
    """Whether a tensor differs beyond the tolerance, the test's recovery precision and FP32 rounding."""
    return d.rel > allowance(d, tol)


def classify(ref: StepCapture, test: StepCapture, forward: list[TensorDiff], grads: list[TensorDiff],
             tol: float, loss: LossCheck) -> list[Finding]:
    """Findings in the order a defect propagates: the first module whose output differs (then every
    gradient is downstream of it), a lost tie, the input gradient of the backward where every
    gradient upstream differs, single gradients; or the loss's logging precision alone."""
    findings = _forward_findings(forward, tol, loss)
    explained: set[str] = set()
    if test.grad_kind != GRAD_ADAM_UPDATE:
        tie = _tie_findings(ref, test, grads, tol)
        findings += tie
        explained = {f.where for f in tie}
    differing = [d for d in grads if d.name not in explained and differs(d, tol)]
    if findings and findings[0].kind == FORWARD:
        if differing:
            findings.append(Finding(DOWNSTREAM, findings[0].where,
                                    f"{len(differing)} of {len(grads)} gradients differ, as a forward difference "
                                    f"at {findings[0].where} makes them; fix the forward first"))
        return findings
    findings += _backward_findings(ref, grads, explained, differing, tol)
    if not findings and loss.delta is not None and loss.delta > loss.tolerance and _logging_explains(loss):
        findings.append(Finding(LOGGING, "loss",
                                f"logging precision only: forward and gradients agree; the step-1 loss differs by "
                                f"{loss.delta:.2e}, within what an FP32 sequential sum of the per-token losses "
                                f"moves the mean ({loss.fp32_sum_shift:.2e})"))
    return findings


def _forward_findings(forward: list[TensorDiff], tol: float, loss: LossCheck) -> list[Finding]:
    """The first module whose output differs, or the step-1 loss where the test shows no module outputs."""
    first_fwd = next((d for d in forward if differs(d, tol)), None)
    if first_fwd is not None:
        before = forward[: forward.index(first_fwd)]
        return [Finding(FORWARD, first_fwd.name,
                        f"forward at module {first_fwd.name}: its output differs (relative {first_fwd.rel:.2e}, "
                        + (f"max |Δ| {first_fwd.max_abs:.2e}) while " if first_fwd.max_abs is not None
                           else "from its sketch) while ") +
                        (f"all {len(before)} module outputs before it agree" if before else "it is the first module"))]
    if not forward and loss.delta is not None and loss.delta > loss.tolerance and not _logging_explains(loss):
        return [Finding(FORWARD, "loss", f"forward (judged from the step-1 loss, no module outputs on the test side): "
                                         f"|Δloss| {loss.delta:.2e} > {loss.tolerance:.0e}")]
    return []


def _tie_findings(ref: StepCapture, test: StepCapture, grads: list[TensorDiff], tol: float) -> list[Finding]:
    """A tied weight whose gradient is one use's part alone: the other use trains its own copy."""
    by_name = {d.name: d for d in grads}
    out = []
    for name in ref.names("tie"):
        d = by_name.get(name)
        if d is None or not differs(d, tol):
            continue
        as_emb, as_head = tie_diff(ref, test, name)
        if min(as_emb, as_head) < d.rel / 10:
            use = "embedding lookup" if as_emb <= as_head else "output head"
            other = "output head" if use == "embedding lookup" else "embedding lookup"
            out.append(Finding(TIE, name, f"tied weights not tied: {name}'s gradient is its {use}'s alone (relative "
                                          f"{min(as_emb, as_head):.1e} to that part, {d.rel:.2e} to the tied sum); the "
                                          f"{other} trains its own copy"))
    return out


def _backward_findings(ref: StepCapture, grads: list[TensorDiff], explained: set[str], differing: list[TensorDiff],
                       tol: float) -> list[Finding]:
    """In backward order: where every gradient upstream differs, the input gradient of the backward
    just before it (and outliers among them); the other differing gradients one by one."""
    kind_of = ref.module_kind
    backward = [d for d in reversed(grads) if d.name not in explained]
    first = next((i for i, d in enumerate(backward) if differs(d, tol)), None)
    if first is None:
        return []
    upstream = backward[first:]
    wrong = [d for d in upstream if differs(d, tol)]
    if not (len(upstream) >= 3 and len(wrong) >= BLOCK_SHARE * len(upstream)):
        return _gradient_only_findings(differing, kind_of)
    median = float(np.median([d.rel for d in wrong]))
    if first > 0:
        last_ok = backward[first - 1].name
        module = module_of(last_ok)
        kind = kind_of.get(last_ok, "module")
        found = [Finding(BACKWARD_INPUT, module,
                         f"input gradient of {module}'s backward ({kind}): every gradient upstream of it "
                         f"differs ({len(wrong)} of {len(upstream)} tensors, median relative "
                         f"{median:.2e}) while {module}'s own and every later gradient agree")]
    else:
        found = [Finding(BACKWARD_INPUT, "loss", f"the backward from the loss on: every gradient differs (median "
                                                 f"relative {median:.2e}), including the output head's")]
    found += _gradient_only_findings([d for d in wrong if d.rel > OUTLIER_FACTOR * median], kind_of)
    upstream_names = {u.name for u in upstream}
    return found + _gradient_only_findings([d for d in differing if d.name not in upstream_names], kind_of)


def _logging_explains(loss: LossCheck) -> bool:
    return loss.fp32_sum_shift is not None and loss.delta is not None and loss.delta <= 2 * loss.fp32_sum_shift + 1e-7


def _gradient_only_findings(diffs: list[TensorDiff], kind_of: dict[str, str]) -> list[Finding]:
    """One finding per tensor, except that the same tensor of several layers (one kernel's defect,
    e.g. every c_attn bias) is one finding naming the layers, worst layer first."""
    groups: dict[str, list[TensorDiff]] = {}
    for d in diffs:
        groups.setdefault(re.sub(r"\[\d+\]$", "", d.name), []).append(d)
    out = []
    for base, members in groups.items():
        if len(members) == 1:
            out += [_gradient_only(d, kind_of) for d in members]
            continue
        layers = sorted(int(re.search(r"\[(\d+)\]$", d.name).group(1)) for d in members)
        span = (f"{layers[0]}..{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1))
                else ",".join(map(str, layers)))
        rel = [d.rel for d in members]
        cos = [d.cosine for d in members]
        kind = kind_of.get(members[0].name, "module")
        out.append(Finding(GRADIENT_ONLY, f"{base}[{span}]",
                           f"gradient of {base} only, in {len(members)} layers ({span}) (backward kernel of "
                           f"{module_of(base)}, {kind}): relative {min(rel):.2e} to {max(rel):.2e}, cosine "
                           f"{min(cos):.3f} to {max(cos):.3f}, while their neighbours agree",
                           tensors=tuple(d.name for d in members)))
    return out


def _gradient_only(d: TensorDiff, kind_of: dict[str, str]) -> Finding:
    module = module_of(d.name)
    if d.kind == ADAM_UPDATE:
        return Finding(GRADIENT_ONLY, d.name, f"gradient of {d.name} only: the signs of Adam's first update of it "
                                              f"differ (relative {d.rel:.2e}, cosine {d.cosine:.3f}; Adam's first "
                                              "step keeps only the sign of a gradient), while its neighbours agree")
    return Finding(GRADIENT_ONLY, d.name,
                   f"gradient of {d.name} only (backward kernel of {module}, {kind_of.get(d.name, 'module')}): relative "
                   f"{d.rel:.2e}, cosine {d.cosine:.3f}, while its neighbours agree")


def add_output_grad_findings(findings: list[Finding], forward: list, output_grads: list, tolerance: float,
                             grad_kind: str) -> list[Finding]:
    """The gradients arriving at module outputs, in backward order: where they first differ while the
    forward agrees, the backward of the module after that output passed on a wrong input gradient.

    Said only where the parameter gradients cannot say it as well: Adam's sign-only ones, none of
    the other rules found anything, or the only findings are gradient-only ones of tensors that the
    wrong gradient reaches. Those were not "gradient only": the gradient arriving at their module
    already differs. It happens where the parameters that would show the block are not compared -- a
    LoRA case's frozen base, whose A adapters are zero on both sides at step 1 -- and then the
    output gradient's finding comes first and the tensors it reaches are said to be downstream of it."""
    if not output_grads or any(differs(d, tolerance) for d in forward):
        return findings
    first = next((i for i, d in enumerate(output_grads) if differs(d, tolerance)), None)
    if first is None:
        return findings
    d = output_grads[first]
    upstream = [o.name for o in output_grads[first:]]
    inherited = [f for f in findings if f.kind == GRADIENT_ONLY
                 and all(_reached_by(t, d.name, upstream) for t in (f.tensors or (f.where,)))]
    others = [f for f in findings if f not in inherited]
    if others and grad_kind != GRAD_ADAM_UPDATE and any(f.kind != LOGGING for f in others):
        return findings
    producer = output_grads[first - 1].name if first > 0 else "the loss"
    later = "every later module's output" if first > 0 else "no later output (it is the logits')"
    found = Finding(BACKWARD_INPUT, producer,
                    f"input gradient of {producer}'s backward: the gradient arriving at {d.name}'s output "
                    f"differs (relative {d.rel:.2e}, cosine {d.cosine:.3f}) while it agrees at {later}")
    if not inherited:
        return findings + [found]
    tensors = tuple(t for f in inherited for t in (f.tensors or (f.where,)))
    return [found, Finding(DOWNSTREAM, producer,
                           f"{len(tensors)} parameter gradients differ downstream of it "
                           f"({', '.join(f.where for f in inherited)}), as a wrong gradient arriving at their "
                           "modules makes them; fix that backward first", tensors=tensors)] + others


def _layer(name: str) -> float:
    """A tensor's or module's layer: [k] -> k; the embedding before every layer, the rest (lnf, logits) after."""
    m = re.search(r"\[(\d+)\]$", name)
    if m:
        return int(m.group(1))
    return -1 if name.split(".")[-1].startswith(("embedding", "wte", "wpe")) else float("inf")


def _reached_by(tensor: str, output: str, upstream: list[str]) -> bool:
    """Whether a parameter's gradient is computed from the gradient arriving at `output` (so a
    difference there reaches it): its layer is below that output's, or in the same layer its module
    is one the gradient passes on to (`upstream`: that output and those before it in the forward); a
    layer's own output (`block[k]`) reaches every tensor of that layer."""
    layer, at = _layer(tensor), _layer(output)
    if layer < at or (layer == at and output.startswith("block[")):
        return True
    module = module_of(tensor.split(".", 1)[1] if tensor.startswith(("lora_A.", "lora_B.")) else tensor)
    return layer == at and module in upstream


def add_applied_findings(findings: list[Finding], applied: list[TensorDiff], tol: float,
                         step: int, lrs: tuple[float, ...] = ()) -> list[Finding]:
    """Rule 5 from the updates themselves: with the forward and the gradients of the step in
    agreement (no other finding that says the frameworks compute differently), the update each
    optimizer applied, tensor by tensor. Differences downstream of a forward or gradient finding
    are that finding's, and are not said again. `lrs`: the contract's lr of every step, to name an
    update scaled as a whole by another step's lr."""
    if not applied or any(f.kind not in (LOGGING,) for f in findings):
        return findings
    wrong = [d for d in applied if differs(d, tol)]
    if not wrong:
        return findings
    factor = uniform_factor(applied, tol) if len(wrong) == len(applied) else None
    if factor is not None:
        schedule = _schedule_finding(factor, applied, step, lrs)
        if schedule is not None:
            return findings + [schedule]
    worst = max(wrong, key=lambda d: d.rel)
    rels = sorted(d.rel for d in wrong)
    where = "every parameter" if len(wrong) == len(applied) else ", ".join(d.name for d in wrong[:6]) + (
        f" and {len(wrong) - 6} more" if len(wrong) > 6 else "")
    scaled = "" if factor is None else (
        f"; every update is {factor:.6g}x the expected, in its direction: an lr of {factor:.6g}x the step's, "
        "or a scalar of the optimizer's (Adam's bias correction)")
    return findings + [Finding(
        OPTIMIZER, "optimizer" if len(wrong) == len(applied) else wrong[0].name,
        f"optimizer update of step {step}: the forward and the gradients agree, but the update the optimizer "
        f"applied differs in {len(wrong)} of {len(applied)} tensors ({where}; relative {rels[0]:.2e} to "
        f"{rels[-1]:.2e}, worst {worst.name}, cosine {worst.cosine:.4f}): the optimizer's arithmetic or its "
        f"state (moments, step count, bias correction) differs{scaled}",
        tensors=tuple(d.name for d in wrong))]


def uniform_factor(diffs: list[TensorDiff], tol: float) -> float | None:
    """The one factor c with test = c * ref for every tensor, each within its own allowance (its
    direction the reference's and its norm ratio c's), or None."""
    scales = [d.scale for d in diffs]
    if not diffs or any(s is None for s in scales):
        return None
    factor = float(np.median(scales))
    for d, scale in zip(diffs, scales):
        room = allowance(d, tol)
        off_direction = np.sqrt(max(0.0, 1.0 - d.cosine ** 2)) * scale
        if off_direction > room or abs(scale - factor) > room * max(factor, 1.0):
            return None
    return factor


def _schedule_finding(factor: float, applied: list[TensorDiff], step: int, lrs: tuple[float, ...]) -> Finding | None:
    """A learning-rate finding when `factor` times the step's contract lr is the contract's lr of
    another step (the nearest such step)."""
    if not 1 <= step <= len(lrs) or lrs[step - 1] == 0:
        return None
    lr = lrs[step - 1]
    trained = factor * lr
    room = max(allowance(d, 0.0) for d in applied) * max(trained, lr) + 1e-12 * lr
    matches = [k for k, other in enumerate(lrs, 1) if k != step and abs(other - trained) <= room]
    if not matches:
        return None
    other = min(matches, key=lambda k: abs(k - step))
    off = step - other
    how = f"{abs(off)} step{'s' if abs(off) > 1 else ''} {'late' if off > 0 else 'early'}"
    return Finding(LR_SCHEDULE, "lr schedule",
                   f"learning rate of step {step}: forward and gradients agree, and every update the optimizer applied "
                   f"is {factor:.6g}x the expected ({len(applied)} of {len(applied)} tensors, one factor, each in its "
                   f"direction): step {step} trained at lr {trained:.6g}, the contract's lr of step {other}, not its own "
                   f"{lr:.6g}: the lr schedule runs {how}",
                   tensors=tuple(d.name for d in applied))


def add_drift_findings(findings: list[Finding], drift: list, loss_tolerance: float) -> list[Finding]:
    """Rule 4: forward and gradients agree, yet the losses after step 1 part at the case's lr -- the
    optimizer update, unless they part as much with frozen weights (lr 1e-12), where no update
    happens and only how each step's loss is computed and logged can differ."""
    if findings or not drift:
        return findings
    case_lr = drift[-1]
    later = [s for s in case_lr.steps if s.step > 1]
    worst = max(later, key=lambda s: s.abs_diff, default=None)
    if worst is None or worst.abs_diff <= loss_tolerance:
        return findings
    frozen = drift[0].max_abs_diff if drift[0] is not case_lr and drift[0].steps else None
    if frozen is not None and worst.abs_diff <= FROZEN_FACTOR * frozen:
        findings.append(Finding(LOGGING, "loss",
                                f"logging precision only: forward and step-1 gradients agree, and the losses differ "
                                f"as much with frozen weights (up to {frozen:.2e} at lr {drift[0].lr:g}) as at lr "
                                f"{case_lr.lr:g} (step {worst.step}: {worst.abs_diff:.2e}): each step's logged loss, "
                                "not the training, differs"))
        return findings
    findings.append(Finding(OPTIMIZER, "optimizer",
                            f"optimizer update: forward and step-1 gradients agree, but at lr {case_lr.lr:g} the "
                            f"loss of step {worst.step} differs by {worst.abs_diff:.2e}"
                            + (f" (frozen weights: {frozen:.2e})" if frozen is not None else "")))
    return findings


def _micro_batches(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"micro batch {ids[0]}"
    return "micro batches " + ", ".join(map(str, ids[:-1])) + f" and {ids[-1]}"


def add_micro_batch_findings(findings: list[Finding], forward: list[TensorDiff], micro_batches: dict,
                             tolerance: float) -> list[Finding]:
    """Rule 4: micro batch 0 agrees everywhere, a later micro batch does not. The first module
    that differs on it is named; that the first micro batch agrees says the modules are right and
    what they were handed is not."""
    if any(differs(d, tolerance) for d in forward):
        return findings
    for micro, diffs in micro_batches.items():
        first = next((d for d in diffs if differs(d, tolerance)), None)
        if first is None:
            continue
        module = first.name.split("@")[0]
        later = sorted(m for m, ds in micro_batches.items() if any(differs(d, tolerance) for d in ds))
        agree = [m for m in micro_batches if m < micro]
        return findings + [Finding(
            MICRO_BATCH, module,
            f"micro batches paired wrong: every module output of {_micro_batches([0, *agree])} agrees, but on micro "
            f"batch {micro} {module}'s {'value' if module == 'loss' else 'output'} differs "
            f"(relative {first.rel:.2e}) while every module before it agrees (micro batches "
            f"{', '.join(map(str, later))} differ): the framework handed those micro batches the wrong input, "
            "labels or incoming gradient (e.g. a pipeline exchange that swaps activations and gradients)")]
    return findings
