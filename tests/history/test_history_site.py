"""`lockstep history site`: pages built from a history of real runs' records, rebuilt
incrementally, and what a person sees of them in headless Chromium loaded from disk (file://):
the overview's cells, a trend's points and their tooltips, the links, and no request leaving
the page (Chromium's own net log, with a planted external image as the negative control)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from lockstep.cli import main
from lockstep.history import HistoryStore
from lockstep.history.site import MANIFEST, build_site
from lockstep.history.site.model import build_model
from lockstep.history.site.pages import tps_text
from lockstep.history.site.svg import fmt

from history_runs import many_runs, real_compared_runs

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium); "
                                                             "the browser checks of the history site are skipped")
# The browser's own background traffic (update checks, sign-in) is turned off where a flag can;
# what is left is told apart by its initiator ("not an origin"), a page's requests have one.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-default-apps", "--no-first-run",
                  "--disable-extensions", "--no-pings", "--disable-features=Translate,OptimizationHints,MediaRouter"]
N_RUNS = 1000


class Dom(HTMLParser):
    """The parts of a page a test looks at: cells by (case, framework), tooltips of the
    points, hrefs, and every src."""

    def __init__(self, text: str):
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}
        self.tips: list[str] = []
        self.hrefs: list[str] = []
        self.srcs: list[str] = []
        self.circles = 0
        self._cell: tuple[str, str] | None = None
        self._cell_text: list[str] = []
        self._in_circle_title = False
        self._in_circle = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "href" in a:
            self.hrefs.append(a["href"])
        if "src" in a:
            self.srcs.append(a["src"])
        if tag == "td" and "data-case" in a:
            self._cell, self._cell_text = (a["data-case"], a["data-framework"]), []
        if tag == "circle":
            self.circles += 1
            self._in_circle = True
        if tag == "title" and self._in_circle:
            self._in_circle_title = True
            self.tips.append("")

    def handle_endtag(self, tag):
        if tag == "td" and self._cell:
            self.cells[self._cell] = " ".join(" ".join(self._cell_text).split())
            self._cell = None
        if tag == "title":
            self._in_circle_title = False
        if tag == "circle":
            self._in_circle = False

    def handle_data(self, data):
        if self._cell:
            self._cell_text.append(data)
        if self._in_circle_title:
            self.tips[-1] += data


def chromium_dom(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """The DOM Chromium made of the page, and the URLs the page (not the browser) requested."""
    net = tmp / f"net-{page.stem}.json"
    proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--log-net-log={net}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = json.loads(net.read_text())["events"]
    requested = sorted({e["params"]["url"] for e in events if (e.get("params") or {}).get("url")
                        and e["params"].get("initiator", "not an origin") != "not an origin"})
    return proc.stdout, requested


def target(page_dir: Path, href: str) -> Path:
    """The file a relative link opens (its #fragment aside)."""
    return (page_dir / unquote(href.split("#", 1)[0])).resolve()


@pytest.fixture(scope="module")
def long_history(tmp_path_factory):
    work = tmp_path_factory.mktemp("long")
    store = HistoryStore(work / "history.sqlite")
    assert store.append_many(many_runs(N_RUNS, work / "runs")) == [None] * N_RUNS
    built = build_site(store, work / "site")
    return store, work / "site", built


def test_a_thousand_runs_make_every_page_and_a_rebuild_writes_none(long_history, tmp_path):
    store, site, built = long_history
    assert built.runs == N_RUNS and built.written == built.pages
    # 12 series (4 cases x 3 frameworks); InfiniTrain's 200 commits fill 2 trend pages each.
    trends = sorted(p.name for p in (site / "trends").iterdir())
    assert len([t for t in trends if "__infinitrain__" in t]) == 8 and len(trends) == 16
    assert len(list((site / "runs").glob("2026*.html"))) == N_RUNS
    assert len(list((site / "runs").glob("index*.html"))) == 5  # 200 runs a page
    again = build_site(store, site)
    assert (again.written, again.removed, again.pages) == (0, 0, built.pages)
    # Nothing in any page names another host or loads anything: no URL scheme, no src.
    for path in site.rglob("*"):
        if path.is_file() and path.name != MANIFEST:
            text = path.read_text()
            assert "://" not in text and " src=" not in text and "url(" not in text and "@import" not in text, path


def test_one_more_run_rewrites_only_the_pages_it_is_on(tmp_path):
    store = HistoryStore(tmp_path / "history.sqlite")
    runs = many_runs(41, tmp_path / "runs")
    store.append_many(runs[:40])
    site = tmp_path / "site"
    first = build_site(store, site)
    older = (site / "runs" / f"{runs[0].run_id}.html").stat().st_mtime_ns
    store.append(runs[40])
    second = build_site(store, site)
    # the new run's page, the overview, the run list, and the newest trend page of the 8 series
    # it is in (pytorch and the patched InfiniTrain on 4 cases; megatron's 4 are untouched)
    assert {(r.case, r.framework) for r in runs[40].results} == {
        (c, fw) for c in ("gpt2_1", "gpt2_1_bfloat16", "gpt2_2", "gpt2_2_bfloat16") for fw in ("pytorch", "infinitrain")}
    assert second.pages == first.pages + 1 and second.written == 1 + 1 + 1 + 8
    assert (site / "runs" / f"{runs[0].run_id}.html").stat().st_mtime_ns == older
    # --since drops the older runs' pages, and only those lockstep wrote
    (site / "runs" / "notes.txt").write_text("mine")
    third = build_site(store, site, since=runs[30].recorded_at)
    assert third.runs == 11 and third.removed == 30 and (site / "runs" / "notes.txt").is_file()
    assert not (site / "runs" / f"{runs[0].run_id}.html").exists()


def test_cli_site_and_one_sentence_for_nothing_to_show(tmp_path, capsys):
    store = HistoryStore(tmp_path / "history.sqlite")
    a, b = real_compared_runs(tmp_path / "real")
    store.append_many([a, b])
    rc = main(["history", "--history", str(store.path), "site", str(tmp_path / "site"), "--diff", a.run_id, b.run_id])
    out = capsys.readouterr().out
    assert rc == 0 and "2 runs" in out
    diff = (tmp_path / "site" / "diffs" / f"{a.run_id}__{b.run_id}.html").read_text()
    assert "gpt2_1" in diff and "FAIL unexplained → PASS" in diff
    rc = main(["history", "--history", str(store.path), "site", str(tmp_path / "s2"), "--since", "2999-01-01"])
    assert rc == 1 and capsys.readouterr().err.strip() == (
        f"lockstep: error: {store.path}: no runs recorded since 2999-01-01T00:00:00 to build a site from")
    rc = main(["history", "--history", str(store.path), "site", str(tmp_path / "s3"), "--since", "yesterday"])
    assert rc == 1 and "not an ISO 8601 date" in capsys.readouterr().err



def _small_history(tmp_path) -> HistoryStore:
    store = HistoryStore(tmp_path / "history.sqlite")
    store.append_many(many_runs(3, tmp_path / "runs"))
    return store


def test_a_folder_the_site_never_wrote_is_refused_and_left_as_it_was(tmp_path, capsys):
    store = _small_history(tmp_path)
    site = tmp_path / "www"
    site.mkdir()
    (site / "index.html").write_text("<h1>my own page</h1>")
    (site / "style.css").write_text("body { color: red }")
    rc = main(["history", "--history", str(store.path), "site", str(site)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"lockstep: error: {site}: is not empty (index.html, style.css) and was not written by "
                          "lockstep history site")
    assert sorted(p.name for p in site.iterdir()) == ["index.html", "style.css"]
    assert (site / "index.html").read_text() == "<h1>my own page</h1>"
    assert (site / "style.css").read_text() == "body { color: red }"


def test_force_moves_the_users_files_aside_and_deletes_nothing(tmp_path, capsys):
    store = _small_history(tmp_path)
    site = tmp_path / "www"
    site.mkdir()
    (site / "index.html").write_text("<h1>my own page</h1>")
    (site / "notes.txt").write_text("mine")
    rc = main(["history", "--history", str(store.path), "site", str(site), "--force"])
    out = capsys.readouterr().out
    assert rc == 0 and "moved aside" in out
    [moved] = site.glob("index.html.moved-by-lockstep-*")
    assert moved.read_text() == "<h1>my own page</h1>" and (site / "notes.txt").read_text() == "mine"
    assert "lockstep" in (site / "index.html").read_text()
    # the folder is the site's now: a rebuild needs no --force
    assert main(["history", "--history", str(store.path), "site", str(site)]) == 0


def test_pages_are_written_with_the_users_umask(tmp_path):
    import os

    store = _small_history(tmp_path)
    old = os.umask(0o022)
    try:
        build_site(store, tmp_path / "site")
    finally:
        os.umask(old)
    pages = [p for p in (tmp_path / "site").rglob("*") if p.is_file()]
    assert len(pages) > 5
    assert {oct(p.stat().st_mode & 0o777) for p in pages} == {"0o644"}


@needs_chromium
def test_chromium_shows_the_overview_cells_from_disk(long_history, tmp_path):
    store, site, _ = long_history
    dom_text, requested = chromium_dom(site / "index.html", tmp_path)
    assert requested == []
    dom = Dom(dom_text)
    runs = store.runs()
    latest = {(r.case, r.framework): r for run in runs for r in run.results}
    assert set(dom.cells) == set(latest) and len(dom.cells) == 12
    it = latest[("gpt2_1", "infinitrain")]
    # the last run is on the unpatched InfiniTrain: the real H200 records' FP32 verdict
    assert dom.cells[("gpt2_1", "infinitrain")] == (
        f"FAIL unexplained max |Δloss| 2.23e-04 tok/s {tps_text(it.tps_median, it.tps_cv)} MFU {it.mfu:.1%}")
    assert dom.cells[("gpt2_1", "megatron")].startswith("PASS max |Δloss| 1.01e-07 tok/s ")
    assert dom.cells[("gpt2_1", "pytorch")].startswith("baseline tok/s ")
    for href in dom.hrefs:
        assert target(site, href).is_file(), href


@needs_chromium
def test_chromium_shows_a_trends_points_with_their_values_and_links(long_history, tmp_path):
    store, site, _ = long_history
    model = build_model(store.runs())
    [series] = [s for s in model.series.values() if (s.case, s.framework) == ("gpt2_1", "infinitrain")]
    commits = series.commits()
    assert len(commits) == 200
    page = site / "trends" / f"{series.slug}.html"
    dom_text, requested = chromium_dom(page, tmp_path)
    assert requested == []
    dom = Dom(dom_text)
    assert dom.circles == 3 * 100  # the newest 100 commits, on the three charts
    last = commits[-1]
    tip = next(t for t in dom.tips if t.startswith(f"infinitrain commit {last.commit}:"))
    medians = [p.result.tps_median for p in last.points]
    lines = tip.split("\n")
    assert lines[0] == f"infinitrain commit {last.commit}: 5 run(s), latest {last.points[-1].run.run_id}"
    assert lines[1] == "verdict: FAIL unexplained x5"
    assert lines[2] == "max |Δloss| 2.23e-04 (threshold 1.00e-05)"
    assert lines[3].startswith(f"tok/s median {fmt(statistics.median(medians))} (min ")
    assert lines[4] == "peak memory 1,395 MB, MFU " + f"{statistics.median(p.result.mfu for p in last.points):.1%}"
    # runs 995..999 in the order they ran: machines take turns 0, 1, 2 by run number
    assert lines[5] == "machine: h100-c (NVIDIA H100 80GB HBM3); h200-a (NVIDIA H200); h200-b (NVIDIA H200)"
    assert "torch 2.12.0+cu130 · megatron-core 0.17.0" in lines[6]
    # a patched commit's point is a PASS within the threshold
    patched = next(c for c in reversed(commits) if c.verdict == "PASS")
    ptip = next(t for t in dom.tips if t.startswith(f"infinitrain commit {patched.commit}:"))
    assert "verdict: PASS x5" in ptip and f"max |Δloss| {fmt(patched.max_abs_diff)}" in ptip
    assert patched.max_abs_diff < 1e-5
    for href in dom.hrefs:
        assert target(page.parent, href).is_file(), href
    assert any(h.endswith("-p1.html") for h in dom.hrefs)  # the older commits' page


@needs_chromium
def test_chromium_run_page_links_its_report(long_history, tmp_path):
    store, site, _ = long_history
    run = store.runs()[-1]
    page = site / "runs" / f"{run.run_id}.html"
    dom_text, requested = chromium_dom(page, tmp_path)
    assert requested == []
    dom = Dom(dom_text)
    report = [h for h in dom.hrefs if h.endswith("report.html")]
    assert len(report) == 1 and target(page.parent, report[0]) == Path(run.source) / "report.html"
    assert "Changes since the previous run of these pairs" in dom_text
    for href in dom.hrefs:
        assert target(page.parent, href).is_file(), href


@needs_chromium
def test_the_request_check_sees_an_external_image(tmp_path):
    """Negative control: a page that loads from another host is caught by the same check."""
    planted = tmp_path / "planted.html"
    planted.write_text('<!DOCTYPE html><html><body><p>x</p><img src="http://203.0.113.7/dot.png"></body></html>')
    _, requested = chromium_dom(planted, tmp_path)
    assert requested == ["http://203.0.113.7/dot.png"]


def test_a_speed_anchors_class_ranks_below_every_judged_one():
    """A commit's colour is its worst class: a speed anchor's "speed only" never hides a judged pair's."""
    from lockstep.history.site.model import CSS_CLASS, worst

    assert worst(["speed only"]) == "speed only" and CSS_CLASS["speed only"] == "v-skip"
    assert worst(["speed only", "PASS"]) == "PASS" and worst(["FAIL", "speed only"]) == "FAIL"
