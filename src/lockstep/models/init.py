"""llm.c's initialisation, seeded so that every machine writes the same bytes, for every family.

Without a pretrained checkpoint every framework in a comparison must start from the same
weights, so lockstep makes them (docs/reference/training-contract.md#inputs). Each family states its rule (`InitRule`:
which tensors draw N(0, std), which are 1, the rest 0); GPT-2's is llm.c's
`gpt2_build_from_random` (weights N(0, 0.02), the two projections back into the residual
stream N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1, only wte's first V rows drawn).
The random tensors draw from one stream in LLMC file order.

Why the raw bit stream and a hand-written transform: numpy promises only that a bit
generator's raw output stays the same across versions; `Generator.standard_normal` and the
other distributions may change between releases (NEP 19), and numpy's vectorised log / sin /
cos use CPU-specific SIMD code that can differ in the last bit between machines, which can
flip a float32 rounding somewhere in 124M values. Either would silently change the golden
checkpoint every framework starts from. So normals come from `PCG64(seed).random_raw()` (a
stable 64-bit stream) through Marsaglia's polar method, computed only with operations IEEE-754
rounds correctly everywhere (+, -, *, /, sqrt, bit manipulation) and a logarithm written out in
those operations (fdlibm's algorithm). The result: the same seed gives the same bytes on any
IEEE-754 machine and numpy version.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lockstep.fsutil import check_free_space
from lockstep.models.family import InitRule, ModelFamily
# Names the drawn values: bump it whenever a change here changes the bytes of a checkpoint, so
# that caches keyed by it (lockstep run's seeded checkpoints) are not reused across the change.
INIT_SCHEME = "pcg64-polar-v1"

# Candidate (u, v) pairs per block of the raw stream. Part of the definition of the values
# (a block's first half gives u, its second half v): changing it changes every checkpoint.
# 2**16 keeps the float64 work arrays in the CPU cache (numpy is memory-bound here) while
# per-call overhead stays negligible.
BLOCK_PAIRS = 1 << 16
MAX_BLOCKS_IN_FLIGHT = 64  # bounds the memory of normals drawn ahead: 64 blocks ~ 53 MB

# fdlibm's e_log.c: ln 2 split so that k * LN2_HI is exact, and the minimax coefficients of
# R(z) with log(1+f) = f - f*f/2 + s*(f*f/2 + R(z)), s = f/(2+f), z = s*s. Error < 1 ulp.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1, _LG2, _LG3, _LG4, _LG5, _LG6, _LG7 = (
    6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
    1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)
_HALF_SQRT2_BITS = np.uint64(0x3FE6A09E667F3BCD)  # bits of the float64 nearest sqrt(2)/2
_ONE_MINUS_HALF_SQRT2_BITS = np.uint64(0x3FF0000000000000 - 0x3FE6A09E667F3BCD)
_MANTISSA_BITS = np.uint64((1 << 52) - 1)
_TWO_POW_52_BITS = np.uint64(0x4330000000000000)  # bits of 2.0**52
_U52 = np.uint64(52)


class _Workspace:
    """Preallocated work arrays for one thread: fresh large arrays per numpy call would spend
    more time in page faults than in arithmetic."""

    def __init__(self, n: int):
        self.size = n
        self.k, self.f, self.s, self.z, self.w, self.t1, self.t2, self.sq, self.lg = (np.empty(n) for _ in range(9))
        self.bits = np.empty(n, dtype=np.uint64)
        self.keep = np.empty(n, dtype=bool)
        self.scratch = np.empty(n, dtype=bool)


_workspaces = threading.local()


def _workspace(n: int) -> _Workspace:
    ws = getattr(_workspaces, "ws", None)
    if ws is None or ws.size != n:
        ws = _workspaces.ws = _Workspace(n)
    return ws


def _log_into(x: np.ndarray, out: np.ndarray, ws: _Workspace) -> np.ndarray:
    """out = ln(x) for positive normal (not subnormal) float64 x: fdlibm's log, vectorised.

    Branch-free, as musl does it: adding (1.0 - sqrt(2)/2) in bit space carries into the
    exponent exactly when the mantissa is >= sqrt(2), so x = 2**k * m with m in
    [sqrt(2)/2, sqrt(2)) comes from integer operations alone (masked or boolean-indexed numpy
    calls would be ten times slower).
    """
    k, f, s, z, w, t1, t2, ix = ws.k, ws.f, ws.s, ws.z, ws.w, ws.t1, ws.t2, ws.bits
    np.add(x.view(np.uint64), _ONE_MINUS_HALF_SQRT2_BITS, out=ix)
    # k = (ix >> 52) - 1023 as float64: OR the small int into the mantissa of 2**52, subtract.
    np.right_shift(ix, _U52, out=k.view(np.uint64))
    np.bitwise_or(k.view(np.uint64), _TWO_POW_52_BITS, out=k.view(np.uint64))
    k -= 2.0**52 + 1023.0
    np.bitwise_and(ix, _MANTISSA_BITS, out=ix)
    np.add(ix, _HALF_SQRT2_BITS, out=f.view(np.uint64))  # f = m in [sqrt(2)/2, sqrt(2)), exact
    f -= 1.0  # exact (Sterbenz)
    np.add(f, 2.0, out=s)
    np.divide(f, s, out=s)
    np.multiply(s, s, out=z)
    np.multiply(z, z, out=w)
    np.multiply(w, _LG6, out=t1); t1 += _LG4; t1 *= w; t1 += _LG2; t1 *= w  # noqa: E702
    np.multiply(w, _LG7, out=t2); t2 += _LG5; t2 *= w; t2 += _LG3; t2 *= w; t2 += _LG1; t2 *= z  # noqa: E702
    t2 += t1  # R
    np.multiply(f, f, out=t1)
    t1 *= 0.5  # hfsq
    t2 += t1
    t2 *= s  # s*(hfsq+R)
    np.multiply(k, _LN2_LO, out=z)
    t2 += z
    np.subtract(t1, t2, out=t1)
    t1 -= f  # (hfsq - (s*(hfsq+R) + k*ln2_lo)) - f
    np.multiply(k, _LN2_HI, out=out)
    out -= t1
    return out


def deterministic_log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive normal float64 values; bit-identical on every IEEE-754 machine."""
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    out = np.empty_like(x)
    for start in range(0, x.shape[0], BLOCK_PAIRS):
        part = x[start : start + BLOCK_PAIRS]
        _log_into(part, out[start : start + part.shape[0]], _Workspace(part.shape[0]))
    return out


def polar_normals(raw: np.ndarray) -> np.ndarray:
    """Standard normals from one block of `2 * BLOCK_PAIRS` raw 64-bit draws (Marsaglia's polar method).

    The block's first half gives u, its second half v (contiguous halves keep numpy fast), each
    with 52 random bits, uniform on [-1, 1). A pair with 0 < s = u^2+v^2 < 1 (pi/4 of them)
    gives u*r and v*r with r = sqrt(-2 ln(s) / s); other pairs give nothing. The block yields the
    accepted u*r in order, then the accepted v*r. `raw` is overwritten.
    """
    if raw.shape[0] != 2 * BLOCK_PAIRS:
        raise ValueError(f"a block is {2 * BLOCK_PAIRS} raw draws, got {raw.shape[0]}")
    ws = _workspace(BLOCK_PAIRS)
    # 52 random bits under the exponent of 1.0 give x in [1, 2); 2x - 3 is exact.
    np.right_shift(raw, np.uint64(12), out=raw)
    np.bitwise_or(raw, np.uint64(0x3FF0000000000000), out=raw)
    uv = raw.view(np.float64).reshape(2, BLOCK_PAIRS)
    uv *= 2.0
    uv -= 3.0
    u, v, sq = uv[0], uv[1], ws.sq
    np.multiply(u, u, out=sq)
    np.multiply(v, v, out=ws.t1)
    sq += ws.t1
    np.greater(sq, 0.0, out=ws.keep)
    np.less(sq, 1.0, out=ws.scratch)
    ws.keep &= ws.scratch
    # Rejected pairs (s >= 1, or s == 0 with odds 2**-104) turn into nan or garbage here; they
    # are dropped below, so their warnings are noise.
    with np.errstate(invalid="ignore", divide="ignore"):
        radius = _log_into(sq, ws.lg, ws)
        radius *= -2.0
        radius /= sq
        np.sqrt(radius, out=radius)
    uv *= radius
    # take() with indices: boolean indexing is several times slower here.
    return np.take(uv, np.flatnonzero(ws.keep), axis=1).reshape(-1)


class NormalStream:
    """Standard normals that are a pure function of `seed` (see the module docstring).

    The raw stream is cut into fixed blocks of `2 * BLOCK_PAIRS` draws, taken in order on the
    calling thread; `threads` worker threads transform successive blocks (numpy releases the
    GIL) and their normals are consumed in block order. Normals a request leaves over carry over
    to the next request, so how callers split their requests never changes the values.
    """

    def __init__(self, seed: int, threads: int | None = None):
        self.bit_generator = np.random.PCG64(seed)
        self.threads = threads or min(16, os.cpu_count() or 1)
        self._pending: deque[np.ndarray] = deque()

    def _refill(self, needed: int, pool: ThreadPoolExecutor | None) -> None:
        expected_per_block = 2 * BLOCK_PAIRS * math.pi / 4
        blocks = max(1, min(MAX_BLOCKS_IN_FLIGHT, math.ceil(needed / expected_per_block)))
        raws = [self.bit_generator.random_raw(2 * BLOCK_PAIRS) for _ in range(blocks)]
        self._pending.extend(pool.map(polar_normals, raws) if pool is not None else map(polar_normals, raws))

    def fill_normal(self, out: np.ndarray, std: float = 1.0) -> None:
        """Fill a contiguous float array with the next N(0, std) draws: each normal is scaled in
        float64, then rounded once to `out`'s dtype (round to nearest even)."""
        if not out.flags.c_contiguous:
            raise ValueError("fill_normal needs a C-contiguous array")
        flat, pos = out.reshape(-1), 0
        pool_cm = ThreadPoolExecutor(self.threads) if self.threads > 1 else contextlib.nullcontext()
        with pool_cm as pool:
            while pos < flat.shape[0]:
                if not self._pending:
                    self._refill(flat.shape[0] - pos, pool)
                z = self._pending.popleft()
                take = min(z.shape[0], flat.shape[0] - pos)
                part = z[:take]
                part *= std
                flat[pos : pos + take] = part
                if take < z.shape[0]:
                    self._pending.appendleft(z[take:])
                pos += take

    def standard_normal(self, n: int) -> np.ndarray:
        """The next `n` standard normals as float64."""
        out = np.empty(n, dtype=np.float64)
        self.fill_normal(out)
        return out


def init_tensors(config, rule: InitRule, seed: int, threads: int | None = None) -> dict[str, np.ndarray]:
    """The init as fp32 arrays in LLMC order (views of one contiguous buffer).

    The values depend on `config`, `rule` and `seed` only, never on `threads` or the machine.
    """
    flat = np.zeros(config.num_parameters(), dtype=np.float32)  # biases and padding rows stay 0
    tensors, offset = {}, 0
    for name, shape in config.tensor_shapes():
        n = math.prod(shape)
        tensors[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    normals = NormalStream(seed, threads=threads)
    for name, _ in config.tensor_shapes():  # LLMC file order decides which draws go where
        if name in rule.ones:
            tensors[name][...] = 1.0
        elif name in rule.stds:
            rows = rule.drawn_rows.get(name)
            normals.fill_normal(tensors[name][:rows] if rows is not None else tensors[name], rule.stds[name])
    return tensors


def write_initial_checkpoint(path: str | os.PathLike, family: ModelFamily, config, seed: int,
                             bf16: bool = False, what: str = "llm.c init checkpoint") -> None:
    """Write llm.c's init for `config` and `seed` as the family's LLMC checkpoint, atomically.
    A filesystem without room for it is refused before the (minutes of) drawing, not after."""
    check_free_space(Path(path).absolute().parent, family.layout(config, bf16).file_size, what, path=path)
    family.write(path, config, init_tensors(config, family.init_rule(config), seed), bf16=bf16)
