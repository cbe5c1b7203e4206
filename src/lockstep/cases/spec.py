"""`CaseSpec`: one training case of the matrix, and the checks made before anything runs."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace

from lockstep.errors import CaseError

DTYPES = ("float32", "bfloat16")
ZERO_STAGES = (0, 1, 2)


@dataclass(frozen=True)
class CaseSpec:
    name: str
    model: str  # a registered model shape (e.g. gpt2, llama3-tiny, qwen3-1.7b); its family sets the contract
    dtype: str  # "float32" | "bfloat16" (bf16 = autocast forward, fp32 params and optimizer)
    micro_batch: int  # B, sequences per micro step per DP rank
    seq_len: int  # T
    total_batch: int  # tokens per optimizer step, over all ranks and micro steps
    steps: int
    lr: float
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    sp: bool = False
    # ZeRO stage over the DP ranks: 0 plain data parallel, 1 optimizer state sharded, 2 also
    # gradients sharded. Every stage must train exactly like plain DP (only memory differs).
    zero: int = 0
    # megatron-core's pipeline_model_parallel_layout (e.g. "Et*5|t*5|t*4L": one `|`-separated
    # stage per PP x VPP chunk, E embedding, t a transformer layer, L the loss), for uneven
    # splits; None: megatron-core's even split. Only pipeline-parallel frameworks read it.
    pp_layout: str | None = None

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def tokens_per_micro_step(self) -> int:
        return self.micro_batch * self.seq_len * self.dp

    @property
    def accum(self) -> int:
        """Gradient-accumulation steps; `check()` guarantees it divides exactly."""
        return self.total_batch // self.tokens_per_micro_step

    @property
    def tokens_needed(self) -> int:
        """Tokens a run reads: every step's window plus the one target after the last."""
        return self.steps * self.total_batch + 1

    @property
    def is_bf16(self) -> bool:
        return self.dtype == "bfloat16"

    @property
    def parallel_label(self) -> str:
        parts = [f"DP={self.dp}"]
        if self.tp > 1:
            parts.append(f"TP={self.tp}" + ("+SP" if self.sp else ""))
        if self.pp > 1:
            parts.append(f"PP={self.pp}" + (f"xVPP={self.vpp}" if self.vpp > 1 else "")
                         + (f" layout {self.pp_layout}" if self.pp_layout else ""))
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        return " ".join(parts)

    def check(self, max_seq_len: int | None = None, available_tokens: int | None = None) -> "CaseSpec":
        """Raise CaseError naming the case and the numbers when the case cannot run."""
        n = self.name
        if self.dtype not in DTYPES:
            raise CaseError(f"case {n}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for f in ("micro_batch", "seq_len", "total_batch", "steps", "dp", "tp", "pp", "vpp"):
            if getattr(self, f) < 1:
                raise CaseError(f"case {n}: {f} is {getattr(self, f)}, must be at least 1")
        if not self.lr > 0:
            raise CaseError(f"case {n}: lr is {self.lr}, must be positive")
        if self.total_batch % self.tokens_per_micro_step:
            raise CaseError(
                f"case {n}: impossible batch split: tokens/step {self.total_batch} is not divisible by "
                f"B*T*DP = {self.micro_batch}*{self.seq_len}*{self.dp} = {self.tokens_per_micro_step}")
        if self.sp and self.tp == 1:
            raise CaseError(f"case {n}: sequence parallel needs TP > 1")
        if self.zero not in ZERO_STAGES:
            raise CaseError(f"case {n}: zero is {self.zero}, must be one of {', '.join(map(str, ZERO_STAGES))}")
        if self.zero and self.dp == 1:
            raise CaseError(f"case {n}: ZeRO shards over data-parallel ranks, so zero={self.zero} needs dp > 1")
        if self.pp_layout is not None:
            from lockstep.cases.pipeline_layout import parse_pipeline_layout

            stages = parse_pipeline_layout(self.pp_layout, where=f"case {n}")
            if len(stages) != self.pp * self.vpp:
                raise CaseError(f"case {n}: pp_layout {self.pp_layout!r} has {len(stages)} stage(s), but PP x VPP = "
                                f"{self.pp} x {self.vpp} = {self.pp * self.vpp}")
        if max_seq_len is not None and self.seq_len > max_seq_len:
            raise CaseError(f"case {n}: sequence length {self.seq_len} exceeds the model's maximum {max_seq_len}")
        if available_tokens is not None and self.tokens_needed > available_tokens:
            raise CaseError(
                f"case {n}: needs {self.tokens_needed} tokens ({self.steps} steps x {self.total_batch} tokens/step + 1) "
                f"but the token file holds {available_tokens}")
        return self

    def with_overrides(self, **kw) -> "CaseSpec":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CaseSpec":
        """Build a case from a matrix table, checking every key and type (CaseError naming the key)."""
        name = d.get("name", "?")
        label = f"case {name}" if isinstance(name, str) else "a case"
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise CaseError(f"{label}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise CaseError(f"{label}: missing field(s) {', '.join(missing)}")
        for key, value in d.items():
            want = FIELD_TYPES[key]
            if value is None and key in OPTIONAL_FIELDS:
                continue
            if not _has_type(value, want):
                raise CaseError(f"{label}: {key} = {value!r:.40} is {_toml_type(value)}, "
                                f"but {key} must be {_toml_type_name(want)}")
        return cls(**{k: (float(v) if FIELD_TYPES[k] is float else v) for k, v in d.items()})


# The TOML type of each CaseSpec field (lr may be written as an integer, e.g. `lr = 1`).
FIELD_TYPES: dict[str, type] = {"name": str, "model": str, "dtype": str, "micro_batch": int, "seq_len": int,
                                "total_batch": int, "steps": int, "lr": float, "dp": int, "tp": int, "pp": int,
                                "vpp": int, "sp": bool, "zero": int, "pp_layout": str}
# Fields whose "not set" is None (a record's case, written back by to_dict()); TOML never writes None.
OPTIONAL_FIELDS = frozenset({"pp_layout"})


def _has_type(value, want: type) -> bool:
    if want is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # bool is an int in Python, never in a matrix
    if want is float:
        return isinstance(value, (int, float))
    return isinstance(value, want)


def _toml_type_name(t: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean (true/false)",
            dict: "a table", list: "an array"}.get(t, t.__name__)


def _toml_type(value) -> str:
    return _toml_type_name(type(value)) if isinstance(value, (str, bool, int, float, dict, list)) else type(value).__name__


def dtype_of_case_name(case_name: str) -> str:
    return "bfloat16" if case_name.endswith(("_bfloat16", "_bf16")) else "float32"
