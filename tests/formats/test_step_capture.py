"""The step-1 capture file: whole tensors and sketches read back exactly, lazily, with their shapes
(a 0-d loss stays 0-d); a write that fails leaves no file."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.errors import FormatError
from lockstep.formats.step_capture import GRAD_SGD_RECOVERED, LazyTensors, Sketch, StepCapture


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    cap = StepCapture("pytorch", loss=10.8435, forward={"ln1[0]": rng.standard_normal((2, 3, 4)).astype(np.float32),
                                                         "loss": np.array(10.8435, dtype=np.float32)},
                      forward_order=["ln1[0]", "loss"], grads={"wte": rng.standard_normal((5, 4)).astype(np.float32)},
                      grad_kind=GRAD_SGD_RECOVERED, grad_precision={"wte": 6e-8},
                      token_losses=np.ones((1, 8), dtype=np.float32), param_order=["wte"],
                      module_kind={"wte": "Embedding"},
                      sketches={"grad/qkvw[0]": Sketch(rng.standard_normal(16), 3.5, (4, 4))}, notes=["n"],
                      meta={"case": {"name": "c"}})
    path = tmp_path / "c.npz"
    cap.save(path)
    back = StepCapture.load(path)
    assert isinstance(back.forward, LazyTensors) and back.source == str(path)
    assert back.forward["loss"].shape == () and np.array_equal(back.forward["ln1[0]"], cap.forward["ln1[0]"])
    assert np.array_equal(back.grads["wte"], cap.grads["wte"]) and back.grad_precision == {"wte": 6e-8}
    s = back.sketch("grad", "qkvw[0]")
    assert np.array_equal(s.values, cap.sketches["grad/qkvw[0]"].values) and s.norm == 3.5 and s.shape == (4, 4)
    assert back.names("grad") == ["wte", "qkvw[0]"] and back.grad_kind == GRAD_SGD_RECOVERED
    assert (back.loss, back.forward_order, back.param_order, back.notes) == (10.8435, ["ln1[0]", "loss"], ["wte"], ["n"])
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    cap = StepCapture("pytorch", grads={"wte": np.zeros((3, 3), dtype=np.float32)})

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", full)
    with pytest.raises(FormatError, match=r"c\.npz: .*no space left on device"):
        cap.save(tmp_path / "c.npz")
    assert list(tmp_path.iterdir()) == []


def test_not_a_capture(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(2))
    with pytest.raises(FormatError, match="no meta entry"):
        StepCapture.load(path)
    path.write_bytes(b"junk")
    with pytest.raises(FormatError, match="not a lockstep step-1 capture"):
        StepCapture.load(path)
