"""InfiniTrain's capture: gradients from weights alone -- one SGD step at a power-of-two lr recovers g
to ~2^-24 relative, Adam's first step shows its update g/(|g| + eps) --, and its model.ckpt layout
reads back under LLMC names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.capture.request import update_values
from lockstep.certify.classify import ADAM_SIGN_SHARE, GRADIENT_ONLY
from lockstep.diagnose.verdict import diagnose_captures
from lockstep.formats.infinitrain_checkpoint import read_infinitrain_checkpoint, write_infinitrain_checkpoint
from lockstep.formats.step_capture import GRAD_ADAM_UPDATE, GRAD_SGD_RECOVERED, StepCapture
from lockstep.runners.infinitrain import capture as weights_only
from lockstep.runners.pytorch.capture import capture_reference
from lockstep.errors import FormatError
from lockstep.models.family import split_canonical
from lockstep.models.gpt2.model import GPT2
from lockstep.runners.infinitrain.families import adapter_for


def one_step(model, case, tokens, optimizer):
    """A framework that only saves weights: train one step, return the weights after it."""
    cap = capture_reference(model, case, tokens, framework="weights-only")
    for name, p in model.llmc_parameters().items():
        p.grad = torch.from_numpy(cap.grads[name].copy())
    optimizer.step()
    return {n: p.detach().numpy().copy() for n, p in model.llmc_parameters().items()}, cap


def test_sgd_recovery_reaches_fp32_rounding(gpt2_tiny, token_ids, gpt2_case):
    config, tensors = gpt2_tiny
    case = gpt2_case()
    model = GPT2.from_llmc(tensors, config)
    w0 = split_canonical(tensors, config)
    exact = capture_reference(GPT2.from_llmc(tensors, config), case, token_ids)
    lr = weights_only.sgd_recovery_lr({n: weights_only.rms(w) for n, w in w0.items()},
                                      {n: weights_only.rms(g) for n, g in exact.grads.items()})
    assert lr == 2.0 ** round(np.log2(lr)) and lr >= 1e6
    w1, _ = one_step(model, case, token_ids, torch.optim.SGD(model.parameters(), lr=lr))
    worst = 0.0
    for name, g in exact.grads.items():
        rec, bound = weights_only.recover_sgd(w0[name], w1[name], lr)
        err = np.linalg.norm(rec.astype(np.float64) - g) / max(np.linalg.norm(g), 1e-30)
        assert err <= 2 * bound + 2 ** -24, name  # w1's rounding (+ storing g in FP32)
        worst = max(worst, err)
    assert worst < 1e-6


def test_recovered_gradients_name_a_transposed_bias(gpt2_tiny, token_ids, gpt2_case):
    from support.model_defects import gpt2_with

    config, tensors = gpt2_tiny
    case = gpt2_case()
    ref = capture_reference(GPT2.from_llmc(tensors, config), case, token_ids)
    w0 = split_canonical(tensors, config)
    lr = weights_only.sgd_recovery_lr({n: weights_only.rms(w) for n, w in w0.items()},
                                      {n: weights_only.rms(g) for n, g in ref.grads.items()})
    model = gpt2_with(tensors, config, c_attn=True)
    w1, _ = one_step(model, case, token_ids, torch.optim.SGD(model.parameters(), lr=lr))
    test = StepCapture(framework="weights-only", loss=ref.loss, grad_kind=GRAD_SGD_RECOVERED)
    for name in w0:
        test.grads[name], test.grad_precision[name] = weights_only.recover_sgd(w0[name], w1[name], lr)
    v = diagnose_captures(ref, test, case)
    assert [(f.kind, f.where, f.tensors) for f in v.findings] == [(GRADIENT_ONLY, "qkvb[0..1]",
                                                                    ("qkvb[0]", "qkvb[1]"))]
    assert max(d.rel for d in v.grads if not d.name.startswith("qkvb")) < 1e-6


def test_adam_first_step_shows_its_update(gpt2_tiny, token_ids, gpt2_case):
    """Adam's bias-corrected first step moves every weight by lr*g/(|g|+eps): lr*sign(g) unless |g| ~ eps;
    at lr 1 the sign of every saturated update (|g| >= 999 eps) is recovered exactly, and equals the
    reference's from its own gradient."""
    config, tensors = gpt2_tiny
    model = GPT2.from_llmc(tensors, config)
    w0 = split_canonical(tensors, config)
    lr = weights_only.ADAM_RECOVERY_LR
    w1, cap = one_step(model, gpt2_case(), token_ids, torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8))
    g, moved = cap.grads["qkvw[0]"], w0["qkvw[0]"].astype(np.float64) - w1["qkvw[0]"]
    big = np.abs(g) > 1e-6
    assert np.all(np.sign(moved[big]) == np.sign(g[big]))
    assert np.allclose(np.abs(moved[big]), lr, rtol=1e-2)  # the same step for a gradient of 1e-6 and of 1e-2
    u = update_values(weights_only.recover_adam_update(w0["qkvw[0]"], w1["qkvw[0]"], lr))
    a = np.abs(g.astype(np.float64))
    saturated, noise = a >= 999.01e-8, a <= 498.99e-8
    assert np.array_equal(u[saturated], np.sign(g[saturated]))  # the sign, where the update is saturated
    assert np.all(u[noise] == 0) and saturated.mean() > 0.8  # nothing where it is rounding noise
    ramp = ~saturated & ~noise  # between: the sign of g, and a share of it that grows with |g|
    assert ramp.any() and np.all(np.sign(u[ramp]) * np.sign(g[ramp]) >= 0) and np.all(np.abs(u[ramp]) <= 1)
    # Growing with |g|, but for a level where w1's FP32 rounding (ulp(|w1|) ~ 6e-8 at lr 1) meets a level's edge.
    order = np.argsort(a[ramp])
    assert np.all(np.diff(np.abs(u[ramp])[order]) >= -1.0001 / 127)
    test = StepCapture(framework="weights-only", loss=cap.loss, grad_kind=GRAD_ADAM_UPDATE,
                       grads={n: weights_only.recover_adam_update(w0[n], w1[n], lr) for n in w0})
    v = diagnose_captures(cap, test, gpt2_case(), adam_eps=1e-8)  # the eps its Adam ran with
    # The same signs but for an element or so at the saturation edge, which FP32 may put on either side.
    assert v.findings == [] and v.grads[0].kind == "adam update"
    assert max(d.rel for d in v.grads) <= 2 * ADAM_SIGN_SHARE ** 0.5
    # Negative control: c_attn's bias gradient read transposed flips many of its signs.
    from support.model_defects import gpt2_with

    bad = gpt2_with(tensors, config, c_attn=True)
    w1_bad, _ = one_step(bad, gpt2_case(), token_ids, torch.optim.Adam(bad.parameters(), lr=lr, eps=1e-8))
    test.grads = {n: weights_only.recover_adam_update(w0[n], w1_bad[n], lr) for n in w0}
    assert [(f.kind, f.where) for f in diagnose_captures(cap, test, gpt2_case(), adam_eps=1e-8).findings] == [(GRADIENT_ONLY,
                                                                                                "qkvb[0..1]")]


def test_infinitrain_checkpoint_reads_back_under_llmc_names(gpt2_tiny, tmp_path):
    config, tensors = gpt2_tiny
    w = split_canonical(tensors, config)
    names = {"transformer.wte.weight": w["wte"][: config.vocab_size], "transformer.wpe.weight": w["wpe"],
             "transformer.ln_f.weight": w["lnfw"], "transformer.ln_f.bias": w["lnfb"],
             "lm_head.weight": w["wte"][: config.vocab_size] * 0}
    for i in range(config.num_layers):
        names[f"transformer.h.{i}.attn.c_attn.bias"] = w[f"qkvb[{i}]"]
        names[f"transformer.h.{i}.mlp.c_proj.weight"] = w[f"fcprojw[{i}]"]
    path = tmp_path / "model.ckpt"
    write_infinitrain_checkpoint(path, names)
    raw = path.read_bytes()
    assert raw[:4] == b"CKPT"
    got = adapter_for("gpt2").canonical_state(read_infinitrain_checkpoint(path), config)
    assert set(got) == {"wte", "wpe", "lnfw", "lnfb", "qkvb[0]", "qkvb[1]", "fcprojw[0]", "fcprojw[1]"}
    assert got["wte"].shape == w["wte"].shape and np.array_equal(got["wte"], w["wte"])
    assert np.array_equal(got["qkvb[1]"], w["qkvb[1]"])
    path.write_bytes(raw[:-3])
    with pytest.raises(FormatError, match="file ends early|ends in the middle"):
        read_infinitrain_checkpoint(path)


def test_a_reference_kept_as_adam_update_signs_judges_as_its_whole_gradients(gpt2_tiny, token_ids, gpt2_case, tmp_path):
    """Against a framework that shows only its first Adam update, diagnose keeps the reference's
    update whole as int8 signs and its gradients as sketches (`whole_grads=False`): a quarter of the
    bytes, and through the files on disk every gradient row of the verdict is the one made from
    the reference's whole FP32 gradients; the transposed c_attn bias is still named."""
    import zipfile

    from lockstep.capture.request import CaptureRequest
    from lockstep.runners.pytorch.capture import capture_step
    from support.model_defects import gpt2_with

    config, tensors = gpt2_tiny
    case, lr = gpt2_case(), weights_only.ADAM_RECOVERY_LR
    model = GPT2.from_llmc(tensors, config)
    w0 = split_canonical(tensors, config)
    refs = {}
    for whole in (True, False):
        request = CaptureRequest(path=str(tmp_path / f"ref_{whole}.npz"), full=True, adam_eps=1e-8, whole_grads=whole)
        capture_step(model, case, token_ids, request)
        refs[whole] = StepCapture.load(request.path)
    def payload(whole: bool, prefix: str) -> int:  # bytes of the entries' arrays, without their .npy headers
        with zipfile.ZipFile(tmp_path / f"ref_{whole}.npz") as zf:
            return sum(len(b) - b.index(b"\n") - 1 for i in zf.infolist() if i.filename.startswith(prefix)
                       for b in [zf.read(i)])

    numel = sum(w.size for w in w0.values())
    assert (payload(True, "grad/"), payload(True, "update/")) == (4 * numel, 0)
    assert (payload(False, "grad/"), payload(False, "tie/"), payload(False, "update/")) == (0, 0, numel)
    for bad in (False, True):
        m = gpt2_with(tensors, config, c_attn=True) if bad else GPT2.from_llmc(tensors, config)
        w1, _ = one_step(m, case, token_ids, torch.optim.Adam(m.parameters(), lr=lr, eps=1e-8))
        test = StepCapture(framework="weights-only", loss=refs[True].loss, grad_kind=GRAD_ADAM_UPDATE,
                           grads={n: weights_only.recover_adam_update(w0[n], w1[n], lr) for n in w0})
        test.save(tmp_path / "test.npz")
        test = StepCapture.load(tmp_path / "test.npz")
        v_whole, v_signs = (diagnose_captures(refs[w], test, case) for w in (True, False))
        assert [(d.name, d.rel, d.max_abs, d.cosine) for d in v_signs.grads] == [
            (d.name, d.rel, d.max_abs, d.cosine) for d in v_whole.grads]
        assert [(f.kind, f.where) for f in v_signs.findings] == ([(GRADIENT_ONLY, "qkvb[0..1]")] if bad else [])


def test_adam_moments_give_the_whole_gradients_paired_by_the_update_they_imply(tmp_path):
    """InfiniTrain's optimizer.ckpt after one Adam step holds m = (1 - beta1)·g per parameter, indexed by its own
    parameter order (Module::Parameters walks hash maps): each moment pairs with the parameter of its shape that
    moved by lr·g/(|g| + eps), and g = m/(1 - beta1) within m's FP32 rounding. A moment no parameter moved by
    leaves the capture to the update's saturation (None)."""
    from lockstep.formats.infinitrain_checkpoint import write_state_file
    from lockstep.models.family import OptimizerSpec

    adam = OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    rng = np.random.default_rng(7)
    grads = {f"qkvw[{i}]": rng.normal(0, 1e-3, (24, 8)).astype(np.float32) for i in range(3)}
    grads["wte"] = rng.normal(0, 1e-4, (50, 8)).astype(np.float32)
    grads["lora_A.qkvw[0]"] = np.zeros((4, 8), np.float32)  # B = 0 at step 1: no gradient
    grads["lora_A.qkvw[1]"] = np.zeros((4, 8), np.float32)
    w0 = {n: rng.normal(0, 0.02, g.shape).astype(np.float32) for n, g in grads.items()}
    lr, c = 1.0, np.float32(1) - np.float32(0.9)
    w1 = {n: (w0[n] - lr * (g / (np.abs(g) + np.float32(1e-8)))).astype(np.float32) for n, g in grads.items()}
    order = ["wte", "qkvw[2]", "lora_A.qkvw[1]", "qkvw[0]", "lora_A.qkvw[0]", "qkvw[1]"]  # its order, not ours
    path = tmp_path / "optimizer.ckpt"
    write_state_file(path, {**{f"adam.m.{i}": (c * grads[n]).astype(np.float32) for i, n in enumerate(order)},
                            **{f"adam.v.{i}": np.float32(0.001) * grads[n] ** 2 for i, n in enumerate(order)}})
    got = weights_only.moment_gradients(path, w0, w1, lr, adam)
    assert set(got) == set(grads)
    for n, g in grads.items():
        rel = np.linalg.norm(got[n] - g) / max(np.linalg.norm(g), 1e-30)
        assert rel <= weights_only.MOMENT_PRECISION, (n, rel)
    wrong = {**w1, "qkvw[1]": w0["qkvw[1]"] + (w0["qkvw[1]"] - w1["qkvw[1]"])}  # moved the other way
    assert weights_only.moment_gradients(path, w0, wrong, lr, adam) is None
    assert weights_only.moment_gradients(tmp_path / "none.ckpt", w0, w1, lr, adam) is None
