"""`lockstep history site OUT_DIR`: the history as a static site that opens from the file system
(docs/reference/history-site.md).

model: what is shown, worked out from the runs once · pages: the HTML · svg: the charts.

Regenerating is incremental. Each page has a key: for a run's page and for the older pages of
trends and of the run list (pages fill oldest first, so a full one never changes) the key is
what the page is made of (the runs' ids, which never change in the history, and its links); for
the rest the sha256 of its bytes. A page whose key is the one the last build wrote (the manifest
`.lockstep-site.json` keeps them) is neither rendered nor written again; a page the last build
wrote that this one does not (a narrower --since) is removed. Nothing else in OUT_DIR is
touched.

OUT_DIR is the site's when it holds that manifest, as `lockstep run` knows its --out by run.json:
any other folder that is not empty is someone else's and refused, or with --force what has one of
the site's names is moved aside (`<name>.moved-by-lockstep-<UTC time>`); nothing is deleted. Pages
are written with the user's umask (0644 under 022), so a web server can read them."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.errors import LockstepError
from lockstep.fsutil import _current_umask, atomic_write, move_aside, write_error
from lockstep.history.site.model import build_model, safe_name
from lockstep.history.site.pages import (STYLE, diff_page, overview, reachable_links, run_list_chunks,
                                         run_list_name, run_list_page, run_page, trend_chunks, trend_name, trend_page)
from lockstep.history.store import HistoryStore

MANIFEST = ".lockstep-site.json"
SITE_FORMAT = 1
# What a build writes at the top of OUT_DIR: moved aside, with --force, in a folder it never wrote.
SITE_TOP_NAMES = ("index.html", "style.css", "trends", "runs", "diffs", MANIFEST)


@dataclass
class SiteBuild:
    out_dir: Path
    runs: int
    pages: int
    written: int
    removed: int
    seconds: float
    moved_aside: list[tuple[str, str]] = field(default_factory=list)  # (name, new name) in OUT_DIR


def _manifest(out_dir: Path) -> dict[str, str]:
    try:
        m = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(m, dict) or m.get("format") != SITE_FORMAT or not isinstance(m.get("pages"), dict):
        return {}
    return m["pages"]


def _is_site(out_dir: Path) -> bool:
    """The folder holds the manifest a build writes (of any format: an older build's is still ours)."""
    try:
        m = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and isinstance(m.get("format"), int) and isinstance(m.get("pages"), dict)


def _claim(out_dir: Path, force: bool) -> list[tuple[str, str]]:
    """Make OUT_DIR the site's: nothing to do when it is missing, empty or a site already; else
    refuse, or with `force` move aside what has one of the site's names. Returns what was moved."""
    if out_dir.exists() and not out_dir.is_dir():
        raise LockstepError(f"{out_dir}: is a file; the history site needs a directory")
    if not out_dir.is_dir() or _is_site(out_dir):
        return []
    try:
        entries = sorted(p.name for p in out_dir.iterdir())
    except OSError as e:
        raise write_error(out_dir, e, "history site folder") from None
    if not entries:
        return []
    if not force:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise LockstepError(f"{out_dir}: is not empty ({shown}) and was not written by lockstep history site (no "
                            f"{MANIFEST}); choose another OUT_DIR, empty it, or pass --force (lockstep then moves "
                            "what is in its way aside, and deletes nothing)")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return [(name, move_aside(out_dir / name, stamp).name) for name in SITE_TOP_NAMES
            if os.path.lexists(out_dir / name)]


def _write(path: Path, data: bytes, mode: int) -> None:
    """Beside, then renamed: a reader never sees half a page. No fsync: a page is rebuilt from
    the history at will, and ten thousand fsyncs would be most of a build. `mode`: mkstemp's
    0600 would keep the pages from a web server running as another user."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise write_error(path, e, "history site page") from None


def build_site(store: HistoryStore, out_dir: str | os.PathLike, since: str | None = None,
               diffs: list[tuple[str, str]] = (), force: bool = False) -> SiteBuild:
    start = time.perf_counter()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise LockstepError(f"{out_dir}: is a file; the history site needs a directory")
    runs = store.runs(since=since, losses=False)  # the losses only for the run pages rendered
    if not runs:
        raise LockstepError(f"{store.path}: no runs" + (f" recorded since {since}" if since else "")
                            + " to build a site from")
    model = build_model(runs)
    diff_runs_ = [(store.run(a), store.run(b)) for a, b in diffs]
    moved = _claim(out_dir, force)  # once the history has read well: a bad one moves nothing
    mode = 0o666 & ~_current_umask()
    old = _manifest(out_dir)
    new: dict[str, str] = {}
    written = 0

    def emit(rel: str, render, key: str | None = None) -> None:
        """Write the page unless the last build wrote the same: `key` for a page keyed by what it
        is made of (render is then called only when it changed), else its bytes' sha256."""
        nonlocal written
        path = out_dir / rel
        if key is not None:
            new[rel] = key
            if old.get(rel) == key and path.is_file():
                return
            data = render().encode()
        else:
            data = render().encode()
            new[rel] = hashlib.sha256(data).hexdigest()
            if old.get(rel) == new[rel] and path.is_file():
                return
        _write(path, data, mode)
        written += 1

    def key_of(*parts) -> str:
        return hashlib.sha256(json.dumps([SITE_FORMAT, *parts], default=str).encode()).hexdigest()

    emit("style.css", lambda: STYLE.lstrip())
    emit("index.html", lambda: overview(model, since, [(a.run_id, b.run_id) for a, b in diff_runs_]))
    for s in model.series.values():
        chunks = trend_chunks(s)
        n = len(chunks)
        others = [(o.slug, o.steps) for o in model.series_of_pair[(s.case, s.framework)] if o is not s]
        for k, chunk in enumerate(chunks):
            ids = [p.run.run_id for c in chunk for p in c.points]
            emit(f"trends/{trend_name(s, k, n)}", lambda s=s, chunk=chunk, k=k, n=n: trend_page(model, s, chunk, k, n),
                 key_of("trend", s.slug, k, min(n - k, 3), ids, others))
    chunks = run_list_chunks(model)
    for k, chunk in enumerate(chunks):
        n = len(chunks)
        emit(f"runs/{run_list_name(k, n)}", lambda chunk=chunk, k=k, n=n: run_list_page(chunk, k, n, len(runs)),
             key_of("runs", k, min(n - k, 3), [r.run_id for r in chunk], len(runs) if k == n - 1 else None))
    runs_dir = out_dir.resolve() / "runs"
    pending = []
    for run in runs:
        links = reachable_links(run, runs_dir)
        prev = model.previous.get(run.run_id)
        slugs = [s.slug if (s := model.series_for(run, r)) else None for r in run.results]
        rel = f"runs/{safe_name(run.run_id)}.html"
        new[rel] = key_of("run", run.run_id, prev.run_id if prev else None, links, slugs)
        if not (old.get(rel) == new[rel] and (out_dir / rel).is_file()):
            pending.append((rel, run.run_id, prev.run_id if prev else None, links))
    if pending:
        need = {x for _, run_id, prev_id, _ in pending for x in (run_id, prev_id) if x}
        whole = ({r.run_id: r for r in store.runs(since=since)} if len(need) > len(runs) // 4
                 else store.runs_by_id(need))
        for rel, run_id, prev_id, links in pending:
            _write(out_dir / rel, run_page(model, whole[run_id], links, whole.get(prev_id)).encode(), mode)
            written += 1
    for a, b in diff_runs_:
        emit(f"diffs/{safe_name(a.run_id)}__{safe_name(b.run_id)}.html", lambda a=a, b=b: diff_page(a, b),
             key_of("diff", a.run_id, b.run_id))

    removed = 0
    for rel in old.keys() - new.keys():
        path = out_dir / rel
        if path.is_file() and ".." not in Path(rel).parts:
            path.unlink()
            removed += 1
    with atomic_write(out_dir / MANIFEST, "w", what="history site manifest") as f:
        json.dump({"format": SITE_FORMAT, "pages": new}, f)
    return SiteBuild(out_dir, len(runs), len(new), written, removed, time.perf_counter() - start, moved)
