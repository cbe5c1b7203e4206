"""The `megatron` framework: NVIDIA megatron-core's GPTModel built from the LLMC weights.

runner.py (parent process, never imports megatron-core) launches worker.py under torchrun;
the worker uses model.py (TransformerConfig, GPTModel chunks, DDP, optimizer), weights.py
(LLMC -> Megatron layout, sharded for TP/PP), dataset.py (indexed dataset + GPTDataset with
the identity shuffle), parallel.py (the process grid), checkpoint.py (save/resume through
megatron-core's dist_checkpointing), one adapter per model family
(families/<family>.py) and, without CUDA, cpu_shims.py.

This file registers it (`RUNNER`) and imports neither megatron-core nor torch: the CLI reads it at start.
"""

from lockstep.runners.megatron.options import INSTALL_HINT, megatron_core_installed  # noqa: F401
from lockstep.runners.registry import ALL_LAYOUTS, CAPTURE_WHILE_TRAINING, Capabilities, RunnerSpec


def _add_arguments(parser) -> None:
    parser.add_argument("--megatron-native-bf16", action="store_true",
                        help="diagnostic: Megatron's native bf16 parameters instead of autocast")


def _options_from(args):
    from lockstep.runners.megatron.job import MegatronOptions

    return MegatronOptions(native_bf16=bool(getattr(args, "megatron_native_bf16", False)))


def _options_type():
    from lockstep.runners.megatron.job import MegatronOptions

    return MegatronOptions


def _available() -> str | None:
    return None if megatron_core_installed() else f"megatron-core is not installed ({INSTALL_HINT})"


def _default(options) -> bool | str:
    return True if megatron_core_installed() else f"megatron-core is not installed ({INSTALL_HINT}): megatron is left out"


RUNNER = RunnerSpec(
    name="megatron",
    runner="lockstep.runners.megatron.runner:MegatronRunner",
    summary="NVIDIA megatron-core's GPTModel, trained by megatron-core under torchrun",
    capabilities=Capabilities(step1_capture=CAPTURE_WHILE_TRAINING, parallel=ALL_LAYOUTS,
                              family_adapters="lockstep.runners.megatron.families"),
    options_type=_options_type(),
    add_arguments=_add_arguments,
    options_from=_options_from,
    available=_available,
    default=_default,
)


def __getattr__(name: str):
    if name == "MegatronRunner":
        from lockstep.runners.megatron.runner import MegatronRunner

        return MegatronRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
