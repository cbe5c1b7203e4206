"""The gradient sketch: the same buckets in numpy and torch, shares that add up to the whole, and
relative errors close enough to tell agreement (1e-7) from a defect (1e-2)."""

from __future__ import annotations

import numpy as np
import torch

from lockstep.capture.sketch import BUCKETS, l2_norm, sketch_numpy, sketch_torch
from lockstep.certify.tensors import sketch_diff, tensor_diff
from lockstep.formats.step_capture import Sketch


def _sketch(a: np.ndarray) -> Sketch:
    return Sketch(sketch_numpy(a), l2_norm(a), a.shape)


def test_numpy_and_torch_put_every_element_in_the_same_bucket():
    a = np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32)
    np.testing.assert_allclose(sketch_torch(torch.from_numpy(a)).numpy(), sketch_numpy(a), rtol=1e-12, atol=1e-12)


def test_a_small_tensor_is_kept_exactly():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    assert np.array_equal(sketch_numpy(a), a.reshape(-1).astype(np.float64))
    assert _sketch(a).exact and sketch_diff("t", "gradient", _sketch(a), _sketch(a + 1)).max_abs == 1.0


def test_shares_with_their_canonical_indices_add_up_to_the_whole():
    """A TP rank sketches its columns of a tensor with their canonical indices; the sum is the tensor's."""
    a = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    idx = np.arange(a.size).reshape(a.shape)
    halves = [sketch_numpy(a[:, c], numel=a.size, index=idx[:, c]) for c in (slice(0, 48), slice(48, 96))]
    np.testing.assert_allclose(halves[0] + halves[1], sketch_numpy(a), rtol=1e-12, atol=1e-12)
    t = torch.from_numpy(a)
    shares = sum(sketch_torch(t[:, c], numel=a.size, index=torch.from_numpy(idx[:, c])) for c in (slice(0, 48), slice(48, 96)))
    np.testing.assert_allclose(shares.numpy(), sketch_numpy(a), rtol=1e-12, atol=1e-12)


def test_relative_errors_from_sketches_track_the_whole_tensors():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal(1_000_000).astype(np.float32)
    assert ref.size > 100 * BUCKETS
    for size in (1e-7, 1e-5, 5e-2):
        test = (ref + size * rng.standard_normal(ref.size).astype(np.float32) * np.abs(ref)).astype(np.float32)
        exact = tensor_diff("g", "gradient", ref, test)
        est = sketch_diff("g", "gradient", _sketch(ref), _sketch(test))
        assert est.sketched and est.max_abs is None
        assert abs(est.rel / exact.rel - 1) < 0.15, (size, est.rel, exact.rel)
        assert abs((1 - est.cosine) / (1 - exact.cosine) - 1) < 0.3 if exact.cosine < 1 else est.cosine == 1.0
    same = sketch_diff("g", "gradient", _sketch(ref), _sketch(ref.copy()))
    assert same.rel == 0.0 and same.cosine == 1.0


def test_a_defect_in_a_few_elements_is_not_averaged_away():
    """A 5% error on 1% of a tensor's elements (a bias-like sub-block) shows as ~5e-3, far above 1e-5."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(400_000).astype(np.float32)
    test = ref.copy()
    test[:4000] *= 1.05
    exact = tensor_diff("g", "gradient", ref, test).rel
    est = sketch_diff("g", "gradient", _sketch(ref), _sketch(test)).rel
    assert 3e-3 < exact < 7e-3 and abs(est / exact - 1) < 0.15
