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


def test_adam_update_saturations_are_one_byte_per_element(tmp_path):
    """Adam update saturations (a reference's `updates`, an "adam-update" capture's `grads`: -1..1) go to
    disk as int8 in 1/127 steps -- 5x5 of them are a 25-byte array after the .npy header -- and read back as
    the same values: ±1 and 0 exactly, a ramp value to within half a step."""
    import zipfile

    from lockstep.capture.request import update_signs, update_values
    from lockstep.formats.step_capture import GRAD_ADAM_UPDATE

    signs = np.sign(np.random.default_rng(1).standard_normal((5, 5))).astype(np.float32)
    signs[0, 0], signs[0, 1] = 0.0, -0.5
    ref = StepCapture("pytorch", updates={"wte": signs}, sketches={"grad/wte": Sketch(np.ones(25), 5.0, (5, 5))})
    test = StepCapture("infinitrain", grads={"wte": update_signs(signs)}, grad_kind=GRAD_ADAM_UPDATE)
    for cap, entry in ((ref, "update/wte.npy"), (test, "grad/wte.npy")):
        path = tmp_path / f"{cap.framework}.npz"
        cap.save(path)
        with zipfile.ZipFile(path) as zf:
            raw = zf.read(entry)
        header = raw.index(b"\n") + 1
        assert len(raw) - header == 25 and b"'descr': '|i1'" in raw[:header]
        back = StepCapture.load(path)
        whole = back.updates if cap is ref else back.grads
        assert whole["wte"].dtype == np.int8 and whole["wte"][0, 1] == -64 and set(np.abs(whole["wte"].ravel())) == {0, 64, 127}
        values = update_values(whole["wte"], back.update_levels)
        assert values[0, 1] == np.float32(-64 / 127)
        values[0, 1] = -0.5
        assert np.array_equal(values, signs)
    assert StepCapture.load(tmp_path / "pytorch.npz").names("update") == ["wte"]


def test_a_capture_of_schema_3_reads_its_signs_as_they_were(tmp_path, monkeypatch):
    """Before schema 4 an int8 tensor held -1, 0 and 1 themselves: they still read as those values."""
    from lockstep.capture.request import update_values
    from lockstep.formats import step_capture

    monkeypatch.setattr(step_capture, "CAPTURE_SCHEMA", 3)
    signs = np.array([1, 0, -1], dtype=np.int8)
    StepCapture("infinitrain", grads={"wte": signs}, grad_kind=step_capture.GRAD_ADAM_UPDATE).save(tmp_path / "c.npz")
    back = StepCapture.load(tmp_path / "c.npz")
    assert back.update_levels == 1 and np.array_equal(update_values(back.grads["wte"], back.update_levels), [1, 0, -1])


def test_a_saturation_tensor_with_other_values_is_not_written(tmp_path):
    cap = StepCapture("pytorch", updates={"wte": np.array([1.0, 0.5, -1.5])})
    with pytest.raises(ValueError, match="wte: an Adam update saturation tensor holds values outside -1..1"):
        cap.save(tmp_path / "c.npz")
    assert list(tmp_path.iterdir()) == []


def test_whole_tensors_are_views_of_the_mapped_file(tmp_path):
    """A capture's tensors are read as views of the memory-mapped .npz (no copy, no CRC pass over
    gigabytes), with the same values, shape and dtype np.load gives; a file cut short says so."""
    rng = np.random.default_rng(2)
    grads = {"wte": rng.standard_normal((7, 3)).astype(np.float32), "lnfw": rng.standard_normal(3).astype(np.float32)}
    StepCapture("pytorch", grads=grads, forward={"loss": np.array(1.5, dtype=np.float32)}).save(tmp_path / "c.npz")
    back = StepCapture.load(tmp_path / "c.npz")
    with np.load(tmp_path / "c.npz") as z:
        for name, want in grads.items():
            got = back.grads[name]
            assert got.dtype == want.dtype and not got.flags.writeable and np.array_equal(got, z["grad/" + name])
            assert np.array_equal(got, want)
    assert back.forward["loss"].shape == () and float(back.forward["loss"]) == 1.5
    raw = (tmp_path / "c.npz").read_bytes()
    at = raw.index(b"grad/wte.npy") - 30  # its local header
    (tmp_path / "bad.npz").write_bytes(raw[:at] + b"XX" + raw[at + 2:])
    with pytest.raises(FormatError, match=r"bad\.npz: entry grad/wte: no zip local header"):
        StepCapture.load(tmp_path / "bad.npz").grads["wte"]


def test_routing_entries_round_trip_in_their_dtypes(tmp_path):
    experts = np.array([[[3, 0], [7, 2]]], dtype=np.int64)  # (B, T, k), highest logit first
    weights = np.array([[[0.75, 0.25], [0.5, 0.5]]], dtype=np.float64)
    cap = StepCapture("megatron", loss=1.0, routing={"experts[1]": experts, "weights[1]": weights,
                                                      "aux_loss[1]": np.float64(1.0000000000000002)})
    cap.save(tmp_path / "r.npz")
    back = StepCapture.load(tmp_path / "r.npz")
    assert back.routing["experts[1]"].dtype == np.int16 and back.routing["experts[1]"].tolist() == experts.tolist()
    assert back.routing["weights[1]"].dtype == np.float32 and back.routing["weights[1]"].tolist() == weights.tolist()
    assert back.routing["aux_loss[1]"].dtype == np.float64 and float(back.routing["aux_loss[1]"]) == 1.0000000000000002
    assert sorted(back.names("route")) == ["aux_loss[1]", "experts[1]", "weights[1]"]


def test_a_routing_entry_of_another_kind_is_not_written(tmp_path):
    cap = StepCapture("megatron", loss=1.0, routing={"logits[0]": np.zeros((1, 2, 8), dtype=np.float32)})
    with pytest.raises((FormatError, ValueError), match="not a routing entry"):
        cap.save(tmp_path / "r.npz")
    assert list(tmp_path.iterdir()) == []
