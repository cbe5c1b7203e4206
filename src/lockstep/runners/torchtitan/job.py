"""What the `torchtitan` runner hands its worker (the JOB.json torchtitan's config module reads).

Nothing here imports torchtitan: the runner (parent process) stays importable without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockstep.cases.spec import CaseSpec
from lockstep.models import config_from_dict
from lockstep.models import family as model_family

WORKER_MODULE = "lockstep.runners.torchtitan.worker"
CONFIG_MODULE = "lockstep.runners.torchtitan.titan_config"  # torchtitan's --module (a fully qualified path)
CONFIG_FUNCTION = "lockstep_case"  # torchtitan's --config
JOB_ENV = "LOCKSTEP_TORCHTITAN_JOB"  # the job file the config module reads
LOG_MARKER = "lockstep torchtitan runner"
SEED = 1234  # torchtitan's debug.seed (no dropout, no random init survives the LLMC weights: it changes nothing)
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class TorchtitanJob:
    """Everything the worker needs; written to JOB.json by the runner."""

    case: CaseSpec
    model: Any  # the family's config (from the checkpoint header)
    checkpoint: str
    tokens: str
    device: str  # "cpu" | "cuda"
    dump_folder: str  # torchtitan's dump_folder (nothing is written there: no checkpoints, no TensorBoard)
    model_name: str = ""
    error_path: str | None = None  # a failing worker writes its one-sentence error here
    results_path: str | None = None  # added by launch.run_workers
    final_params_path: str | None = None  # every parameter after the last step, canonical names (.npz)

    @property
    def optimizer(self):
        return self.case.optimizer_of(model_family(self.model.family).optimizer)

    def to_dict(self) -> dict:
        return {"case": self.case.to_dict(), "model": self.model.to_dict(), "checkpoint": self.checkpoint,
                "tokens": self.tokens, "device": self.device, "dump_folder": self.dump_folder,
                "model_name": self.model_name, "error_path": self.error_path, "results_path": self.results_path,
                "final_params_path": self.final_params_path}

    @classmethod
    def from_dict(cls, d: dict) -> "TorchtitanJob":
        return cls(case=CaseSpec.from_dict(d["case"]), model=config_from_dict(d["model"]), checkpoint=d["checkpoint"],
                   tokens=d["tokens"], device=d["device"], dump_folder=d["dump_folder"],
                   model_name=d.get("model_name", ""), error_path=d.get("error_path"),
                   results_path=d.get("results_path"), final_params_path=d.get("final_params_path"))
