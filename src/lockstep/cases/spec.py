"""`CaseSpec`: one training case of the matrix, and the checks made before anything runs."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace

from lockstep.errors import CaseError

DTYPES = ("float32", "bfloat16")
ZERO_STAGES = (0, 1, 2)
# What a case may need beyond plain training; a runner lists the ones it supports
# (runners.base.FrameworkRunner.supports) and a case needing another is skipped with that reason.
NEEDS_LORA = "lora"
NEEDS_CHECKPOINT = "checkpoint"
NEED_TITLES = {NEEDS_LORA: "LoRA", NEEDS_CHECKPOINT: "checkpoint (save/resume)"}


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters on the linear layers named by `target_modules` (InfiniTrain's module names:
    a target matches a module path ending in it at a `.`, so `c_proj` is both attn.c_proj and
    mlp.c_proj). Only the adapters train; their output is scaled by alpha / rank
    (docs/reference/lora.md)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def label(self) -> str:
        return f"LoRA r={self.rank} alpha={self.alpha:g} on {','.join(self.target_modules)}"

    def problems(self) -> list[str]:
        out = []
        if self.rank < 1:
            out.append(f"lora rank is {self.rank}, must be at least 1")
        if not self.alpha > 0:
            out.append(f"lora alpha is {self.alpha}, must be positive")
        if not self.target_modules:
            out.append("lora target_modules is empty")
        return out


@dataclass(frozen=True)
class CheckpointSpec:
    """Saving during the run and resuming from a saved step (docs/reference/checkpoints.md).

    save_interval: save every N steps (and after the last); 0 never saves. resume_from: the
    step whose checkpoint the run starts from (None: from step 0); resume_case names the case
    that saved it. max_checkpoint_keep: the newest checkpoints kept (0: all)."""

    save_interval: int = 0
    resume_from: int | None = None
    resume_case: str | None = None
    save_optimizer_state: bool = True
    max_checkpoint_keep: int = 3

    @property
    def label(self) -> str:
        parts = [f"save every {self.save_interval}"] if self.save_interval else []
        if self.resume_from is not None:
            parts.append(f"resume at step {self.resume_from}" + (f" of {self.resume_case}" if self.resume_case else ""))
        if not self.save_optimizer_state:
            parts.append("no optimizer state")
        return ", ".join(parts) or "no save"

    def problems(self, steps: int) -> list[str]:
        out = []
        for f in ("save_interval", "max_checkpoint_keep"):
            if getattr(self, f) < 0:
                out.append(f"checkpoint {f} is {getattr(self, f)}, must not be negative")
        if self.resume_from is not None and not 0 < self.resume_from < steps:
            out.append(f"checkpoint resume_from is step {self.resume_from}, must be between 1 and {steps - 1} "
                       f"(the case runs {steps} steps)")
        if self.resume_case is not None and self.resume_from is None:
            out.append(f"checkpoint resume_case is {self.resume_case} but resume_from is not set")
        return out


LR_DECAY_STYLES = ("none", "constant", "linear", "cosine", "inverse-square-root")
RECOMPUTE_GRANULARITIES = ("none", "full", "selective")
RECOMPUTE_METHODS = ("none", "uniform", "block")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate per step (docs/reference/training-contract.md, cases/lr_schedule.py):
    a linear warm-up from `lr_warmup_init` to the case's `lr` (the peak) over `lr_warmup_iters`
    steps, then `lr_decay_style` down to `min_lr` by step `lr_decay_iters` (0: the case's steps).
    Style "none" is the constant case lr with no warm-up. Names and semantics as InfiniTrain's
    flags of the same names (Megatron's schedule as InfiniTrain ported it)."""

    lr_decay_style: str = "constant"
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: int = 0
    min_lr: float = 0.0

    def decay_iters(self, steps: int) -> int:
        return self.lr_decay_iters or steps

    @property
    def label(self) -> str:
        if self.lr_decay_style == "none":
            return "lr none"
        warm = f"warm-up {self.lr_warmup_iters} from {self.lr_warmup_init:g}, " if self.lr_warmup_iters else ""
        return f"lr {warm}{self.lr_decay_style} to {self.min_lr:g}"

    def problems(self, lr: float, steps: int) -> list[str]:
        """InfiniTrain's checks on the schedule (CreateLRScheduler), as sentences."""
        if self.lr_decay_style not in LR_DECAY_STYLES:
            return [f"lr_schedule lr_decay_style {self.lr_decay_style!r} is not one of {', '.join(LR_DECAY_STYLES)}"]
        if self.lr_decay_style == "none":
            return []
        out = []
        for f in ("lr_warmup_iters", "lr_warmup_init", "lr_decay_iters", "min_lr"):
            if getattr(self, f) < 0:
                out.append(f"lr_schedule {f} is {getattr(self, f)}, must not be negative")
        if self.min_lr > lr:
            out.append(f"lr_schedule min_lr {self.min_lr} is above the peak lr {lr}")
        if self.lr_warmup_init > lr:
            out.append(f"lr_schedule lr_warmup_init {self.lr_warmup_init} is above the peak lr {lr}")
        if not self.lr_warmup_iters < self.decay_iters(steps):
            out.append(f"lr_schedule lr_warmup_iters {self.lr_warmup_iters} must be below lr_decay_iters "
                       f"{self.decay_iters(steps)}")
        return out


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
    lora: LoraSpec | None = None
    checkpoint: CheckpointSpec | None = None
    # The section of the matrix the case comes from (InfiniTrain's test group: basic, zero, lora,
    # checkpoint); None for lockstep's own matrices.
    group: str | None = None
    # Expert parallelism (MoE families): the experts of every MoE layer split over `ep` of the DP
    # ranks, which then exchange tokens. It places experts, it does not change the math: a runner
    # without expert parallelism trains the case as its DP layout.
    ep: int = 1
    # The lr per step; None: the constant `lr` at every step (as style "none").
    lr_schedule: LRSchedule | None = None
    # Activation recompute (InfiniTrain's flags and defaults; megatron-core's TransformerConfig
    # names): it trades compute for memory and must not change a bit of the math.
    activation_recompute: bool = False
    recompute_granularity: str = "full"  # none | full | selective
    recompute_method: str = "none"  # none | uniform | block
    recompute_num_layers: int = 0  # transformer layers per recompute region (uniform / block)
    # Adam's beta2 where the case trains with another than its family's contract (a build that
    # hard-codes one, e.g. 0.95 in one framework's Qwen3 branch); None: the family's. `optimizer_of` applies it.
    adam_beta2: float | None = None

    @property
    def needs(self) -> frozenset[str]:
        """What the case needs beyond plain training (NEEDS_*), for runners.base's capability check."""
        out = set()
        if self.lora is not None:
            out.add(NEEDS_LORA)
        if self.checkpoint is not None:
            out.add(NEEDS_CHECKPOINT)
        return frozenset(out)

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

    def data_parallel_layout(self) -> "CaseSpec":
        """The case with TP, SP and PP (and VPP, a pipeline layout) folded away: the same DP ranks,
        micro batch, global batch and accumulation. TP/SP/PP split the same sums over more ranks;
        they do not change the contract's arithmetic (docs/reference/training-contract.md), so a
        trainer without them trains the case at this layout."""
        return replace(self, tp=1, pp=1, vpp=1, sp=False, pp_layout=None)

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
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        if self.lora is not None:
            parts.append(self.lora.label)
        if self.checkpoint is not None:
            parts.append(self.checkpoint.label)
        if self.lr_schedule is not None:
            parts.append(self.lr_schedule.label)
        if self.activation_recompute:
            parts.append(f"recompute {self.recompute_granularity}"
                         + (f" {self.recompute_method} {self.recompute_num_layers}" if self.recompute_method != "none"
                            else ""))
        if self.adam_beta2 is not None:
            parts.append(f"Adam beta2 {self.adam_beta2:g}")
        return " ".join(parts)

    def check(self, max_seq_len: int | None = None, available_tokens: int | None = None) -> "CaseSpec":
        """Raise CaseError naming the case and the numbers when the case cannot run."""
        n = self.name
        if self.dtype not in DTYPES:
            raise CaseError(f"case {n}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for f in ("micro_batch", "seq_len", "total_batch", "steps", "dp", "tp", "pp", "vpp", "ep"):
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
        if self.dp % self.ep:
            raise CaseError(f"case {n}: expert parallelism splits the data-parallel ranks, so ep={self.ep} "
                            f"must divide dp={self.dp}")
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
        problems = self._recompute_and_optimizer_problems() + (self.lora.problems() if self.lora else []) + \
            (self.checkpoint.problems(self.steps) if self.checkpoint else []) + \
            (self.lr_schedule.problems(self.lr, self.steps) if self.lr_schedule else [])
        if problems:
            raise CaseError(f"case {n}: {problems[0]}")
        if max_seq_len is not None and self.seq_len > max_seq_len:
            raise CaseError(f"case {n}: sequence length {self.seq_len} exceeds the model's maximum {max_seq_len}")
        if available_tokens is not None and self.tokens_needed > available_tokens:
            raise CaseError(
                f"case {n}: needs {self.tokens_needed} tokens ({self.steps} steps x {self.total_batch} tokens/step + 1) "
                f"but the token file holds {available_tokens}")
        return self

    def _recompute_and_optimizer_problems(self) -> list[str]:
        out = []
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            out.append(f"recompute_granularity {self.recompute_granularity!r} is not one of "
                       f"{', '.join(RECOMPUTE_GRANULARITIES)}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            out.append(f"recompute_method {self.recompute_method!r} is not one of {', '.join(RECOMPUTE_METHODS)}")
        if self.recompute_num_layers < 0:
            out.append(f"recompute_num_layers is {self.recompute_num_layers}, must not be negative")
        if self.adam_beta2 is not None and not 0.0 <= self.adam_beta2 < 1.0:
            out.append(f"adam_beta2 is {self.adam_beta2}, must be in [0, 1)")
        return out

    def optimizer_of(self, contract):
        """The optimizer this case trains with: its family's `contract` (an OptimizerSpec), with the
        case's Adam beta2 where it sets one. Every runner builds its optimizer from this."""
        if self.adam_beta2 is None or contract.kind != "adam":
            return contract
        return replace(contract, beta2=self.adam_beta2)

    def with_overrides(self, **kw) -> "CaseSpec":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def first_steps(self, steps: int, **kw) -> "CaseSpec":
        """This case trained for its first `steps` steps only (a state to start from, a resume, a
        drift): every step at this case's lr, so a decay over "the run's steps" keeps this run's."""
        schedule = self.lr_schedule
        if schedule is not None and schedule.lr_decay_iters == 0:
            schedule = replace(schedule, lr_decay_iters=schedule.decay_iters(self.steps))
        return replace(self, steps=steps, lr_schedule=schedule, **kw)

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
        values = {k: (float(v) if FIELD_TYPES[k] is float and v is not None else v) for k, v in d.items()}
        for key, sub in (("lora", LoraSpec), ("checkpoint", CheckpointSpec), ("lr_schedule", LRSchedule)):
            if values.get(key) is not None:
                values[key] = _sub_table(sub, values[key], f"{label}: {key}")
        return cls(**values)


# Each nested table's fields and their TOML types (a record's JSON writes tuples as arrays).
SUB_FIELD_TYPES: dict[type, dict[str, type]] = {
    LoraSpec: {"rank": int, "alpha": float, "target_modules": list},
    CheckpointSpec: {"save_interval": int, "resume_from": int, "resume_case": str, "save_optimizer_state": bool,
                     "max_checkpoint_keep": int},
    LRSchedule: {"lr_decay_style": str, "lr_warmup_iters": int, "lr_warmup_init": float, "lr_decay_iters": int,
                 "min_lr": float},
}
SUB_OPTIONAL_FIELDS = frozenset({"resume_from", "resume_case"})


def _sub_table(cls: type, d: dict, label: str):
    """A LoraSpec / CheckpointSpec / LRSchedule from its table, every key and type checked (CaseError naming it)."""
    types = SUB_FIELD_TYPES[cls]
    unknown = sorted(set(d) - set(types))
    if unknown:
        raise CaseError(f"{label}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(types))})")
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
    if missing:
        raise CaseError(f"{label}: missing field(s) {', '.join(missing)}")
    out = {}
    for key, value in d.items():
        want = types[key]
        if value is None and key in SUB_OPTIONAL_FIELDS:
            out[key] = None
            continue
        if want is list:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise CaseError(f"{label}.{key} = {value!r:.40} is {_toml_type(value)}, but {key} must be an array "
                                "of strings")
            out[key] = tuple(value)
            continue
        if not _has_type(value, want):
            raise CaseError(f"{label}.{key} = {value!r:.40} is {_toml_type(value)}, "
                            f"but {key} must be {_toml_type_name(want)}")
        out[key] = float(value) if want is float else value
    return cls(**out)


# The TOML type of each CaseSpec field (lr may be written as an integer, e.g. `lr = 1`).
FIELD_TYPES: dict[str, type] = {"name": str, "model": str, "dtype": str, "micro_batch": int, "seq_len": int,
                                "total_batch": int, "steps": int, "lr": float, "dp": int, "tp": int, "pp": int,
                                "vpp": int, "sp": bool, "zero": int, "pp_layout": str, "lora": dict,
                                "checkpoint": dict, "group": str, "ep": int, "lr_schedule": dict,
                                "activation_recompute": bool, "recompute_granularity": str, "recompute_method": str,
                                "recompute_num_layers": int, "adam_beta2": float}
# Fields whose "not set" is None (a record's case, written back by to_dict()); TOML never writes None.
OPTIONAL_FIELDS = frozenset({"pp_layout", "lora", "checkpoint", "group", "lr_schedule", "adam_beta2"})


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
