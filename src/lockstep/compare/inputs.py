"""Whether two records trained from the same inputs: a loss comparison means something only then.

Records of `lockstep run` carry what a case started from: the initial weights' and the token
file's sha256 and the case spec (lr, batch, sequence length, steps, model) and the optimizer's
settings. Two records that differ in any of these are not comparable: the losses part because the
inputs do, so no verdict on the frameworks can be read from them (docs/reference/comparison.md).
What a framework lays out differently for the same math (DP, TP, PP, micro batch size) is no input.
Only what both records state is compared: a native log that states nothing is taken as it is.
"""

from __future__ import annotations

from lockstep.formats.run_record import RunRecord

# (meta key, what it is to a reader)
INPUT_HASHES = (("checkpoint_sha256", "initial weights"), ("data_sha256", "tokens"))
SPEC_FIELDS = ("model", "lr", "total_batch", "seq_len", "steps", "lr_schedule")


def _short(value) -> str:
    text = str(value)
    return text[:12] + "…" if len(text) > 16 else text


def input_differences(baseline: RunRecord, test: RunRecord) -> list[str]:
    """What differs between the inputs the two records trained from, one phrase each (empty: the same,
    as far as both records say)."""
    out = []
    for key, what in INPUT_HASHES:
        b, t = baseline.meta.get(key), test.meta.get(key)
        if b and t and b != t:
            out.append(f"{what} differ ({key.replace('_', ' ')} {_short(b)} vs {_short(t)})")
    b_spec, t_spec = baseline.meta.get("case_spec") or {}, test.meta.get("case_spec") or {}
    for key in SPEC_FIELDS:
        b, t = b_spec.get(key), t_spec.get(key)
        if b is not None and t is not None and b != t:
            out.append(f"{key} {b} vs {t}")
    b_opt, t_opt = baseline.meta.get("optimizer") or {}, test.meta.get("optimizer") or {}
    if isinstance(b_opt, dict) and isinstance(t_opt, dict):
        for key in sorted(set(b_opt) & set(t_opt)):
            if key != "lr" and b_opt[key] != t_opt[key]:  # lr: the case spec's, said above
                out.append(f"optimizer {key} {b_opt[key]} vs {t_opt[key]}")
    return out
