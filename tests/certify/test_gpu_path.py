"""Large whole tensors are worked on a GPU where there is one (capture.request.on_gpu_if_large):
Adam's update of the reference's gradients, InfiniTrain's recovered update and the comparison
itself. That path must give bitwise the host's numbers. It runs here on the CPU, through torch,
with the GPU's name pointed at the CPU and the size limit lowered to a few elements."""

from __future__ import annotations

import numpy as np

from lockstep.capture import request as capture_request
from lockstep.certify.tensors import compare_grads, diff
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE, StepCapture
from lockstep.runners.infinitrain.capture import recover_adam_update

EPS = 1e-8


def captures() -> tuple[StepCapture, StepCapture]:
    rng = np.random.default_rng(3)
    grads = {"wte": rng.normal(0, 1e-3, (64, 16)).astype(np.float32), "lnfw": rng.normal(0, 1e-9, 16).astype(np.float32)}
    grads["wte"][5] = 0.0  # weights that do not move: update 0
    w0 = {n: rng.normal(0, 0.02, g.shape).astype(np.float32) for n, g in grads.items()}
    # The test framework's weights after one Adam step at lr 1 (one element moved the wrong way).
    w1 = {n: (w0[n] - (g / (np.abs(g) + EPS))).astype(np.float32) for n, g in grads.items()}
    w1["wte"][0, 0] = w0["wte"][0, 0] + 1.0
    test_grads = {n: recover_adam_update(w0[n], w1[n]) for n in grads}
    ref = StepCapture("pytorch", grads=grads, param_order=list(grads))
    test = StepCapture("infinitrain", grads=test_grads, grad_kind=GRAD_ADAM_UPDATE)
    return ref, test


def numbers(diffs):
    return [(d.name, d.max_abs, d.rel, d.cosine, d.ref_norm) for d in diffs]


def test_the_gpu_path_gives_the_hosts_numbers(monkeypatch):
    host_ref, host_test = captures()
    on_host = numbers(compare_grads(host_ref, host_test, adam_eps=EPS))
    monkeypatch.setattr(capture_request, "GPU", "cpu")  # torch's path, on the CPU
    monkeypatch.setattr(capture_request, "ON_GPU_ELEMENTS", 8)
    dev_ref, dev_test = captures()  # InfiniTrain's update recovered through torch too
    for n in host_test.grads:
        assert np.array_equal(dev_test.grads[n], host_test.grads[n])
    assert numbers(compare_grads(dev_ref, dev_test, adam_eps=EPS)) == on_host
    wte = next(d for d in compare_grads(dev_ref, dev_test, adam_eps=EPS) if d.name == "wte")
    assert wte.max_abs == 2.0  # the element moved the wrong way: sign +1 against -1 (or 0 against ±1 is 1)


def test_a_transformed_reference_is_sketched_on_the_gpu_when_the_test_holds_a_sketch(monkeypatch):
    ref, test = captures()
    test.sketches = {"grad/wte": capture_request.make_sketch(capture_request.update_values(test.grads.pop("wte")))}
    on_host = diff(ref, test, "grad", "wte", "adam update", ref_kind="update",
                   ref_transform=lambda g: capture_request.adam_first_update(g, EPS))
    monkeypatch.setattr(capture_request, "GPU", "cpu")
    monkeypatch.setattr(capture_request, "ON_GPU_ELEMENTS", 8)
    on_dev = diff(ref, test, "grad", "wte", "adam update", ref_kind="update",
                  ref_transform=lambda g: capture_request.adam_first_update(g, EPS))
    # (a tensor this small is kept exactly by its sketch: the numbers are the whole tensor's)
    assert (on_dev.max_abs, on_dev.rel, on_dev.cosine) == (on_host.max_abs, on_host.rel, on_host.cosine)
    assert on_host.max_abs == 2.0
