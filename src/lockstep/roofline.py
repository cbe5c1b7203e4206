"""The shape roofline: how many tokens per second the device could train a case at if its
matrix multiplications were all it did (docs/reference/comparison.md#against-the-hardwares-limits-mfu-and-the-shape-roofline).

MFU divides by the device's datasheet peak, which no real GEMM of a small model reaches; the
shape roofline instead times the case's own GEMMs, at its micro batch B x sequence T, alone on the
run's device in the run's dtype, so "% of roofline" says how much of what the device really does
on these shapes a framework turns into training. The GEMMs (`case_gemms`): per transformer layer
the qkv projection, the attention output projection, the MLP (GPT-2: up, down; gated families:
up, gate, down; MoE: the router and the routed experts), then the output head, each as 3 GEMMs
(forward, input gradient, weight gradient; a LoRA case's frozen weights get no weight gradient and
its rank-r adapters are left out); and the attention's own batched products (QK^T and PV, and
their 4 gradients). Their FLOPs are PaLM's 6·N_matmul + 12·L·T·C per token less the norms' and
biases' parameters, the convention MFU uses.

roofline tok/s = devices x (B x T) / (the summed GEMM time of one micro step on one device):
like MFU's peak x devices, a job of several devices is credited with perfect scaling.

A measurement is cached per (device name, dtype, torch version, GEMM shapes) under lockstep's
cache directory (`<cache>/roofline/`); a cache file that cannot be read is measured again and
rewritten. Nothing here imports torch until something is measured.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The probe's time per case shape: a warm-up call per GEMM, then timed rounds within this budget.
PROBE_BUDGET_S = 2.0
ROUNDS = 3
CACHE_SUBDIR = "roofline"
RUN_JSON_KEY = "rooflines"  # run.json: case name -> ShapeRoofline.to_json()


@dataclass(frozen=True)
class Gemm:
    """`count` products of an (m x k) by a (k x n) matrix, each `batch` times (a batched matmul)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1
    batch: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch * self.count

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.m, self.n, self.k)


@dataclass(frozen=True)
class Linear:
    """A linear layer as the GEMMs see it: `rows` tokens through an in_features -> out_features weight."""

    name: str
    in_features: int
    out_features: int
    count: int  # how many such layers one micro step runs (the layers of the model)
    rows: int


def linear_gemms(layer: Linear, weight_gradient: bool = True) -> list[Gemm]:
    """Forward y = x Wᵀ, the input gradient dy W and the weight gradient dyᵀ x."""
    r, i, o, c = layer.rows, layer.in_features, layer.out_features, layer.count
    out = [Gemm(f"{layer.name} forward", r, o, i, c), Gemm(f"{layer.name} input gradient", r, i, o, c)]
    if weight_gradient:
        out.append(Gemm(f"{layer.name} weight gradient", o, i, r, c))
    return out


def _linears(config, tokens: int) -> list[Linear]:
    """The model's linear layers for `tokens` rows, from its config (every family lockstep knows)."""
    L, C = config.num_layers, config.channels
    heads = config.num_heads * config.head_dim
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    out = [Linear("qkv", C, qkv, L, tokens), Linear("attention out", heads, C, L, tokens)]
    F = config.ffn_hidden
    if hasattr(config, "num_experts"):  # MoE: every token runs top-k experts (balanced routing assumed)
        rows = tokens * config.router_topk
        out += [Linear("router", C, config.num_experts, L, tokens), Linear("expert up", C, F, L, rows),
                Linear("expert gate", C, F, L, rows), Linear("expert down", F, C, L, rows)]
    elif config.family == "gpt2":  # the one family with a plain (ungated) GELU MLP
        out += [Linear("mlp up", C, F, L, tokens), Linear("mlp down", F, C, L, tokens)]
    else:
        out += [Linear("mlp up", C, F, L, tokens), Linear("mlp gate", C, F, L, tokens),
                Linear("mlp down", F, C, L, tokens)]
    vocab = getattr(config, "padded_vocab_size", config.vocab_size)  # GPT-2's tied head multiplies all Vp rows
    return out + [Linear("lm head", C, vocab, 1, tokens)]


def attention_gemms(config, micro_batch: int, seq_len: int) -> list[Gemm]:
    """S = Q Kᵀ and O = P V per (sequence, head), and their gradients dP = dO Vᵀ, dV = Pᵀ dO,
    dQ = dS K, dK = dSᵀ Q (no causal discount, as the FLOPs convention)."""
    T, hd, L = seq_len, config.head_dim, config.num_layers
    b = micro_batch * config.num_heads
    return [Gemm("attention scores forward", T, T, hd, L, b), Gemm("attention values forward", T, hd, T, L, b),
            Gemm("attention scores gradient", T, T, hd, L, b), Gemm("attention values gradient", T, hd, T, L, b),
            Gemm("attention query gradient", T, hd, T, L, b), Gemm("attention key gradient", T, hd, T, L, b)]


def case_gemms(config, micro_batch: int, seq_len: int, lora: bool = False) -> list[Gemm]:
    """Every GEMM of one micro step (forward and backward) of the model on one device."""
    tokens = micro_batch * seq_len
    out = []
    for layer in _linears(config, tokens):
        out += linear_gemms(layer, weight_gradient=not lora)
    return out + attention_gemms(config, micro_batch, seq_len)


@dataclass(frozen=True)
class ShapeRoofline:
    """One case's roofline on one device: its GEMMs' time per micro step and the tok/s that gives."""

    device_name: str
    dtype: str
    micro_batch: int
    seq_len: int
    devices: int
    gemm_seconds: float  # every GEMM of one micro step on one device
    flops: int  # of those GEMMs
    cached: bool  # read from the cache rather than measured by this run
    probe_s: float  # what measuring it (or reading the cache) took

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.devices * self.tokens / self.gemm_seconds

    @property
    def tflops(self) -> float:
        """What the device did on these GEMMs, per device."""
        return self.flops / self.gemm_seconds / 1e12

    def to_json(self) -> dict:
        return {**asdict(self), "tokens": self.tokens, "tokens_per_s": self.tokens_per_s, "tflops": self.tflops}

    @classmethod
    def from_json(cls, d) -> "ShapeRoofline | None":
        """From run.json; None for anything that is not a roofline lockstep wrote."""
        try:
            out = cls(str(d["device_name"]), str(d["dtype"]), int(d["micro_batch"]), int(d["seq_len"]),
                      int(d["devices"]), float(d["gemm_seconds"]), int(d["flops"]), bool(d["cached"]),
                      float(d["probe_s"]))
        except (KeyError, TypeError, ValueError):
            return None
        return out if _positive(out.gemm_seconds) and out.tokens > 0 and out.devices > 0 else None


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


# -- measuring -----------------------------------------------------------------------------


def probe_device_name(device: str) -> str:
    """The name the cache is keyed by: the GPU's, or the CPU's model and torch's thread count."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"cpu {model or 'unknown'} ({torch.get_num_threads()} threads)"


def unique_shapes(gemms: list[Gemm]) -> dict[tuple[int, int, int, int], int]:
    """(batch, m, n, k) -> how many times one micro step runs it."""
    out: dict[tuple[int, int, int, int], int] = {}
    for g in gemms:
        out[g.shape] = out.get(g.shape, 0) + g.count
    return out


def time_gemms(gemms: list[Gemm], device: str, dtype: str, budget_s: float = PROBE_BUDGET_S) -> float:
    """Seconds of every GEMM of `gemms` once, each distinct shape timed alone within its share of
    `budget_s`: a warm-up call, then ROUNDS timed rounds of calls into a preallocated output
    (synchronized on a GPU); the fastest round's mean counts, as a roofline is what the device can do."""
    import torch

    from lockstep.step_contract import fp32_matmul_precision

    tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    shapes = unique_shapes(gemms)
    per_shape = budget_s / max(1, len(shapes))
    total = 0.0
    with fp32_matmul_precision(enabled_tf32=False), torch.no_grad():  # the contract's FP32: IEEE matmuls
        for (batch, m, n, k), count in shapes.items():
            total += count * _time_one(torch, (batch, m, n, k), torch.device(device), tdtype, per_shape)
    if device == "cuda":
        torch.cuda.empty_cache()  # the operands' memory back to the device for what runs after the probe
    return total


def _time_one(torch, shape, device, dtype, budget_s: float) -> float:
    batch, m, n, k = shape
    a = torch.randn((batch, m, k), device=device, dtype=dtype)
    b = torch.randn((batch, k, n), device=device, dtype=dtype)
    c = torch.empty((batch, m, n), device=device, dtype=dtype)

    def run(calls: int) -> float:
        _sync(torch, device)
        began = time.perf_counter()
        for _ in range(calls):
            torch.bmm(a, b, out=c)
        _sync(torch, device)
        return (time.perf_counter() - began) / calls

    first = max(run(1), 1e-7)  # warm-up (cuBLAS picks its kernel), and a first estimate of one call
    # A call slower than the budget allows for ROUNDS (a large head on a CPU) is timed once more.
    rounds = ROUNDS if first * ROUNDS <= budget_s else 1
    calls = max(1, min(200, int(budget_s / rounds / first)))
    return min(run(calls) for _ in range(rounds))


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the cache -------------------------------------------------------------------------------


def cache_key(name: str, dtype: str, torch_version: str, gemms: list[Gemm]) -> dict:
    return {"device_name": name, "dtype": dtype, "torch": torch_version,
            "shapes": sorted([*shape, count] for shape, count in unique_shapes(gemms).items())}


def cache_path(cache_dir: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return Path(cache_dir) / CACHE_SUBDIR / f"{digest}.json"


def read_cached(path: Path, key: dict) -> float | None:
    """The cached seconds for `key`, or None: no file, or one that is unreadable, of another key,
    or holds no positive time (it is then measured again and rewritten)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    seconds = doc.get("gemm_seconds")
    return float(seconds) if _positive(seconds) else None


def write_cached(path: Path, key: dict, seconds: float) -> None:
    """Write atomically (a reader never sees half a file); a cache that cannot be written only
    costs the next run a measurement."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "gemm_seconds": seconds}, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # no folder to have left it in
            pass


def measure_case(config, micro_batch: int, seq_len: int, dtype: str, device: str, devices: int,
                 cache_dir: Path, lora: bool = False, budget_s: float = PROBE_BUDGET_S) -> ShapeRoofline:
    """The case's roofline on `device`: from the cache, else measured (and cached)."""
    import torch

    began = time.perf_counter()
    gemms = case_gemms(config, micro_batch, seq_len, lora)
    name = probe_device_name(device)
    key = cache_key(name, dtype, torch.__version__, gemms)
    path = cache_path(cache_dir, key)
    seconds = read_cached(path, key)
    cached = seconds is not None
    if seconds is None:
        seconds = time_gemms(gemms, device, dtype, budget_s)
        write_cached(path, key, seconds)
    return ShapeRoofline(name, dtype, micro_batch, seq_len, devices, seconds, sum(g.flops for g in gemms), cached,
                         round(time.perf_counter() - began, 3))


# -- a run's rooflines -------------------------------------------------------------------------


def measure_run(cases: list, configs: dict, device: str, cache_dir: Path, say=lambda text: None) -> dict:
    """run.json's "rooflines" for the cases that trained: case name -> ShapeRoofline.to_json().
    A case whose probe fails (out of memory, a family shape it does not know) gets none, said
    once; the run and its verdicts go on, as a figure beside them must never take them down."""
    out = {}
    for case in cases:
        try:
            roofline = measure_case(configs[case.name], case.micro_batch, case.seq_len, case.dtype, device,
                                    case.world_size, cache_dir, lora=case.lora is not None)
        except Exception as e:  # torch's out-of-memory is a RuntimeError; a plugin family's config may lack a size
            first_line = (str(e).splitlines() or [type(e).__name__])[0]
            say(f"roofline of {case.name}: not measured ({first_line[:120]})")
            continue
        out[case.name] = roofline.to_json()
    return out


def roofline_of_record(record) -> ShapeRoofline | None:
    """The roofline `lockstep run` measured for a record's case, from the run.json of the run
    directory the record sits in (`<run>/<framework>/<case>.jsonl`); None elsewhere."""
    from lockstep.formats.run_manifest import manifest_path, read_manifest

    if not record.source or not Path(record.source).is_file():  # a record made in memory, not read from a run
        return None
    run_dir = Path(record.source).parent.parent
    if not manifest_path(run_dir).is_file():
        return None
    entry = (read_manifest(run_dir).get(RUN_JSON_KEY) or {}).get(record.case)
    return ShapeRoofline.from_json(entry) if isinstance(entry, dict) else None
