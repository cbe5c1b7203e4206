"""A LoRA case's own findings (docs/reference/lora.md): what only the adapters and the frozen base
can show at step 1, each named before the generic findings it explains.

At step 1 the contract's B is zero, so the forward is the base model's, A's gradient is zero
(it is scale · Bᵀ g xᵀ) and B's is scale · g (A x)ᵀ; every base parameter is frozen, its gradient
zero. That makes four defects recognisable from the captures alone:
- *LoRA on other modules*: the two sides adapt different linears (their adapters' names differ);
- *LoRA B not zero at the start*: one side's lora_A gradients are not zero while the other's are
  (only a nonzero B gives A a gradient at step 1);
- *LoRA scale differs*: every lora_B gradient of one side is the same multiple of the other's,
  cosine 1 (the branch's scale, alpha / rank, differs: alpha instead of alpha/rank is a factor rank);
- *frozen parameter trained*: a base parameter receives a gradient on one side (the contract
  freezes everything but the adapters), named tensor by tensor, layers grouped.
"""

from __future__ import annotations

import re

import numpy as np

from lockstep.cases.lora_targets import LINEAR_OF, is_lora_name, parse_lora_name
from lockstep.cases.spec import CaseSpec
from lockstep.certify.classify import BACKWARD_INPUT, GRADIENT_ONLY, Finding, differs
from lockstep.certify.tensors import TensorDiff
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE, StepCapture

LORA_MODULES = "LoRA on other modules"
LORA_B_NOT_ZERO = "LoRA B not zero at the start"
LORA_SCALE = "LoRA scale differs"
FROZEN_TRAINED = "frozen parameter trained"
LORA_KINDS = (LORA_MODULES, LORA_B_NOT_ZERO, LORA_SCALE, FROZEN_TRAINED)
SAME_RATIO = 1e-3  # lora_B gradients whose norm ratios agree this closely are one scale factor
ZERO_NORM = 0.0  # a gradient is zero when its norm is exactly 0 (a frozen tensor, or A under B = 0)


def grad_norm(cap: StepCapture, name: str) -> float | None:
    store = cap.store("grad")
    if name in store:
        return float(np.linalg.norm(np.asarray(store[name], dtype=np.float64)))
    s = cap.sketch("grad", name)
    return s.norm if s is not None else None


def _span(layers: list[int]) -> str:
    layers = sorted(layers)
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def grouped(names: list[str]) -> str:
    """`ln1w[0]`, `ln1w[1]`, `wte` -> `ln1w[0..1], wte` (one tensor of several layers named once)."""
    groups: dict[str, list[int]] = {}
    for n in names:
        m = re.match(r"^(.*)\[(\d+)\]$", n)
        if m:
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            groups.setdefault(n, [])
    return ", ".join(f"{base}[{_span(layers)}]" if layers else base for base, layers in groups.items())


def _modules(names: list[str]) -> str:
    """Adapter names -> the linears they adapt: `qkvw[0..1] (attn.c_attn)`."""
    by_base: dict[str, list[int]] = {}
    for n in names:
        parsed = parse_lora_name(n)
        if parsed and parsed[0] == "lora_A":
            by_base.setdefault(parsed[1], []).append(parsed[2])
    return ", ".join(f"{base}[{_span(layers)}] ({LINEAR_OF.get(base, base)})" for base, layers in by_base.items()) or "nothing"


def add_lora_findings(findings: list[Finding], ref: StepCapture, test: StepCapture, case: CaseSpec,
                      grads: list[TensorDiff], tol: float) -> list[Finding]:
    """The LoRA findings first, then the generic ones they do not explain (a gradient-only finding
    of a tensor a LoRA finding names is that finding, said again)."""
    if case.lora is None:
        return findings
    sides = (f"the reference ({ref.framework})", test.framework)
    lora = _module_findings(ref, test, case, sides)
    if test.grad_kind != GRAD_ADAM_UPDATE:  # Adam's update signs carry no norm
        lora += _b_not_zero_findings(ref, test, sides)
        if not any(f.kind == LORA_B_NOT_ZERO for f in lora):
            lora += _scale_findings(ref, test, case, grads, tol, sides)
        lora += _frozen_trained_findings(ref, test, sides)
    if not lora:
        return findings
    explained = {t for f in lora if f.kind != LORA_MODULES for t in _explained_by(f)}
    rest = [f for f in findings
            if not (f.kind in (GRADIENT_ONLY, BACKWARD_INPUT) and set(f.tensors or (f.where,)) <= explained)]
    return lora + rest


def _explained_by(f: Finding) -> tuple[str, ...]:
    """The gradients a LoRA finding accounts for (B-not-zero: the A gradients it gives rise to)."""
    if f.kind == LORA_B_NOT_ZERO:
        return tuple(n.replace("lora_B", "lora_A", 1) for n in f.tensors)
    return tuple(f.tensors)


def _lora_names(capture: StepCapture) -> list[str]:
    return [n for n in capture.names("grad") if is_lora_name(n)]


def _module_findings(ref: StepCapture, test: StepCapture, case: CaseSpec, sides: tuple[str, str]) -> list[Finding]:
    """Adapters on other modules on the two sides."""
    r_side, t_side = sides
    r_names, t_names = _lora_names(ref), _lora_names(test)
    if set(r_names) == set(t_names):
        return []
    only_t = [n for n in t_names if n not in set(r_names)]
    only_r = [n for n in r_names if n not in set(t_names)]
    return [Finding(LORA_MODULES, _modules(only_t or only_r).split(" (")[0],
                    f"LoRA on other modules: {t_side} adapts {_modules(only_t)} where {r_side} adapts "
                    f"{_modules(only_r)} (targets {', '.join(case.lora.target_modules)}; InfiniTrain's suffix "
                    "rule, docs/reference/lora.md)", tensors=tuple(only_t + only_r))]


def _b_not_zero_findings(ref: StepCapture, test: StepCapture, sides: tuple[str, str]) -> list[Finding]:
    """lora_A gradients at step 1 on one side only: that side's B did not start at zero."""
    r_side, t_side = sides
    t_names = set(_lora_names(test))
    a_names = [n for n in _lora_names(ref) if n in t_names and n.startswith("lora_A")]
    norms = {n: (grad_norm(ref, n), grad_norm(test, n)) for n in a_names}
    for side, other, k in ((t_side, r_side, 1), (r_side, t_side, 0)):
        nonzero = [n for n, v in norms.items() if v[k] is not None and v[k] > ZERO_NORM and v[1 - k] == ZERO_NORM]
        if nonzero:
            bs = [n.replace("lora_A", "lora_B", 1) for n in nonzero]
            return [Finding(LORA_B_NOT_ZERO, grouped(bs),
                            f"LoRA B not zero at the start: {side}'s lora_A gradients are not zero at step 1 "
                            f"({grouped(nonzero)}, norm up to {max(norms[n][k] for n in nonzero):.2e}) while "
                            f"{other}'s are: only a nonzero B ({grouped(bs)}) gives A a gradient at step 1, and "
                            "the contract starts every B at zero", tensors=tuple(bs))]
    return []


def _scale_findings(ref: StepCapture, test: StepCapture, case: CaseSpec, grads: list[TensorDiff], tol: float,
                    sides: tuple[str, str]) -> list[Finding]:
    """One factor k on every lora_B gradient: the exact norms' ratios agree, and each tensor differs by
    |k - 1| of its norm (the sketches' relative error and cosine are estimates to a few percent)."""
    r_side, t_side = sides
    by_name = {d.name: d for d in grads}
    b_diffs = [by_name[n] for n in _lora_names(ref) if n.startswith("lora_B") and n in by_name]
    wrong_b = [d for d in b_diffs if differs(d, tol)]
    if not wrong_b or len(wrong_b) != len(b_diffs):
        return []
    ratios = [(grad_norm(test, d.name) or 0.0) / d.ref_norm for d in wrong_b if d.ref_norm > 0]
    if not (len(ratios) == len(wrong_b) and max(ratios) - min(ratios) <= SAME_RATIO * max(ratios)
            and all(abs(d.rel - abs(k - 1)) <= (0.1 if d.sketched else 1e-3) * abs(k - 1)
                    and d.cosine > (0.9 if d.sketched else 1 - 1e-5) for d, k in zip(wrong_b, ratios))):
        return []
    ratio = float(np.mean(ratios))
    rank = case.lora.rank
    why = ""
    if abs(ratio - rank) <= SAME_RATIO * rank:
        why = f": {t_side} scales by alpha ({case.lora.alpha:g}) instead of alpha/rank ({case.lora.scale:g})"
    elif abs(ratio * rank - 1) <= SAME_RATIO:
        why = f": {r_side} scales by alpha ({case.lora.alpha:g}) instead of alpha/rank ({case.lora.scale:g})"
    return [Finding(LORA_SCALE, grouped([d.name for d in wrong_b]),
                    f"LoRA scale differs: every lora_B gradient of {t_side} is {ratio:.4g}x "
                    f"{r_side}'s ({len(wrong_b)} tensors, the same direction)"
                    f"{why}; the contract's scale is alpha/rank = {case.lora.scale:g}",
                    tensors=tuple(d.name for d in wrong_b))]


def _frozen_trained_findings(ref: StepCapture, test: StepCapture, sides: tuple[str, str]) -> list[Finding]:
    """A base parameter with a gradient at step 1 on either side: a LoRA case trains only its adapters."""
    r_side, t_side = sides
    test_names = set(test.names("grad"))
    base = [n for n in ref.names("grad") if not is_lora_name(n) and n in test_names]
    out = []
    for side, cap in ((t_side, test), (r_side, ref)):
        trained = [n for n in base if (grad_norm(cap, n) or 0.0) > ZERO_NORM]
        if trained:
            worst = max(trained, key=lambda n: grad_norm(cap, n))
            out.append(Finding(FROZEN_TRAINED, grouped(trained),
                               f"frozen parameter trained: {side}'s {grouped(trained)} receive"
                               f"{'s' if len(trained) == 1 else ''} a gradient at step 1 (norm up to "
                               f"{grad_norm(cap, worst):.2e}, {worst}) though a LoRA case trains only its "
                               "adapters; every base parameter is frozen", tensors=tuple(trained)))
    return out
