"""megatron mixtral_tp2 (TP=2+SP) against the reference's mixtral_1 of the same checkpoint and data
(the same step: B=4, T=64, 256 tokens; the reference trains no TP): every step's loss, and the
step-1 certificate of the two captures."""
import sys
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.certify.certificate import certify
from lockstep.formats.run_record import read_run_record
from lockstep.formats.step_capture import StepCapture

out = Path(sys.argv[1])
ref, tp2 = (read_run_record(out / fw / f"{c}.jsonl") for fw, c in (("pytorch", "mixtral_1"), ("megatron", "mixtral_tp2")))
diffs = [abs(a - b) for a, b in zip(ref.losses(), tp2.losses())]
print(f"steps {len(diffs)}, max |dloss| megatron TP=2+SP vs pytorch {max(diffs):.3e} at step {diffs.index(max(diffs)) + 1}")
ref_cap, tp2_cap = StepCapture.load(out / "step1/pytorch/mixtral_1.npz"), StepCapture.load(out / "step1/megatron/mixtral_tp2.npz")
cert = certify(ref_cap, tp2_cap, CaseSpec.from_dict(ref_cap.meta["case"]))
print(f"step-1 certificate megatron mixtral_tp2 vs pytorch mixtral_1: {cert.summary_line()}")
