"""certify.identity: two captures bit for bit, the first tensor whose bytes differ in the order a
difference propagates (module outputs, output gradients in backward order, parameter gradients)."""

from __future__ import annotations

import dataclasses

import numpy as np

from lockstep.capture.request import make_sketch
from lockstep.certify.identity import first_difference
from lockstep.formats.step_capture import StepCapture


def capture(seed: int = 0, framework: str = "a") -> StepCapture:
    rng = np.random.default_rng(seed)
    tensors = {("fwd", "ln1[0]"): rng.standard_normal((4, 8)), ("fwd", "attn[0]"): rng.standard_normal((4, 8)),
               ("outgrad", "ln1[0]"): rng.standard_normal((4, 8)), ("outgrad", "attn[0]"): rng.standard_normal((4, 8)),
               ("grad", "wte"): rng.standard_normal((16, 8)), ("grad", "ln1w"): rng.standard_normal(8)}
    sketches = {f"{k}/{n}": make_sketch(t.astype(np.float32)) for (k, n), t in tensors.items()}
    return StepCapture(framework=framework, sketches=sketches, param_order=["wte", "ln1w"])


def with_changed(cap: StepCapture, key: str, tensor: np.ndarray) -> StepCapture:
    return dataclasses.replace(cap, framework="b", sketches={**cap.sketches, key: make_sketch(tensor.astype(np.float32))})


def test_identical_captures_have_no_difference():
    assert first_difference(capture(), capture(framework="b")) is None


def test_one_ulp_in_one_gradient_is_found_and_named():
    rng = np.random.default_rng(0)
    for _ in range(4):
        rng.standard_normal((4, 8))  # the forward and output-gradient tensors drawn before it
    wte = rng.standard_normal((16, 8)).astype(np.float32)
    wte[3, 5] = np.nextafter(wte[3, 5], np.float32(np.inf))
    found = first_difference(capture(), with_changed(capture(), "grad/wte", wte))
    assert found.kind == "gradient" and found.name == "wte" and 0 < found.rel < 1e-6


def test_a_forward_difference_comes_before_the_gradients_it_moves():
    changed = with_changed(capture(), "fwd/attn[0]", np.zeros((4, 8)))
    changed = dataclasses.replace(changed, sketches={**changed.sketches, "grad/wte": make_sketch(np.ones((16, 8), np.float32))})
    found = first_difference(capture(), changed)
    assert (found.kind, found.name, found.rel) == ("module output", "attn[0]", 1.0)


def test_output_gradients_are_searched_in_backward_order():
    a = capture()
    b = with_changed(with_changed(a, "outgrad/ln1[0]", np.zeros((4, 8))), "outgrad/attn[0]", np.zeros((4, 8)))
    assert first_difference(a, b).name == "attn[0]"  # the later module's gradient arrives first


def test_captures_of_different_tensors_are_said_so():
    b = dataclasses.replace(capture(), sketches={k: v for k, v in capture().sketches.items() if k != "grad/ln1w"})
    assert first_difference(capture(), b) == "the captures hold different gradients"


def test_module_outputs_are_searched_in_forward_order_not_the_files_order():
    # InfiniTrain's dumps list `logits` before the first layer's outputs (file-name order): with the
    # first RMSNorm changed, its logits change too, and the norm is what differs first.
    a = capture()
    a = dataclasses.replace(a, sketches={"fwd/logits": make_sketch(np.ones((4, 8), np.float32)), **a.sketches},
                            forward_order=["ln1[0]", "attn[0]", "logits"])
    b = with_changed(with_changed(a, "fwd/logits", np.zeros((4, 8))), "fwd/ln1[0]", np.zeros((4, 8)))
    assert list(a.names("fwd"))[0] == "logits" and first_difference(a, b).name == "ln1[0]"
