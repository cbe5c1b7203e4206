"""The site's pages as HTML text. Every page links style.css beside the pages and nothing else:
no script, no font, no image from anywhere (docs/reference/history-site.md)."""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from urllib.parse import quote

from lockstep.history.site.model import (COLOR, CSS_CLASS, CommitPoint, Series, SiteModel, safe_name,
                                         verdict_label, worst)
from lockstep.history.site.svg import Mark, chart, fmt
from lockstep.history.trend import DiffRow, diff_runs, short_commit
from lockstep.history.store import ResultRow, RunRow

PAGE_COMMITS = 100  # x positions per trend page
PAGE_RUNS = 200  # rows per page of the run list
SHOWN_RUNS_PER_COMMIT = 3

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222;background:#fff}
h1{font-size:1.4em;margin:.2em 0 .6em} h2{font-size:1.1em;margin:1.2em 0 .4em}
nav{margin-bottom:1em} nav a{margin-right:1em}
table{border-collapse:collapse;margin:.3em 0 1em} th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;
vertical-align:top} th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-weight:600;white-space:nowrap}
.v-pass{background:#2e8b3a}.v-passp{background:#86c06c;color:#123}.v-fail{background:#cc2222}
.v-failu{background:#7a0f0f}.v-error{background:#e07b00}.v-skip{background:#9a9a9a}.v-base{background:#3465a4}
.cell small{color:#555} .muted{color:#666} .pager a,.pager b{margin-right:.6em}
svg.chart{display:block;margin:.4em 0;max-width:100%;height:auto}
svg .t{font-weight:600;font-size:13px} svg .yl,svg .xl{font-size:10px;fill:#444} svg .empty{fill:#888}
svg .plot{fill:#fafafa;stroke:#bbb} svg .grid{stroke:#e3e3e3} svg .line{fill:none;stroke:#3465a4;stroke-width:1}
svg .band{fill:#3465a4;fill-opacity:.15;stroke:none} svg .ref{stroke:#cc2222;stroke-dasharray:5 3}
svg .refl{font-size:10px;fill:#cc2222} svg .pt{stroke:#fff;stroke-width:1}
code{font-size:.95em}
"""


def page(title: str, body: str, depth: int) -> str:
    up = "../" * depth
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="stylesheet" href="{up}style.css"></head><body>'
            f'<nav><a href="{up}index.html">overview</a><a href="{up}runs/index.html">runs</a>'
            f'<a href="{up}index.html#trends">trends</a></nav><h1>{escape(title)}</h1>{body}'
            f'<p class="muted">written by lockstep history site</p></body></html>\n')


def badge(verdict: str | None, label: str | None = None) -> str:
    return f'<span class="v {CSS_CLASS.get(verdict, "v-base")}">{escape(label or verdict or "baseline")}</span>'


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def tps_text(median: float | None, cv: float | None) -> str:
    if median is None:
        return "-"
    return f"{median:,.0f}" + (f" ± {cv:.1%}" if cv is not None else "")


def run_href(run_id: str, depth: int) -> str:
    return f"{'../' * depth}runs/{quote(safe_name(run_id))}.html"


def trend_href(s: Series, depth: int) -> str:
    """The series' newest page."""
    return f"{'../' * depth}trends/{quote(s.slug)}.html"


def table(head: list[str], rows: list[str]) -> str:
    return ("<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def td(text: str, num: bool = False, raw: bool = False) -> str:
    return f'<td{" class=num" if num else ""}>{text if raw else escape(text)}</td>'


# -- overview --------------------------------------------------------------------------------

def _cell_lines(r: ResultRow) -> list[str]:
    """An overview cell: the verdict, max |Δloss|, tok/s, and the figures against the hardware's limits."""
    lines = [badge(r.verdict, verdict_label(r))]
    if r.max_abs_diff is not None:
        lines.append(f"<small>max |Δloss| {fmt(r.max_abs_diff)}</small>")
    lines.append(f"<small>tok/s {tps_text(r.tps_median, r.tps_cv)}</small>")
    if r.mfu is not None:
        lines.append(f"<small>MFU {pct(r.mfu)}</small>")
    if r.roofline_fraction is not None:
        lines.append(f"<small>{pct(r.roofline_fraction)} of roofline</small>")
    return lines


def overview(model: SiteModel, since: str | None, n_diffs: list[tuple[str, str]]) -> str:
    fws = model.frameworks
    rows = []
    for case in model.cases:
        cells = [f"<th>{escape(case)}</th>"]
        for fw in fws:
            p = model.latest.get((case, fw))
            if p is None:
                cells.append('<td class="cell muted">-</td>')
                continue
            r = p.result
            s = model.series_for(p.run, r)
            href = trend_href(s, 0) if s else run_href(p.run.run_id, 0)
            cells.append(f'<td class="cell" data-case="{escape(case)}" data-framework="{escape(fw)}">'
                         f'<a href="{href}">{"<br>".join(_cell_lines(r))}</a></td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    matrix = ("<table class=matrix><thead><tr><th>case \\ framework</th>" + "".join(f"<th>{escape(f)}</th>" for f in fws)
              + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    last = model.runs[-1] if model.runs else None
    intro = (f"<p>{len(model.runs)} runs{f' since {escape(since)}' if since else ''}"
             + (f", the latest {escape(last.recorded_at[:19].replace('T', ' '))} UTC" if last else "")
             + ". Each cell: the latest verdict class of that case on that framework, its max |Δloss| against the "
               "baseline, median tok/s over steps 2..N ± its CV, MFU where the device's peak is known, and the share "
               "of the case's shape roofline where the run measured one; "
               "it links to the trend.</p>")
    series_rows = []
    for (case, fw), ss in sorted(model.series_of_pair.items()):
        for s in ss:
            last_p = s.points[-1]
            series_rows.append("<tr>" + td(case) + td(fw)
                               + td(f'<a href="{trend_href(s, 0)}"><code>{escape((s.inputs or "unstated")[:12])}</code></a>',
                                    raw=True)
                               + td(str(s.steps), num=True) + td(str(len(s.points)), num=True)
                               + td(str(len(s.commits())), num=True)
                               + td(badge(last_p.result.verdict, verdict_label(last_p.result)), raw=True) + "</tr>")
    trends = (f'<h2 id="trends">Trends</h2><p>One per case, framework and set of case inputs (weights, tokens, '
              f'steps, hyper-parameters): runs of other inputs under the same case name are another trend.</p>'
              + table(["case", "framework", "inputs", "steps", "runs", "commits", "latest"], series_rows))
    diffs = ""
    if n_diffs:
        diffs = "<h2>Diffs</h2><ul>" + "".join(
            f'<li><a href="diffs/{quote(safe_name(a))}__{quote(safe_name(b))}.html">{escape(a)} → {escape(b)}</a></li>'
            for a, b in n_diffs) + "</ul>"
    return page("lockstep history", intro + matrix + trends + diffs + '<p><a href="runs/index.html">all runs</a></p>', 0)


# -- trends ----------------------------------------------------------------------------------

def _tip(s: Series, c: CommitPoint) -> str:
    latest = c.points[-1]
    verdicts: dict[str, int] = {}
    for p in c.points:
        label = verdict_label(p.result)
        verdicts[label] = verdicts.get(label, 0) + 1
    lo, hi = c.tps_band
    lines = [f"{s.framework} commit {c.commit}: {len(c.points)} run(s), latest {latest.run.run_id}",
             "verdict: " + ", ".join(f"{k} x{v}" for k, v in verdicts.items()),
             f"max |Δloss| {fmt(c.max_abs_diff)}" + (f" (threshold {fmt(c.threshold)})" if c.threshold else ""),
             f"tok/s median {fmt(c.tps_median)} (min {fmt(lo)} .. max {fmt(hi)}, CV {pct(c.tps_cv)})",
             f"peak memory {fmt(c.peak_mem_mb)} MB, MFU {pct(c.mfu)}"
             + (f", {pct(c.roofline_fraction)} of roofline" if c.roofline_fraction is not None else ""),
             "machine: " + ("; ".join(c.machines()) or "-"),
             "versions: " + ("; ".join(c.versions()) or "-")]
    return "\n".join(lines)


def trend_chunks(s: Series) -> list[list[CommitPoint]]:
    """The series' commits in pages of PAGE_COMMITS, oldest first: a page once full never
    changes (new commits go to the last page), so a rebuild rewrites only the last pages."""
    commits = s.commits()
    return [commits[i:i + PAGE_COMMITS] for i in range(0, len(commits), PAGE_COMMITS)] or [[]]


def trend_name(s: Series, k: int, n_pages: int) -> str:
    """Page k (0-based) of n: the newest is `<slug>.html`, the link every other page uses."""
    return f"{s.slug}.html" if k == n_pages - 1 else f"{s.slug}-p{k + 1}.html"


def trend_page(model: SiteModel, s: Series, chunk: list[CommitPoint], k: int, n_pages: int) -> str:
    others = [o for o in model.series_of_pair[(s.case, s.framework)] if o is not s]
    marks_diff, marks_tps, marks_mem = [], [], []
    for c in chunk:
        tip, href = _tip(s, c), run_href(c.points[-1].run.run_id, 1)
        color = COLOR.get(c.verdict, COLOR[None])
        marks_diff.append(Mark(c.commit, c.max_abs_diff, color=color, tip=tip, href=href))
        lo, hi = c.tps_band
        marks_tps.append(Mark(c.commit, c.tps_median, lo, hi, color=color, tip=tip, href=href))
        marks_mem.append(Mark(c.commit, c.peak_mem_mb, color=color, tip=tip, href=href))
    thresholds = sorted({c.threshold for c in chunk if c.threshold})
    charts = (chart("max |Δloss| against the baseline (log; 0 drawn at the axis floor)", marks_diff, log=True,
                    lines=[(t, f"threshold {fmt(t)}") for t in thresholds])
              + chart("tok/s: median over steps 2..N, band from min to max", marks_tps, unit="tok/s")
              + chart("peak device memory", marks_mem, unit="MB"))
    rows = []
    for c in reversed(chunk):
        shown = c.points[-SHOWN_RUNS_PER_COMMIT:]
        links = ", ".join(f'<a href="{run_href(p.run.run_id, 1)}">{escape(p.run.run_id)}</a>' for p in reversed(shown))
        if len(c.points) > len(shown):
            links += f" <span class=muted>+{len(c.points) - len(shown)} more</span>"
        lo, hi = c.tps_band
        rows.append("<tr>" + td(f"<code>{escape(c.commit)}</code>", raw=True) + td(links, raw=True)
                    + td(badge(c.verdict, verdict_label(c.points[-1].result) if len(c.points) == 1 else c.verdict),
                         raw=True)
                    + td(fmt(c.max_abs_diff), num=True) + td(tps_text(c.tps_median, c.tps_cv), num=True)
                    + td(f"{fmt(lo)} .. {fmt(hi)}", num=True) + td(fmt(c.peak_mem_mb), num=True)
                    + td(pct(c.mfu), num=True) + td(pct(c.roofline_fraction), num=True)
                    + td("; ".join(c.machines()) or "-")
                    + td("; ".join(c.versions()) or "-") + "</tr>")
    pager = ""
    if n_pages > 1:
        older = f'<a href="{trend_name(s, k - 1, n_pages)}">older commits</a>' if k > 0 else ""
        newer = f'<a href="{trend_name(s, k + 1, n_pages)}">newer commits</a>' if k < n_pages - 1 else ""
        latest = f'<a href="{trend_name(s, n_pages - 1, n_pages)}">latest</a>' if k < n_pages - 2 else ""
        pager = f'<p class="pager">page {k + 1} {older} {newer} {latest}</p>'
    other = ""
    if others:
        other = "<p>Other inputs of this case and framework: " + ", ".join(
            f'<a href="{trend_href(o, 1)}"><code>{escape((o.inputs or "unstated")[:12])}</code></a> ({o.steps} steps)'
            for o in others) + "</p>"
    first = chunk[0].points[0].run.recorded_at[:10] if chunk and chunk[0].points else "-"
    intro = (f"<p>inputs <code>{escape(s.inputs or 'unstated')}</code>, {s.steps} steps; {len(chunk)} "
             f"{escape(s.framework)} commits from {escape(first)} (one point per commit: its worst verdict, the "
             f"largest max |Δloss|, the median of its runs' tok/s medians; hover a point for its values, "
             f"click it for its latest run). Colours: "
             + " ".join(badge(v, v) for v in ("PASS", "PASS within logging precision", "FAIL", "FAIL unexplained",
                                              "ERROR", "SKIPPED")) + " " + badge(None, "baseline") + "</p>")
    body = (intro + other + pager + charts
            + table(["commit", "runs (latest first)", "verdict", "max |Δloss|", "tok/s median ± CV",
                     "tok/s min .. max", "peak MB", "MFU", "% of roofline", "machine", "versions"], rows) + pager)
    return page(f"{s.case} on {s.framework}" + (f" (page {k + 1})" if k < n_pages - 1 else ""), body, 1)


# -- runs ------------------------------------------------------------------------------------

def run_list_chunks(model: SiteModel) -> list[list[RunRow]]:
    """The runs in pages of PAGE_RUNS, oldest first (a full page never changes)."""
    return [model.runs[i:i + PAGE_RUNS] for i in range(0, len(model.runs), PAGE_RUNS)] or [[]]


def run_list_name(k: int, n_pages: int) -> str:
    return "index.html" if k == n_pages - 1 else f"index-{k + 1}.html"


def run_list_page(chunk: list[RunRow], k: int, n_pages: int, total: int) -> str:
    rows = []
    for r in reversed(chunk):
        verdict = worst(x.verdict for x in r.results)
        rows.append("<tr>" + td(f'<a href="{quote(safe_name(r.run_id))}.html">{escape(r.run_id)}</a>', raw=True)
                    + td(r.recorded_at[:19].replace("T", " ")) + td(r.kind) + td(short_commit(r.lockstep_commit))
                    + td(r.host or "-") + td(str(len({x.case for x in r.results})), num=True)
                    + td(badge(verdict, "PASS" if r.passed else "FAIL" if r.passed is False else (verdict or "-")),
                         raw=True) + td(r.source) + "</tr>")
    pager = ""
    if n_pages > 1:
        older = f'<a href="{run_list_name(k - 1, n_pages)}">older runs</a>' if k > 0 else ""
        newer = f'<a href="{run_list_name(k + 1, n_pages)}">newer runs</a>' if k < n_pages - 1 else ""
        latest = f'<a href="{run_list_name(n_pages - 1, n_pages)}">latest</a>' if k < n_pages - 2 else ""
        pager = f'<p class="pager">page {k + 1} {older} {newer} {latest}</p>'
    title = f"runs ({total})" if k == n_pages - 1 else f"runs, page {k + 1}"
    return page(title, pager + table(["run", "recorded (UTC)", "kind", "lockstep", "host", "cases", "verdict",
                                      "source"], rows) + pager, 1)


def reachable_links(run: RunRow, page_dir: Path) -> list[tuple[str, str]]:
    """(label, relative href) of the run's own outputs that exist where the history says it ran:
    its report, summary and diagnose verdicts. A compare has no run dir."""
    if run.kind != "run":
        return []
    src = Path(run.source)
    if not src.is_dir():
        return []
    found = [(name, src / name) for name in ("report.html", "report.md", "summary.json", "run.json")]
    diag = src / "diagnose"
    if diag.is_dir():
        found += [(f"diagnose {p.stem}", p) for p in sorted(diag.glob("*_vs_*.json"))]
    return [(label, quote(os.path.relpath(path, page_dir).replace(os.sep, "/"))) for label, path in found
            if path.is_file()]


def _result_row(model: SiteModel, run: RunRow, r: ResultRow) -> str:
    s = model.series_for(run, r)
    name = f'<a href="{trend_href(s, 1)}">{escape(r.framework)}</a>' if s else escape(r.framework)
    return ("<tr>" + td(r.case) + td(name, raw=True) + td(r.role) + td(badge(r.verdict, verdict_label(r)), raw=True)
            + td(fmt(r.max_abs_diff), num=True) + td(fmt(r.threshold), num=True)
            + td(tps_text(r.tps_median, r.tps_cv), num=True) + td(fmt(r.peak_mem_mb), num=True) + td(pct(r.mfu), num=True)
            + td(pct(r.roofline_fraction), num=True) + td(short_commit(r.framework_commit)) + td(r.framework_version or "-")
            + td(" ".join(x for x in (r.machine, r.device_name) if x) or "-") + td(r.reason or "") + "</tr>")


def diff_table(rows: list[DiffRow]) -> str:
    body = []
    for r in rows:
        change = f"{r.verdict_a or '-'} → {r.verdict_b or '-'}"
        body.append("<tr>" + td(r.case) + td(r.framework)
                    + td(f"<b>{escape(change)}</b>" if r.verdict_changed else escape(change), raw=True)
                    + td(f"{fmt(r.max_abs_diff_a)} → {fmt(r.max_abs_diff_b)}", num=True) + td(fmt(r.loss_delta), num=True)
                    + td("-" if r.loss_delta_step is None else str(r.loss_delta_step), num=True)
                    + td("-" if r.tps_ratio is None else f"{r.tps_ratio:.3f}", num=True) + td(r.note) + "</tr>")
    changed = sum(r.verdict_changed for r in rows)
    moved = sum(1 for r in rows if r.loss_delta)
    return (table(["case", "framework", "verdict A → B", "max |Δloss| vs baseline A → B", "max |loss B − loss A|",
                   "at step", "tok/s B/A", "note"], body)
            + f"<p>{len(rows)} (case, framework) pairs: {changed} verdict change(s), {moved} with different losses</p>")


def run_page(model: SiteModel, run: RunRow, links: list[tuple[str, str]], prev: RunRow | None) -> str:
    """`run` and `prev` (the previous run of its pairs) whole, losses included, for the diff."""
    facts = [("recorded (UTC)", run.recorded_at), ("kind", run.kind), ("source", run.source),
             ("lockstep commit", run.lockstep_commit or "?"), ("host", run.host or "-"),
             ("baseline", run.baseline_framework or "-"),
             ("verdict", "PASS" if run.passed else "FAIL" if run.passed is False else "nothing judged")]
    body = table(["", ""], ["<tr>" + td(k) + td(v) + "</tr>" for k, v in facts])
    if links:
        body += "<h2>Outputs</h2><ul>" + "".join(f'<li><a href="{href}">{escape(label)}</a></li>'
                                                 for label, href in links) + "</ul>"
    else:
        body += "<p class=muted>No report or diagnose output of this run is reachable from here.</p>"
    body += "<h2>Results</h2>" + table(
        ["case", "framework", "role", "verdict", "max |Δloss|", "threshold", "tok/s median ± CV", "peak MB", "MFU",
         "% of roofline", "commit", "version", "machine", "reason"], [_result_row(model, run, r) for r in run.results])
    if prev is not None:
        body += (f'<h2>Changes since the previous run of these pairs</h2><p>A <a href="{quote(safe_name(prev.run_id))}.html">'
                 f"{escape(prev.run_id)}</a> → B this run (as <code>lockstep history diff {escape(prev.run_id)} "
                 f"{escape(run.run_id)}</code>)</p>" + diff_table(diff_runs(prev, run)))
    return page(f"run {run.run_id}", body, 1)


def diff_page(a: RunRow, b: RunRow) -> str:
    body = (f'<p>A <a href="../runs/{quote(safe_name(a.run_id))}.html">{escape(a.run_id)}</a> '
            f"({escape(short_commit(a.lockstep_commit))}) → B "
            f'<a href="../runs/{quote(safe_name(b.run_id))}.html">{escape(b.run_id)}</a> '
            f"({escape(short_commit(b.lockstep_commit))})</p>" + diff_table(diff_runs(a, b)))
    return page(f"diff {a.run_id} → {b.run_id}", body, 1)
