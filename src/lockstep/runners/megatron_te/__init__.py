"""The `megatron-te` framework: megatron-core's GPTModel built from Transformer Engine's layer spec
(TE's fused LayerNorm+Linear and Linear layers, TE's DotProductAttention), on CUDA only.

A variant of the `megatron` runner: the same runner class, worker and family adapters
(runners/megatron/), told apart by its options (`MegatronTEOptions`, runners/megatron/job.py);
what those options change is runners/megatron/te_spec.py.

This file registers it (`RUNNER`) and imports neither megatron-core nor torch: the CLI reads it at start.
"""

from lockstep.runners.megatron import _available as _megatron_available
from lockstep.runners.megatron.job import MegatronTEOptions
from lockstep.runners.registry import CAPTURE_NONE, Capabilities, RunnerSpec


def _available() -> str | None:
    from lockstep.runners.megatron.te_spec import transformer_engine_missing

    return _megatron_available() or transformer_engine_missing()


RUNNER = RunnerSpec(
    name="megatron-te",
    runner="lockstep.runners.megatron.runner:MegatronTERunner",
    summary="megatron-core with Transformer Engine's layer spec (CUDA only; one device)",
    capabilities=Capabilities(step1_capture=CAPTURE_NONE, devices=("cuda",),
                              family_adapters="lockstep.runners.megatron.families",
                              unsupported_families={"mixtral": "megatron-te trains the dense families only (its "
                                                               "grouped expert GEMMs are not tried)"}),
    options_type=MegatronTEOptions,
    available=_available,
    # Not in the default set: `--frameworks pytorch,megatron,megatron-te` asks for it.
    default=lambda options: False,
    variant_of="megatron",
)
