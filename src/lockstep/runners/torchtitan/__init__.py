"""The `torchtitan` framework: PyTorch's own large-scale trainer (torchtitan's `Trainer`), driven
without a fork through a config module of lockstep's (titan_config.py, torchtitan's `--module`).

runner.py (parent process, never imports torchtitan) starts worker.py (torchrun for several
ranks, one plain process for one), which runs torchtitan's `train.main()` after compat.py's
preparations; model.py builds torchtitan's Llama 3 / Qwen3 configs at the checkpoint's shape,
state_dict.py maps LLMC names to torchtitan's, capture.py records step 1 for the certificate.
`pip install -e '.[torchtitan]'` installs it.

This file registers it (`RUNNER`) and imports neither torchtitan nor torch: the CLI reads it at start.
"""

from lockstep.runners.registry import CAPTURE_AFTER_RUN, Capabilities, RunnerSpec
from lockstep.runners.torchtitan.options import INSTALL_HINT, torchtitan_installed
UNSUPPORTED = {
    "gpt2": "torchtitan has no GPT-2 model (learned positions, LayerNorm with biases, GELU MLP)",
    "mixtral": "torchtitan's MoE models (DeepSeek V3, Qwen3 MoE, Llama 4) have no Mixtral model with its routing",
}


def _available() -> str | None:
    return None if torchtitan_installed() else f"torchtitan is not installed ({INSTALL_HINT})"


RUNNER = RunnerSpec(
    name="torchtitan",
    runner="lockstep.runners.torchtitan.runner:TorchtitanRunner",
    summary="torchtitan's own Trainer (Llama 3, Qwen3) with lockstep's config module, under torchrun",
    # Its Trainer runs in a worker of its own: step 1 is captured after the run, with torchtitan's
    # model and loss in lockstep's process.
    capabilities=Capabilities(step1_capture=CAPTURE_AFTER_RUN, parallel=("dp", "zero", "tp", "sp"),
                              unsupported_families=UNSUPPORTED),
    available=_available,
    default=lambda options: False,
)


def __getattr__(name: str):
    if name == "TorchtitanRunner":
        from lockstep.runners.torchtitan.runner import TorchtitanRunner

        return TorchtitanRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
