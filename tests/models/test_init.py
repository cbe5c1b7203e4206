"""llm.c's seeded GPT-2 init: its bytes against an independent statement of the rule (plain
Python: PCG64's raw stream, Marsaglia's polar method with math.log, llm.c's stds / ones / zeros
and the LLMC file layout), golden digests (a change of RNG or transform must be noticed), the
statistics docs/reference/training-contract.md#inputs asks for, independence from threads and request splitting, the
deterministic log, and GPT-2 124M's exact size."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from lockstep.fsutil import sha256_file
from lockstep.models import SHAPES
from lockstep.models.gpt2 import FAMILY as GPT2_FAMILY
from lockstep.models.gpt2.config import GPT2Config
from lockstep.models.init import NormalStream, deterministic_log, init_tensors
from lockstep.models.init import write_initial_checkpoint as write_family_checkpoint


def init_llmc_gpt2(config, seed, threads=None):
    return init_tensors(config, GPT2_FAMILY.init_rule(config), seed, threads=threads)


def init_stds(config):
    return GPT2_FAMILY.init_rule(config).stds


def write_initial_checkpoint(path, config, seed, version=3):
    write_family_checkpoint(path, GPT2_FAMILY, config, seed, bf16=version == 5)


def gpt2_file_size(config, version=3):
    return GPT2_FAMILY.layout(config, bf16=version == 5).file_size


load_llmc_gpt2 = GPT2_FAMILY.load

TINY = SHAPES["gpt2-tiny"].config
GPT2 = SHAPES["gpt2"].config

# Golden digests of `lockstep init-checkpoint --model gpt2-tiny --seed 42 [--bf16]` and of the
# 124M fp32 file. If they change, every cached initial checkpoint and every recorded run that
# started from one stops being comparable: change them only on purpose.
GOLDEN_TINY_SEED42_FP32 = "21064a2777319609764d67d1fc20f76e930f1cb80854f50e420654979b786839"
GOLDEN_TINY_SEED42_BF16 = "2480cb236f9ea397c369edb16cd38b354345bcf5730934805196fe1b9e3f5df8"
GOLDEN_GPT2_124M_SEED42_FP32 = "37517253932e17a08591dd971e1cc145e6678697529074712844229867c4b6e3"
# The first values, for a readable diff when the digest changes.
GOLDEN_TINY_WTE_ROW0 = [0.016601815819740295, -0.004556101746857166, 0.01925482787191868, 0.019960792735219002]
GOLDEN_STREAM_SEED0 = [0.44818703569372026, -0.5078139551563818, -0.2554608144562748, 0.7006380458744693]


@pytest.fixture(scope="module")
def tiny42() -> dict[str, np.ndarray]:
    return init_llmc_gpt2(TINY, 42)


@pytest.fixture(scope="module")
def tiny42_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("init") / "tiny42.bin"
    write_initial_checkpoint(path, TINY, 42)
    return path


# --- an independent statement of the init ------------------------------------------------------
# Written from the documented rule, sharing no code with lockstep.models.init: numpy is used only
# for PCG64's raw 64-bit stream (which numpy keeps stable across versions); the uniforms, the
# polar method and the log are plain Python floats and math.log.

PAIRS_PER_BLOCK = 65536  # pcg64-polar-v1: blocks of 2*65536 raw draws, u from the first half, v from the second


def uniform_from_raw(raw: int) -> float:
    """The top 52 bits of a raw draw as a uniform on [-1, 1): k / 2**51 - 1, exact in float64."""
    return (raw >> 12) / 2.0**51 - 1.0


def independent_normals(seed: int, n: int) -> list[float]:
    """The first n standard normals of pcg64-polar-v1, one accepted pair at a time."""
    bits = np.random.PCG64(seed)
    out: list[float] = []
    while len(out) < n:
        raw = [int(r) for r in bits.random_raw(2 * PAIRS_PER_BLOCK)]
        us, vs = [], []
        for i in range(PAIRS_PER_BLOCK):
            u, v = uniform_from_raw(raw[i]), uniform_from_raw(raw[PAIRS_PER_BLOCK + i])
            s = u * u + v * v
            if 0.0 < s < 1.0:
                r = math.sqrt(-2.0 * math.log(s) / s)
                us.append(u * r)
                vs.append(v * r)
        out += us + vs  # a block gives its accepted u*r in order, then its accepted v*r
    return out[:n]


def independent_llmc_gpt2_init(L, NH, C, V, Vp, maxT, seed) -> bytes:
    """llm.c's gpt2_build_from_random as an LLMC v3 file: header, then tensors in file order;
    weights N(0, 0.02), attprojw/fcprojw N(0, 0.02/sqrt(2L)), LayerNorm weights 1, biases 0,
    wte's rows V..Vp-1 0; normals drawn in file order, scaled in float64, rounded to float32."""
    header = [20240326, 3, maxT, V, L, NH, C, Vp] + [0] * 248
    residual = 0.02 / math.sqrt(2 * L)
    layout = [("wte", Vp * C, 0.02), ("wpe", maxT * C, 0.02), ("ln1w", L * C, 1), ("ln1b", L * C, 0),
              ("qkvw", L * 3 * C * C, 0.02), ("qkvb", L * 3 * C, 0), ("attprojw", L * C * C, residual),
              ("attprojb", L * C, 0), ("ln2w", L * C, 1), ("ln2b", L * C, 0), ("fcw", L * 4 * C * C, 0.02),
              ("fcb", L * 4 * C, 0), ("fcprojw", L * 4 * C * C, residual), ("fcprojb", L * C, 0),
              ("lnfw", C, 1), ("lnfb", C, 0)]
    drawn = sum(V * C if name == "wte" else n for name, n, std in layout if std not in (0, 1))
    z = iter(independent_normals(seed, drawn))
    values: list[float] = []
    for name, n, std in layout:
        if std in (0, 1):
            values += [float(std)] * n
        elif name == "wte":
            values += [next(z) * std for _ in range(V * C)] + [0.0] * ((Vp - V) * C)
        else:
            values += [next(z) * std for _ in range(n)]
    return struct.pack("<256i", *header) + struct.pack(f"<{len(values)}f", *values)


def test_a_small_checkpoint_equals_the_independent_statement_byte_for_byte(tmp_path):
    """A shape whose ~150k draws cross two block boundaries and both halves of each block."""
    cfg = GPT2Config(max_seq_len=64, vocab_size=1000, num_layers=2, num_heads=4, channels=32, padded_vocab_size=1024)
    path = tmp_path / "small.bin"
    write_initial_checkpoint(path, cfg, 7)
    expected = independent_llmc_gpt2_init(L=2, NH=4, C=32, V=1000, Vp=1024, maxT=64, seed=7)
    got = path.read_bytes()
    assert len(got) == len(expected)
    if got != expected:
        a, b = np.frombuffer(got[1024:], "<f4"), np.frombuffer(expected[1024:], "<f4")
        first = int(np.flatnonzero(a != b)[0]) if got[:1024] == expected[:1024] else "header"
        pytest.fail(f"init differs from the independent statement at float index {first}")


def test_gpt2_tiny_and_124m_start_with_the_independent_normals(tiny42):
    """The first 60,000 drawn values of the golden seed (all in wte, past the first block's u
    half) from the independent statement; gpt2 124M draws the same stream in the same order."""
    z = independent_normals(42, 60_000)
    expected = (np.array(z) * 0.02).astype(np.float32)
    assert np.array_equal(tiny42["wte"].reshape(-1)[:60_000], expected)
    assert tiny42["wte"][0, :4].tolist() == GOLDEN_TINY_WTE_ROW0
    assert NormalStream(0, threads=1).standard_normal(4).tolist() == independent_normals(0, 4)


# --- golden values and determinism --------------------------------------------------------------

def test_golden_tiny_checkpoint_sha256(tiny42_file):
    assert tiny42_file.stat().st_size == gpt2_file_size(TINY) == 20_606_464
    assert sha256_file(tiny42_file) == GOLDEN_TINY_SEED42_FP32


def test_golden_tiny_bf16_checkpoint_sha256(tmp_path):
    path = tmp_path / "tiny42_bf16.bin"
    write_initial_checkpoint(path, TINY, 42, version=5)
    assert path.stat().st_size == gpt2_file_size(TINY, 5) == 10_303_744
    assert sha256_file(path) == GOLDEN_TINY_SEED42_BF16


def test_golden_first_values(tiny42):
    assert tiny42["wte"][0, :4].tolist() == GOLDEN_TINY_WTE_ROW0
    assert NormalStream(0, threads=1).standard_normal(4).tolist() == GOLDEN_STREAM_SEED0


def test_same_seed_same_bytes_different_seed_different(tiny42_file, tmp_path):
    again = tmp_path / "again.bin"
    write_initial_checkpoint(again, TINY, 42)
    assert again.read_bytes() == tiny42_file.read_bytes()
    other = init_llmc_gpt2(TINY, 43)
    assert not np.array_equal(other["wte"], GPT2_FAMILY.load(tiny42_file).tensors["wte"])


def test_file_holds_exactly_the_init(tiny42, tiny42_file):
    ckpt = GPT2_FAMILY.load(tiny42_file)
    assert (ckpt.version, ckpt.config) == (3, TINY)
    for name, t in tiny42.items():
        assert np.array_equal(ckpt.tensors[name], t), name


def test_values_do_not_depend_on_threads(tiny42):
    for threads in (1, 3):
        other = init_llmc_gpt2(TINY, 42, threads=threads)
        assert all(np.array_equal(other[n], tiny42[n]) for n in tiny42)


def test_stream_does_not_depend_on_how_requests_are_split():
    whole = NormalStream(5, threads=1).standard_normal(300_000)
    pieces = NormalStream(5, threads=2)
    parts = [pieces.standard_normal(n) for n in (1, 2, 99_997, 131_072, 68_928)]
    assert np.array_equal(np.concatenate(parts), whole)
    # float32 fill: scaled in float64, rounded once
    out = np.empty(1000, dtype=np.float32)
    NormalStream(5, threads=1).fill_normal(out, 0.02)
    assert np.array_equal(out, (whole[:1000] * 0.02).astype(np.float32))


def test_draws_follow_llmc_file_order():
    """wte draws first (its V rows), then wpe, qkvw, attprojw, fcw, fcprojw, from one stream."""
    cfg = GPT2Config(max_seq_len=4, vocab_size=5, num_layers=1, num_heads=2, channels=4, padded_vocab_size=8)
    t = init_llmc_gpt2(cfg, 9, threads=1)
    stds = init_stds(cfg)
    sizes = [("wte", 5 * 4), ("wpe", 16), ("qkvw", 48), ("attprojw", 16), ("fcw", 64), ("fcprojw", 64)]
    z = NormalStream(9, threads=1).standard_normal(sum(n for _, n in sizes))
    pos = 0
    for name, n in sizes:
        values = t[name][:5] if name == "wte" else t[name]
        assert np.array_equal(values.ravel(), (z[pos : pos + n] * stds[name]).astype(np.float32)), name
        pos += n


# --- statistics (docs/reference/training-contract.md#inputs) -----------------------------------------

def test_stds_per_tensor():
    assert init_stds(GPT2) == {"wte": 0.02, "wpe": 0.02, "qkvw": 0.02, "fcw": 0.02,
                               "attprojw": 0.02 / math.sqrt(24), "fcprojw": 0.02 / math.sqrt(24)}
    assert init_stds(TINY)["attprojw"] == 0.01  # 0.02 / sqrt(2*2)


@pytest.mark.parametrize("name,std", [("wte", 0.02), ("wpe", 0.02), ("qkvw", 0.02), ("fcw", 0.02),
                                      ("attprojw", 0.01), ("fcprojw", 0.01)])
def test_weight_statistics(tiny42, name, std):
    x = tiny42[name][: TINY.vocab_size] if name == "wte" else tiny42[name]
    x = x.astype(np.float64).ravel()
    n = x.size
    # 5 standard errors: the sample std's SE is std/sqrt(2n), the mean's std/sqrt(n)
    assert abs(x.std() - std) < 5 * std / math.sqrt(2 * n), (x.std(), std)
    assert abs(x.mean()) < 5 * std / math.sqrt(n)
    assert np.abs(x).max() < 7 * std
    assert np.count_nonzero(x) == n


def test_constants_are_exact(tiny42):
    for name in ("ln1w", "ln2w", "lnfw"):
        assert (tiny42[name] == 1.0).all(), name
    for name in ("ln1b", "qkvb", "attprojb", "ln2b", "fcb", "fcprojb", "lnfb"):
        assert (tiny42[name] == 0.0).all() and not np.signbit(tiny42[name]).any(), name
    padding = tiny42["wte"][TINY.vocab_size :]
    assert padding.shape == (47, 96) and (padding == 0.0).all()
    assert np.count_nonzero(tiny42["wte"][TINY.vocab_size - 1]) == 96  # the last real row is random


def test_stream_is_standard_normal():
    z = NormalStream(123, threads=1).standard_normal(1_000_000)
    n = z.size
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.std() - 1) < 5 / math.sqrt(2 * n)
    skew = float(np.mean(z**3))
    kurtosis = float(np.mean(z**4))
    assert abs(skew) < 5 * math.sqrt(6 / n)
    assert abs(kurtosis - 3) < 5 * math.sqrt(24 / n)
    for k in (0.5, 1, 2, 3):  # P(|z| < k) = erf(k / sqrt 2)
        p = math.erf(k / math.sqrt(2))
        assert abs(np.mean(np.abs(z) < k) - p) < 5 * math.sqrt(p * (1 - p) / n), k
    # successive draws are uncorrelated
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / math.sqrt(n)


# --- the deterministic log ----------------------------------------------------------------------

def test_deterministic_log_is_within_one_ulp():
    x = np.concatenate([np.exp(np.linspace(-700, 700, 200_001)), np.random.default_rng(1).random(100_000) + 1e-300,
                        [0.5, 1.5, math.sqrt(2), math.sqrt(0.5), np.nextafter(1.0, 0), np.nextafter(1.0, 2)]])
    ours = deterministic_log(x)
    ref = np.array([math.log(v) for v in x])
    ulps = np.abs(ours - ref) / np.spacing(np.abs(ref))
    assert ulps.max() <= 1.0
    assert deterministic_log(np.array([1.0, 2.0, 4.0])).tolist() == [0.0, math.log(2), math.log(4)]


# --- GPT-2 124M ---------------------------------------------------------------------------------

def test_gpt2_124m_size_is_computed_exactly():
    assert GPT2.num_parameters() == 124_475_904
    assert gpt2_file_size(GPT2) == 497_904_640


@pytest.mark.slow
def test_gpt2_124m_written_once(tmp_path):
    """~5-8 s on two cores; also pins the 124M digest, which covers draws past the tiny model's."""
    path = tmp_path / "gpt2_124m.bin"
    write_initial_checkpoint(path, GPT2, 42)
    assert path.stat().st_size == 497_904_640
    assert sha256_file(path) == GOLDEN_GPT2_124M_SEED42_FP32
    t = GPT2_FAMILY.load(path).tensors
    assert (t["wte"][GPT2.vocab_size :] == 0).all() and (t["lnfw"] == 1).all()
    assert abs(float(t["fcprojw"][0].std()) - 0.02 / math.sqrt(24)) < 1e-4
