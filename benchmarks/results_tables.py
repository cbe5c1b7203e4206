"""Markdown tables for the README from a results directory of benchmarks/gpu_figures.sh.

    python benchmarks/results_tables.py docs/results/2026-11-29-h200

Per run directory (single, drift, parallel): per-step losses of every framework, the max
|Δloss| of each framework against pytorch, and mean tok/s over steps 2..N.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lockstep.formats.run_record import read_run_record


def run_dir_tables(run_dir: Path) -> str:
    frameworks = [d.name for d in sorted(run_dir.iterdir()) if d.is_dir() and any(d.glob("*.jsonl"))]
    frameworks.sort(key=lambda f: (f != "pytorch", f))
    cases = sorted({p.stem for fw in frameworks for p in (run_dir / fw).glob("*.jsonl")})
    out = [f"#### {run_dir.name}", ""]
    head = "| case | framework | " + " | ".join(f"step {i}" for i in range(1, 11)) + " | max \\|Δ\\| vs pytorch | tok/s |"
    out += [head, "|" + "---|" * 14]
    for case in cases:
        records = {fw: read_run_record(run_dir / fw / f"{case}.jsonl") for fw in frameworks
                   if (run_dir / fw / f"{case}.jsonl").is_file()}
        base = records.get("pytorch")
        for fw, rec in records.items():
            losses = [f"{x:.6f}" for x in rec.losses()[:10]] + [""] * (10 - min(10, len(rec.steps)))
            if base is not None and fw != "pytorch":
                diff = f"{max(abs(a - b) for a, b in zip(base.losses(), rec.losses())):.2e}"
            else:
                diff = "—"
            tps = rec.mean_tokens_per_s()
            out.append(f"| {case} | {fw} | " + " | ".join(losses) + f" | {diff} | " + (f"{tps:,.0f} |" if tps else "- |"))
    return "\n".join(out) + "\n"


def vs_single_table(run_dir: Path) -> str:
    rows = ["| framework | 2-GPU case | vs single-GPU case | max \\|Δloss\\| | threshold | verdict | tok/s 1 GPU | tok/s 2 GPUs |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(run_dir.glob("vs_single_*.json")):
        doc = json.loads(path.read_text())
        fw = path.stem.split("_")[2]
        for c in doc["cases"]:
            b, t = c["baseline"], c["test"]
            rows.append(f"| {fw} | {c['case'].split(' vs ')[1]} | {c['case'].split(' vs ')[0]} | {c['max_abs_diff']:.2e} | "
                        f"{c['threshold']:.0e} | {'PASS' if c['passed'] else 'FAIL'} | {b['tokens_per_s_mean']:,.0f} | "
                        f"{t['tokens_per_s_mean']:,.0f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    for name in ("single", "drift", "parallel"):
        if (root / name).is_dir():
            print(run_dir_tables(root / name))
    if (root / "parallel").is_dir():
        print(vs_single_table(root / "parallel"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
