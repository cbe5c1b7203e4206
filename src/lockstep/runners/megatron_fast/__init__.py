"""The `megatron-fast` framework: megatron-core with what it offers without Transformer Engine or
Apex -- torch SDPA as the core attention, megatron-core's fused bias+activation, bias+dropout+add
and (BF16) cross entropy, and on request its local CUDA graphs on a GPU.

A variant of the `megatron` runner: the same runner class, worker and family adapters
(runners/megatron/), told apart by its options (`MegatronFastOptions`, runners/megatron/job.py);
what those options change is runners/megatron/fast.py.

This file registers it (`RUNNER`) and imports neither megatron-core nor torch: the CLI reads it at start.
"""

from lockstep.runners.megatron import _available
from lockstep.runners.megatron.job import MegatronFastOptions
from lockstep.runners.registry import ALL_LAYOUTS, CAPTURE_WHILE_TRAINING, Capabilities, RunnerSpec


def _add_arguments(parser) -> None:
    parser.add_argument("--megatron-fast-cuda-graphs", action="store_true",
                        help="megatron-fast: megatron-core's local CUDA graphs on a GPU (per layer; off in a run "
                             "that records step 1)")
    parser.add_argument("--megatron-fast-no-fusions", action="store_true",
                        help="megatron-fast: SDPA attention only, without megatron-core's fused kernels")


def _options_from(args) -> MegatronFastOptions:
    return MegatronFastOptions(cuda_graphs=bool(getattr(args, "megatron_fast_cuda_graphs", False)),
                               fusions=not getattr(args, "megatron_fast_no_fusions", False))


RUNNER = RunnerSpec(
    name="megatron-fast",
    runner="lockstep.runners.megatron.runner:MegatronFastRunner",
    summary="megatron-core with torch SDPA attention and its own fused kernels (no Transformer Engine or Apex)",
    capabilities=Capabilities(step1_capture=CAPTURE_WHILE_TRAINING, parallel=ALL_LAYOUTS,
                              family_adapters="lockstep.runners.megatron.families"),
    options_type=MegatronFastOptions,
    add_arguments=_add_arguments,
    options_from=_options_from,
    available=_available,
    # Not in the default set: `--frameworks pytorch,megatron-fast` (or megatron,megatron-fast) asks for it.
    default=lambda options: False,
    variant_of="megatron",
)
