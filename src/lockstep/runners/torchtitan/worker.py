"""The torchtitan worker: `python -m lockstep.runners.torchtitan.worker JOB.json`, one per rank
(under torchrun for several ranks, a plain process for one).

It runs torchtitan's own entry point, `torchtitan.train.main()`, as `torchtitan.train --module
lockstep.runners.torchtitan.titan_config --config lockstep_case` would, after what lockstep must
do first in the process (compat.py: the CPU device, stand-ins for TensorBoard and datasets where
they are missing). The config module reads the job file named by LOCKSTEP_TORCHTITAN_JOB and
streams each step to the parent; torchtitan's own log lines go to the case's native log.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from lockstep.runners.torchtitan.job import CONFIG_FUNCTION, CONFIG_MODULE, JOB_ENV, LOG_MARKER


def write_error(error_path: str | None, text: str) -> None:
    """The first failing rank's one-sentence error, for the runner's RunError."""
    if not error_path:
        return
    try:
        with open(error_path, "x") as f:
            f.write(text)
    except FileExistsError:
        pass


def train(job_path: str) -> None:
    """torchtitan's `train.main()` on the job's case."""
    from lockstep.runners.torchtitan import compat

    job = json.loads(Path(job_path).read_text())
    compat.prepare(job["device"])
    os.environ[JOB_ENV] = job_path
    print(f"{LOG_MARKER} | case {job['case']['name']} | torchtitan.train --module {CONFIG_MODULE} "
          f"--config {CONFIG_FUNCTION}", flush=True)
    import torchtitan.train

    sys.argv = ["torchtitan.train", "--module", CONFIG_MODULE, "--config", CONFIG_FUNCTION]
    torchtitan.train.main()


def main(argv: list[str]) -> int:
    from lockstep.runners.launch import end_with_parent

    end_with_parent()  # first: a killed lockstep or torchrun must not leave this rank training
    from lockstep.runners.mkl_vml import settle_mkl_vml_dispatch
    from lockstep.runners.test_plugins import apply_test_plugins

    apply_test_plugins()
    settle_mkl_vml_dispatch()
    error_path = json.loads(Path(argv[0]).read_text()).get("error_path")
    try:
        train(argv[0])
    except Exception as e:
        traceback.print_exc()
        write_error(error_path, f"rank {int(os.environ.get('RANK', 0))}: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
