"""InfiniTrain's `tiny_mixtral` example (branch feat/support_moe, b7e0760) for the Mixtral family.

Facts of its example/tiny_mixtral/ (main.cc, config.h, checkpoint_loader.cc) this adapter follows
(docs/reference/infinitrain.md#mixtral-tiny_mixtral):
- its flags are its own: `--micro_batch_size` (B) and `--global_batch_size` in *sequences*
  (accumulation = global / micro), `--log_interval`, no `--batch_size`, `--total_batch_size` nor
  `--nthread_per_process` (gflags stops at an unknown flag);
- one device only: main.cc calls InitAllEnv(1 thread, TP 1, no SP, PP 1, VPP 1) and config.h CHECKs
  EP = 1; it has no parallel flag, no --save/--load, no LoRA, no --precision_check;
- its shape is compiled in (config.h): the loader compares every header field with it and stops at
  the first that differs, `<field> value from checkpoint (a) is not equal to runtime config value
  (b)`. Which shape a build has is asked of the build (`compiled_shape`), never assumed;
- Adam::Create(lr) with the defaults of optimizer.h (β 0.9/0.999, eps 1e-8);
- its step line goes to stdout through std::cout, without glog's prefix.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import LockstepError
from lockstep.formats.llmc import CheckpointLayout
from lockstep.models.family import OptimizerSpec
from lockstep.models.mixtral.checkpoint import MIXTRAL_MAGIC, VERSION_FP32, encode_header
from lockstep.models.mixtral.config import MixtralConfig
from lockstep.runners.infinitrain.families import InfiniTrainFamily, TestConfigExample
from lockstep.runners.infinitrain.probe import last_lines, loader_output

# main.cc: `Adam::Create(static_cast<float>(FLAGS_learning_rate))`, optimizer.h's defaults.
TINY_MIXTRAL_HARD_CODED_ADAM = OptimizerSpec("adam", beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)

# CheckLLMCConfig's field names (checkpoint_loader.cc:77-96) -> MixtralConfig's, in the order it compares.
LOADER_FIELDS = {"block_size": "max_seq_len", "vocab_size": "vocab_size", "n_layer": "num_layers",
                 "n_head": "num_heads", "n_kv_head": "num_kv_heads", "n_embd": "channels",
                 "ffn_expansion_ratio": "ffn_expansion_ratio", "norm_eps": "norm_eps", "rope_theta": "rope_theta",
                 "num_experts": "num_experts", "router_topk": "router_topk",
                 "moe_ffn_hidden_size": "moe_ffn_hidden_size"}
_FLOAT_FIELDS = {"ffn_expansion_ratio", "norm_eps", "rope_theta"}
# The last field compared. The probe's header holds a value no build compiles in, so the loader always
# stops at a comparison, never goes on to allocate the model (3.4 GB for b7e0760's shape).
LAST_FIELD = "moe_ffn_hidden_size"
NO_BUILD_HAS_F = 2**31 - 1
_REFUSAL = re.compile(r"(?P<name>\w+) value from checkpoint \((?P<file>[^()]*)\) is not equal to runtime config "
                      r"value \((?P<build>[^()]*)\)")


def compiled_shape(exe: Path, start: MixtralConfig = MixtralConfig()) -> MixtralConfig:
    """The shape compiled into `exe`, from its loader's refusals: a header-only file of `start`'s shape
    (F set to NO_BUILD_HAS_F) is refused at its first field that differs, naming the build's value; that
    value goes into the next file, until the refusal is the last field's. One run for a build of
    `start`'s shape, at most one per field otherwise."""
    known: dict[str, int | float] = {}
    for _ in range(len(LOADER_FIELDS)):
        probe = dataclasses.replace(start, **known, moe_ffn_hidden_size=NO_BUILD_HAS_F)
        text = loader_output(exe, encode_header(CheckpointLayout(VERSION_FP32, probe, "fp32")), "shape.bin")
        m = _REFUSAL.search(text)
        if m is None:
            raise LockstepError(f"cannot tell which Mixtral shape {exe} has compiled in: given a header-only file it "
                                f"did not refuse a field with `... value from checkpoint (a) is not equal to runtime "
                                f"config value (b)`; its output ended: {last_lines(text) or '(nothing)'}")
        name = m["name"]
        if name not in LOADER_FIELDS or LOADER_FIELDS[name] in known:
            raise LockstepError(f"{exe} refuses every Mixtral header lockstep can write: {m.group(0)}")
        field = LOADER_FIELDS[name]
        try:
            known[field] = float(m["build"]) if field in _FLOAT_FIELDS else int(m["build"])
        except ValueError:
            raise LockstepError(f"{exe} states its compiled-in {name} as {m['build']!r}, not a number") from None
        if name == LAST_FIELD:
            return dataclasses.replace(start, **known)
    raise LockstepError(f"{exe} refused more Mixtral header fields than its loader compares")


def shape_label(config: MixtralConfig) -> str:
    from lockstep.models import SHAPES

    names = [name for name, shape in SHAPES.items() if shape.config == config]
    described = f"{config.describe()}, max T {config.max_seq_len}"
    return f"{names[0]} ({described})" if names else described


def _value(v: int | float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)  # float32 header values as the loader prints them


def shape_differences(model: MixtralConfig, compiled: MixtralConfig) -> list[str]:
    """`num_layers 2 (build: 32)` for every field in which the case's model and the build's differ."""
    return [f"{f.name} {_value(getattr(model, f.name))} (build: {_value(getattr(compiled, f.name))})"
            for f in dataclasses.fields(MixtralConfig) if getattr(model, f.name) != getattr(compiled, f.name)]


@dataclass(frozen=True)
class MixtralFamily(InfiniTrainFamily):
    def batch_flags(self, case: CaseSpec, threads: int) -> list[str]:
        # Its global batch counts sequences (tokens per step = global_batch_size * T, main.cc:109), and
        # --log_interval 1 prints every step (its default, said so that a changed default cannot hide steps).
        sequences = case.total_batch // case.seq_len
        return ["--micro_batch_size", str(case.micro_batch), "--global_batch_size", str(sequences),
                "--log_interval", "1"]

    def preflight(self, model, checkpoint: Path, optimizer: OptimizerSpec) -> None:
        if optimizer != TINY_MIXTRAL_HARD_CODED_ADAM:
            raise LockstepError(f"InfiniTrain's {self.executable} hard-codes {TINY_MIXTRAL_HARD_CODED_ADAM.label}, "
                                f"the contract asks for {optimizer.label}")

    def probe(self, facts):
        if facts.llmc_version != VERSION_FP32:
            return facts  # build_skip_reason says so; a shape probe of another layout means nothing
        return dataclasses.replace(facts, compiled_model=compiled_shape(facts.path))

    def build_skip_reason(self, case: CaseSpec, model, optimizer: OptimizerSpec, facts) -> str | None:
        if facts.llmc_version != VERSION_FP32:
            return (f"this InfiniTrain build's {facts.path.name} reads Mixtral LLMC version {facts.llmc_version}; "
                    f"lockstep writes version {VERSION_FP32} (branch feat/support_moe, b7e0760)")
        compiled = facts.compiled_model
        if compiled is not None and model != compiled:
            return (f"this InfiniTrain build's {facts.path.name} trains only the shape compiled into it "
                    f"(example/tiny_mixtral/config.h), {shape_label(compiled)}; this model differs in "
                    + ", ".join(shape_differences(model, compiled)))
        return None


ADAPTER = MixtralFamily(
    "mixtral", "tiny_mixtral", optional=True, probe_magic=MIXTRAL_MAGIC, glog_step_lines=False,
    missing_note="only InfiniTrain's branch feat/support_moe (b7e0760) has one",
    one_device_only=("its main.cc fixes one thread, TP=1 and PP=1 (InitAllEnv(1, 1, false, 1, 1)) and config.h "
                     "CHECKs EP=1; it has no parallel flag"),
    # example/tiny_mixtral/main.cc at b7e0760: its own flags (batch sizes in sequences), one device; the
    # MoE branch's driver runs it on the `moe` group only.
    test_config=TestConfigExample(
        order=2, log_prefix="tiny_mixtral", default_shape="mixtral-l32-c512", groups_variable="MIXTRAL_TEST_GROUPS",
        default_groups=("moe",), groups_without_variables=("moe",),
        input_variables=("MIXTRAL_INPUT_BIN", "MIXTRAL_LLMC_FILEPATH"),
        arg_types={"micro_batch_size": int, "global_batch_size": int, "sequence_length": int, "num_iteration": int,
                   "learning_rate": float, "dtype": str},
        flag_defaults={"micro_batch_size": 4, "global_batch_size": 4, "sequence_length": 64, "num_iteration": 10,
                       "learning_rate": 1e-4, "dtype": "float32"},
        sequence_batches=True))
