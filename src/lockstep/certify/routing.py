"""Mixture-of-experts routers compared: which tokens went to other experts, the routing weights of
the tokens that did not, and each layer's load-balancing (aux) loss; and the findings they make.

A routing difference is its own finding, not a rounding one: a token sent to another expert moves
its layer's output by O(1), however close the router logits that chose it. So the chosen experts
are compared exactly (as sets: the order among a token's k experts does not change its output),
and the finding says how many tokens moved and where, and whether the router logits agree (then
the top-k rule or its tie-break differs) or not (then the router's input or weight does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from lockstep.capture.routing import ROUTER, aux_loss_name, experts_name, weights_name
from lockstep.certify.classify import GRADIENT_ONLY, Finding, differs
from lockstep.certify.tensors import TensorDiff, tensor_diff
from lockstep.formats.step_capture import StepCapture

ROUTED = "tokens routed differently"
ROUTING_WEIGHTS = "routing weights differ"
AUX_LOSS = "aux loss differs"
ROUTING_KINDS = (ROUTED, ROUTING_WEIGHTS, AUX_LOSS)
SHOWN_POSITIONS = 6  # token positions a finding names before it says "..."

_EXPERT = re.compile(r"^expert(\d+)\.([a-z0-9_]+)\[(\d+)\]$")


@dataclass
class LayerRouting:
    """One MoE layer's routers on micro batch 0, reference against test."""

    layer: int
    tokens: int
    moved: list[tuple[int, int]] = field(default_factory=list)  # (sequence, position) of tokens with other experts
    first_move: tuple[list[int], list[int]] | None = None  # (reference experts, test experts) of the first
    weights: TensorDiff | None = None  # over the tokens whose experts agree, matched expert by expert
    aux: TensorDiff | None = None
    aux_values: tuple[float, float] | None = None  # (reference, test)

    def to_json(self) -> dict:
        return {"layer": self.layer, "tokens": self.tokens, "moved": len(self.moved),
                "positions": [list(p) for p in self.moved[:64]],
                "first_move": [list(e) for e in self.first_move] if self.first_move else None,
                "weights": self.weights.to_json() if self.weights else None,
                "aux_loss": self.aux.to_json() if self.aux else None}


def routing_layers(cap: StepCapture) -> list[int]:
    return sorted(int(m.group(1)) for n in cap.routing if (m := re.match(r"^experts\[(\d+)\]$", n)))


def compare_routing(ref: StepCapture, test: StepCapture) -> list[LayerRouting]:
    """Every MoE layer both captures hold the routing of, in layer order."""
    out = []
    for layer in routing_layers(ref):
        if experts_name(layer) not in test.routing:
            continue
        r_exp, t_exp = (np.asarray(c.routing[experts_name(layer)], dtype=np.int64) for c in (ref, test))
        r_w, t_w = (np.asarray(c.routing[weights_name(layer)], dtype=np.float32) for c in (ref, test))
        if r_exp.shape != t_exp.shape:
            continue
        # Sort each token's experts (and their weights with them): the sets, matched expert by expert.
        r_order, t_order = np.argsort(r_exp, axis=-1, kind="stable"), np.argsort(t_exp, axis=-1, kind="stable")
        r_set, t_set = np.take_along_axis(r_exp, r_order, -1), np.take_along_axis(t_exp, t_order, -1)
        same = (r_set == t_set).all(axis=-1)  # (B, T)
        d = LayerRouting(layer, int(same.size))
        moved = np.argwhere(~same)
        d.moved = [(int(b), int(t)) for b, t in moved]
        if d.moved:
            b, t = d.moved[0]
            d.first_move = (r_exp[b, t].tolist(), t_exp[b, t].tolist())
        if same.any():
            rw = np.take_along_axis(r_w, r_order, -1)[same]
            tw = np.take_along_axis(t_w, t_order, -1)[same]
            d.weights = tensor_diff(weights_name(layer), "routing weights", rw, tw)
        name = aux_loss_name(layer)
        if name in ref.routing and name in test.routing:
            d.aux_values = (float(ref.routing[name]), float(test.routing[name]))
            d.aux = tensor_diff(name, "aux loss", np.array([d.aux_values[0]]), np.array([d.aux_values[1]]))
        out.append(d)
    return out


def _positions(moved: list[tuple[int, int]]) -> str:
    by_sequence: dict[int, list[int]] = {}
    for b, t in moved[:SHOWN_POSITIONS]:
        by_sequence.setdefault(b, []).append(t)
    text = "; ".join(f"sequence {b} position{'s' if len(ts) > 1 else ''} {', '.join(map(str, ts))}"
                     for b, ts in by_sequence.items())
    return text + ("; ..." if len(moved) > SHOWN_POSITIONS else "")


def _experts(e: list[int]) -> str:
    return ", ".join(map(str, e))


def routing_findings(layers: list[LayerRouting], forward: list[TensorDiff], tol: float) -> list[tuple[Finding, bool]]:
    """(finding, the router logits agree) for every layer whose routing differs, in layer order."""
    logits = {d.name: d for d in forward if d.name.startswith(ROUTER + "[")}
    out = []
    for d in layers:
        router = logits.get(f"{ROUTER}[{d.layer}]")
        agree = router is None or not differs(router, tol)
        said = ("" if router is None else
                f" while the router logits agree (relative {router.rel:.1e})" if agree else
                f"; the router logits differ too (relative {router.rel:.2e})")
        if d.moved:
            ref_e, test_e = d.first_move
            cause = ": the top-k rule or its tie-break differs" if router is not None and agree else ""
            out.append((Finding(ROUTED, experts_name(d.layer),
                                f"tokens routed differently: {len(d.moved)} of {d.tokens} tokens in layer {d.layer} go "
                                f"to other experts ({_positions(d.moved)}; the first: reference experts "
                                f"{_experts(ref_e)}, test {_experts(test_e)}){said}{cause}"), agree))
        elif d.weights is not None and differs(d.weights, tol):
            both = ("" if router is None else
                    f" and the router logits (relative {router.rel:.1e})" if agree else
                    f"; the router logits differ too (relative {router.rel:.2e})")
            out.append((Finding(ROUTING_WEIGHTS, weights_name(d.layer),
                                f"routing weights differ in layer {d.layer} (relative {d.weights.rel:.2e} over its "
                                f"{d.tokens} tokens, max |Δ| {d.weights.max_abs:.2e}) while every token's experts"
                                f"{both} agree" + (": the weights are made from the logits differently (softmax "
                                                   "before or after top-k, renormalisation, scaling)" if agree else "")),
                        agree))
        if d.aux is not None and differs(d.aux, tol):
            ref_v, test_v = d.aux_values
            ratio = f" (x{test_v / ref_v:.4g})" if ref_v else ""
            out.append((Finding(AUX_LOSS, aux_loss_name(d.layer),
                                f"aux loss differs in layer {d.layer}: reference {ref_v:.6g}, test {test_v:.6g}{ratio}, "
                                "the load-balancing loss at coefficient 1"
                                + (", while the routing agrees: it is computed or scaled differently"
                                   if not d.moved and agree else "")), agree and not d.moved))
    return out


def add_routing_findings(findings: list[Finding], layers: list[LayerRouting], forward: list[TensorDiff],
                         tol: float) -> list[Finding]:
    """Routing findings first where they are the cause (the forward agrees up to that layer's router
    logits: what differs after follows from them), after the others where an earlier module already
    differs."""
    found = routing_findings(layers, forward, tol)
    first = next((i for i, d in enumerate(forward) if differs(d, tol)), None)
    position = {d.name: i for i, d in enumerate(forward)}

    def upstream_agrees(f: Finding) -> bool:
        layer = int(re.search(r"\[(\d+)\]", f.where).group(1))
        at = position.get(f"{ROUTER}[{layer}]")
        return first is None or at is None or first >= at

    causes = [f for f, agree in found if agree and upstream_agrees(f)]
    rest = [f for f, agree in found if f not in causes]
    return causes + findings + rest


def group_expert_findings(findings: list[Finding], grads: list[TensorDiff], tol: float) -> list[Finding]:
    """Gradient-only findings that name only experts' matrices become one finding naming the experts:
    "gradients of expert 3 only", or "gradients of all 8 experts only" (their parameters reduced or
    placed differently, e.g. over expert-parallel ranks)."""
    def tensors(f: Finding) -> tuple[str, ...]:
        return f.tensors or (f.where,)

    alone = [f for f in findings if f.kind == GRADIENT_ONLY]
    if not alone or not all(_EXPERT.match(n) for f in alone for n in tensors(f)):
        return findings
    named = {int(_EXPERT.match(n).group(1)) for f in alone for n in tensors(f)}
    members = [d for d in grads if (m := _EXPERT.match(d.name)) and int(m.group(1)) in named and differs(d, tol)]
    roles = sorted({_EXPERT.match(d.name).group(2) for d in members})
    layers = sorted({int(_EXPERT.match(d.name).group(3)) for d in members})
    rel = [d.rel for d in members]
    span = f"{min(rel):.2e}" if f"{min(rel):.2e}" == f"{max(rel):.2e}" else f"{min(rel):.2e} to {max(rel):.2e}"
    every = 1 + max(int(m.group(1)) for d in grads if (m := _EXPERT.match(d.name)))
    where_layers = f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"
    if len(named) == 1:
        (expert,) = named
        merged = Finding(GRADIENT_ONLY, f"expert{expert}",
                         f"gradients of expert {expert} only: its {', '.join(roles)} in {where_layers} differ "
                         f"(relative {span}) while every other expert's gradients, the router's and their neighbours "
                         "agree", tensors=tuple(d.name for d in members))
    else:
        which = (f"all {every} experts" if len(named) == every else
                 f"{len(named)} of {every} experts ({', '.join(map(str, sorted(named)))})")
        merged = Finding(GRADIENT_ONLY, "experts",
                         f"gradients of {which} only: their {', '.join(roles)} in {where_layers} differ (relative "
                         f"{span}, cosine {min(d.cosine for d in members):.3f} to {max(d.cosine for d in members):.3f}) "
                         "while the router's and every other gradient agree: expert parameters are reduced or placed "
                         "differently (e.g. over expert-parallel ranks)", tensors=tuple(d.name for d in members))
    out, placed = [], False
    for f in findings:
        if f.kind == GRADIENT_ONLY:
            if not placed:
                out.append(merged)
                placed = True
            continue
        out.append(f)
    return out
