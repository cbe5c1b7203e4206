"""The verdict for people: a terminal rendering (rich) and an HTML section (report.html).

Both read the verdict's JSON form, so `lockstep report` renders the section from
`<run>/diagnose/*.json` without importing torch."""

from __future__ import annotations

import html
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

TOP_ROWS = 12


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3e}" if isinstance(x, float) else str(x)


def _loss(x) -> str:
    return "-" if x is None else f"{x:.7f}"


def _allowed(row: dict, tolerance: float) -> tuple[str, str]:
    """The allowance a row was judged against and what it says: `differs`, `agrees`, or `agrees
    (above the tolerance)` where the row's own allowance (recovery precision, FP32 rounding) is
    wider. A verdict written before rows carried it shows "-"."""
    allowed = row.get("allowed")
    if allowed is None:
        return "-", ""
    if row.get("differs", row["rel_error"] > allowed):
        return f"{allowed:.2e}", "differs"
    return f"{allowed:.2e}", "agrees" + (" (above the tolerance)" if row["rel_error"] > tolerance else "")


def print_verdict(console: Console, v: dict, rows: int = TOP_ROWS) -> None:
    console.print(f"[bold]diagnose {escape(v['case'])}: {escape(v['test'])} vs {escape(v['reference'])}[/] "
                  f"{escape(v.get('compared') or 'at step 1')} ({v['dtype']}, tensor tolerance "
                  f"{v['tensor_tolerance']:.0e}, gradients {v['gradient_source']})", highlight=False)
    t = Table(title=f"tensors, worst first (top {rows} of {len(v['ranked'])})", title_justify="left")
    for col in ("tensor", "kind", "max |Δ|", "‖Δ‖/‖ref‖", "allowed", "", "cosine"):
        t.add_column(col, justify="left" if col in ("tensor", "kind", "") else "right")
    for r in v["ranked"][:rows]:
        t.add_row(escape(r["tensor"]), r["kind"], _fmt(r["max_abs_diff"]), f"{r['rel_error']:.2e}",
                  *_allowed(r, v["tensor_tolerance"]), f"{r['cosine']:.6f}")
    console.print(t)
    loss = v["loss_step1"]  # the compared step's loss (step 1, or N+1 with --at-step N)
    console.print(f"step-{v.get('step', 1)} loss: {escape(v['reference'])} {_loss(loss['reference'])}, {escape(v['test'])} "
                  f"{_loss(loss['test'])}, |Δ| {_fmt(loss['abs_diff'])} (threshold {loss['threshold']:.0e}; an FP32 "
                  f"sequential loss sum would move it by {_fmt(loss['fp32_sequential_sum_shift'])})", highlight=False)
    if v["drift"]:
        d = Table(title="drift: max |Δloss| over the steps, by lr", title_justify="left")
        for col in ("lr", "steps", "step 1 |Δ|", "max |Δ|", ""):
            d.add_column(col, justify="right")
        for run in v["drift"]:
            first = run["steps"][0]["abs_diff"] if run["steps"] else None
            d.add_row(f"{run['lr']:g}", str(len(run["steps"])), _fmt(first), _fmt(run["max_abs_diff"]), run["note"])
        console.print(d)
    console.print(f"first diverging module: {escape(v['first_diverging_module'] or 'none (every module output agrees)')}")
    if v.get("output_gradients"):
        first = v.get("first_diverging_output_gradient") or "none (every module output's gradient agrees)"
        console.print(f"first differing gradient at a module output, in backward order: {escape(first)}")
    if v.get("optimizer_updates"):
        worst = max(v["optimizer_updates"], key=lambda r: r["rel_error"])
        console.print(f"optimizer updates of step {v.get('step', 1)}: {len(v['optimizer_updates'])} tensors, worst "
                      f"{escape(worst['tensor'])} relative {worst['rel_error']:.2e}", highlight=False)
    if v["findings"]:
        for f in v["findings"]:
            console.print(f"[bold red]✗[/] {escape(f['classification'])}", highlight=False)
    else:
        also = ", gradient and optimizer update" if v.get("optimizer_updates") else " and gradient"
        console.print(f"[bold green]no divergence[/]: every module output{also} agrees within its allowance "
                      f"(the tensor tolerance {v['tensor_tolerance']:.0e}, or more where the row's 'allowed' says so)",
                      highlight=False)
    for note in v["notes"]:
        console.print(f"[dim]{escape(note)}[/]", highlight=False)
    console.print(f"[dim]seconds: {', '.join(f'{k} {s}' for k, s in v['seconds'].items())}[/]", highlight=False)


def load_verdicts(run_dir: str | Path) -> list[dict]:
    d = Path(run_dir) / "diagnose"
    out = []
    for p in sorted(d.glob("*_vs_*.json")) if d.is_dir() else []:
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def html_section(verdicts: list[dict], rows: int = TOP_ROWS) -> str:
    """`<h2>Diagnose</h2>` and one block per verdict (empty string when there are none)."""
    if not verdicts:
        return ""
    e = html.escape
    parts = ["<h2>Diagnose: first divergence</h2>"]
    for v in verdicts:
        parts.append(f"<h3>{e(v['case'])}: {e(v['test'])} vs {e(v['reference'])} {e(v.get('compared') or '')}</h3>")
        if v.get("output_gradients"):
            parts.append(f"<p>first differing gradient at a module output (backward order): "
                         f"<strong>{e(v.get('first_diverging_output_gradient') or 'none')}</strong></p>")
        parts.append(f"<p>first diverging module: <strong>{e(v['first_diverging_module'] or 'none')}</strong>; "
                     f"gradients {e(v['gradient_source'])}; tensor tolerance {v['tensor_tolerance']:.0e}</p>")
        items = [f["classification"] for f in v["findings"]] or ["no divergence"]
        parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in items) + "</ul>")
        parts.append("<table><tr><th>tensor</th><th>kind</th><th>max |Δ|</th><th>‖Δ‖/‖ref‖</th><th>allowed</th>"
                     "<th></th><th>cosine</th></tr>")
        for r in v["ranked"][:rows]:
            allowed, word = _allowed(r, v["tensor_tolerance"])
            parts.append(f"<tr><td>{e(r['tensor'])}</td><td>{e(r['kind'])}</td><td>{_fmt(r['max_abs_diff'])}</td>"
                         f"<td>{r['rel_error']:.2e}</td><td>{allowed}</td><td>{e(word)}</td><td>{r['cosine']:.6f}</td></tr>")
        parts.append("</table>")
        if v["drift"]:
            parts.append("<table><tr><th>lr</th><th>steps</th><th>max |Δloss|</th></tr>" + "".join(
                f"<tr><td>{run['lr']:g}</td><td>{len(run['steps'])}</td><td>{run['max_abs_diff']:.2e}</td></tr>"
                for run in v["drift"]) + "</table>")
        for note in v["notes"]:
            parts.append(f"<p><small>{e(note)}</small></p>")
    return "\n".join(parts)
