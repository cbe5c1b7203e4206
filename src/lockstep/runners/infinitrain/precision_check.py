"""InfiniTrain's own module-output dumps (`--precision_check`), read back under canonical names.

With `--precision_check level=1,save_tensors=true,path=DIR` (b24d92f: utils/precision_checker.cc)
every module hook writes its output as `DIR/<timestamp>/rank_<r>/<module>[_<k>]_forward.npy`
(FP32; `_backward.npy` for the gradient at its output), where k counts the calls within a step,
so k = 0 is the first micro batch. lockstep uses rank 0's k = 0 files: the same micro batch its
reference capture records. Module names are InfiniTrain's paths (`transformer.h.3.ln_2`),
the same for its gpt2 and llama3 examples.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError

# The flag value; the key of the output directory is `path` (its parser ignores `output_path`).
def precision_check_flag(out_dir: Path) -> str:
    return f"--precision_check=level=1,save_tensors=true,path={out_dir}"


UNSUPPORTED_MARK = "precision_check"  # in gflags' "unknown command line flag" error of an older build

_LAYER = {"ln_1": "ln1", "attn.c_proj": "attproj", "ln_2": "ln2", "mlp": "mlp"}
_TOP = {"TransformerFirstStage": "embedding", "transformer.ln_f": "lnf", "lm_head": "logits"}


def canonical_output_name(module: str) -> str | None:
    """InfiniTrain module path -> the canonical module-output name lockstep's captures use, or None."""
    if module in _TOP:
        return _TOP[module]
    m = re.fullmatch(r"transformer\.h\.(\d+)(?:\.(.+))?", module)
    if not m:
        return None
    layer, sub = int(m.group(1)), m.group(2)
    if sub is None:
        return f"block[{layer}]"
    return f"{_LAYER[sub]}[{layer}]" if sub in _LAYER else None


def read_module_outputs(out_dir: Path, rank: int = 0, stage: str = "forward") -> dict[str, np.ndarray]:
    """Rank `rank`'s first-micro-batch module outputs under canonical names (empty when none were
    written); with stage "backward", the gradient that arrived at each of those outputs."""
    runs = sorted(p for p in Path(out_dir).glob("*/") if p.is_dir())
    if not runs:
        return {}
    rank_dir = runs[-1] / f"rank_{rank}"
    out = {}
    for path in sorted(rank_dir.glob(f"*_{stage}.npy")):
        # Only exact module names map: a later call in the step (`mlp_1`, `ln_1_1`, `transformer.h.0_1`)
        # names no module (and `ln_1` is the module ln_1, not a second call of some `ln`).
        name = canonical_output_name(path.name[: -len(f"_{stage}.npy")])
        if name is None:
            continue
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise FormatError(path, f"unreadable InfiniTrain precision-check dump ({e})") from None
    return out
