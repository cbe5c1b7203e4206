"""`lockstep inspect FILE`: what an LLMC / llm.c file is, what its header says, and whether it is valid.

On the JSON files lockstep writes (a run record, summary.json, run.json): which of them it is and
what it says (commands/inspect_json.py).

`lockstep inspect DIR` on InfiniTrain's native checkpoint folder (checkpoint_step_NNNNNN/):
every rank's header and tensors (name, dtype, shape, statistics), its trainer state and
topology, and every problem of the folder, one sentence each (exit 1 when there is one).

Valid means everything a framework reading the file relies on holds: a known magic number and
version, header fields that agree with each other, a payload of exactly the size the header
implies, token ids inside the vocabulary, and (for checkpoints) only finite values. Exit 0 when
valid; otherwise exit 1 with the one-sentence reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lockstep.errors import FormatError
from lockstep.commands.inspect_json import inspect_json_file, looks_like_json
from lockstep.formats.detect import FileInfo, inspect_file

SCAN_CHUNK = 1 << 24  # values per step when scanning a payload: bounded memory for any file size


@dataclass
class TensorSummary:
    name: str
    shape: tuple[int, ...]
    mean: float
    std: float
    min: float
    max: float
    zeros: int


@dataclass
class Inspection:
    """Everything `inspect` reports about one valid file."""

    info: FileInfo
    file_bytes: int
    tensors: list[TensorSummary]
    notes: list[str]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect", help="say what an LLMC checkpoint, llm.c token file or run record is and whether it is valid",
        description="Identify FILE by its magic number (GPT-2 / Llama 3 / Qwen3 LLMC checkpoint, GPT-2 / Llama 3 "
                    "token stream), show its header fields and derived sizes, and check it completely; a run record "
                    "(<case>.jsonl), summary.json or run.json is named with what it says (framework, case, steps, "
                    "status). Exit 0 when valid, 1 with the reason when not.")
    p.add_argument("file", metavar="FILE", type=Path,
                   help="an LLMC checkpoint, llm.c token file, run record, summary.json or run.json; or InfiniTrain's "
                        "checkpoint folder")
    p.add_argument("--tensors", action="store_true", help="also show per-tensor statistics of a checkpoint")
    p.add_argument("--json", action="store_true", help="print the result as JSON (also when the file is invalid)")
    p.set_defaults(handler=run)


def inspect_path(path: Path, tensor_stats: bool = False) -> Inspection:
    """Identify and fully validate `path`. Raises FormatError naming the file."""
    if looks_like_json(path):  # no magic number starts with "{"
        return Inspection(info=inspect_json_file(path), file_bytes=path.stat().st_size, tensors=[], notes=[])
    info = inspect_file(path)  # magic, version, header consistency, exact size, token ids
    notes: list[str] = []
    tensors: list[TensorSummary] = []
    if info.kind == "checkpoint":
        tensors = _check_tensors(path, notes, tensor_stats)
    return Inspection(info=info, file_bytes=path.stat().st_size, tensors=tensors, notes=notes)


def _check_tensors(path: Path, notes: list[str], tensor_stats: bool) -> list[TensorSummary]:
    from lockstep.models import family_of_checkpoint

    family = family_of_checkpoint(path)
    ckpt = family.load(path)
    padding = family.padding_rows(ckpt.config)  # e.g. GPT-2's wte rows V..Vp-1: may hold anything
    summaries = []
    for name, t in ckpt.tensors.items():
        _check_finite(path, t[: padding[name]] if name in padding else t, f"tensor {name}")
        if tensor_stats:
            summaries.append(_summarize(name, t))
    for name, first in padding.items():
        rows = ckpt.tensors[name][first:]
        if rows.shape[0]:
            nonzero, non_finite = int(np.count_nonzero(rows)), int(np.count_nonzero(~np.isfinite(rows)))
            if nonzero:
                # Not fatal: only the first V logits count, but llm.c writes these rows as zeros.
                notes.append(f"{name} padding rows {first}..{first + rows.shape[0] - 1} hold {nonzero} non-zero "
                             f"values" + (f", {non_finite} of them non-finite" if non_finite else "")
                             + " (llm.c writes zeros; they never reach a logit)")
    return summaries


def _check_finite(path: Path, values: np.ndarray, what: str) -> None:
    flat = values.reshape(-1)
    for start in range(0, flat.shape[0], SCAN_CHUNK):
        part = np.asarray(flat[start : start + SCAN_CHUNK])
        bad = ~np.isfinite(part)
        if bad.any():
            first = start + int(np.argmax(bad))
            total = int(np.count_nonzero(~np.isfinite(flat)))
            raise FormatError(path, f"{what} holds {total} non-finite values (the first, {flat[first]}, "
                                    f"at flat index {first})")


def _summarize(name: str, t: np.ndarray) -> TensorSummary:
    x = np.asarray(t, dtype=np.float64)  # float64 sums: exact enough for any tensor size
    return TensorSummary(name=name, shape=tuple(int(d) for d in t.shape), mean=float(x.mean()), std=float(x.std()),
                         min=float(x.min()), max=float(x.max()), zeros=int(x.size - np.count_nonzero(x)))


def summarize_entry(state, entry) -> TensorSummary:
    return _summarize(entry.name, state.array(entry))


def inspect_infinitrain_folder(path: Path):
    """The folder read and checked (formats/infinitrain_checkpoint.py); FormatError when it is no checkpoint."""
    from lockstep.formats.infinitrain_checkpoint import read_checkpoint_folder

    return read_checkpoint_folder(path)


def _folder_json(folder) -> dict:
    ranks = []
    for r in folder.ranks:
        files = {}
        for kind in ("model", "optimizer"):
            state = getattr(r, kind)
            if state is None:
                continue
            files[kind] = {"path": str(state.path), "magic": "CKPT", "version": state.version, "bytes": state.size,
                           "tensors": [{"dtype": e.dtype, **asdict(summarize_entry(state, e))} for e in state.entries]}
        ranks.append({"rank": r.rank, "directory": str(r.directory), **files,
                      "trainer_state": r.trainer_state.values if r.trainer_state else None})
    state = folder.trainer_state
    return {"path": str(folder.path), "valid": not folder.problems, "format": "infinitrain-checkpoint",
            "step": folder.step, "topology": state.topology if state else None, "ranks": ranks,
            "problems": folder.problems}


def _print_folder(console: Console, folder) -> None:
    state = folder.trainer_state
    verdict = "[bold green]valid[/]" if not folder.problems else f"[bold red]{len(folder.problems)} problem(s)[/]"
    ranks = f"{len(folder.ranks)} rank folder(s)" if folder.parallel else "one rank"
    console.print(f"[bold]{escape(str(folder.path))}[/]: InfiniTrain checkpoint"
                  + (f" of step {folder.step}" if folder.step is not None else "") + f", {ranks} — {verdict}")
    if state is not None:
        console.print(_kv_table("trainer state", state.values))
        console.print(f"topology: {escape(state.topology)} ({state.world_size} rank(s))")
    for r in folder.ranks:
        for kind in ("model", "optimizer"):
            st = getattr(r, kind)
            if st is None:
                continue
            where = f"rank {r.rank} " if r.rank is not None else ""
            t = Table(title=f"{where}{st.path.name}: magic CKPT, version {st.version}, {len(st.entries)} tensors, "
                            f"{st.size:,} bytes", title_justify="left")
            for col in ("name", "dtype", "shape", "mean", "std", "min", "max"):
                t.add_column(col, justify="left" if col in ("name", "dtype", "shape") else "right")
            for e in st.entries:
                s = summarize_entry(st, e)
                t.add_row(escape(e.name), e.dtype, "×".join(map(str, e.shape)) or "scalar", f"{s.mean:.4e}",
                          f"{s.std:.4e}", f"{s.min:.4e}", f"{s.max:.4e}")
            console.print(t)
    for p in folder.problems:
        console.print(f"[red]problem:[/] {escape(p)}")


def run(args: argparse.Namespace) -> int:
    path: Path = args.file
    if path.is_dir():
        try:
            folder = inspect_infinitrain_folder(path)
        except FormatError as e:  # no checkpoint at all
            if not args.json:
                raise  # one sentence, exit 1 (cli.main)
            print(json.dumps({"path": str(path), "valid": False, "error": str(e)}, indent=2))
            print(f"lockstep: error: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(_folder_json(folder), indent=2))
        else:
            _print_folder(Console(width=None if sys.stdout.isatty() else 160, highlight=False), folder)
        for p in folder.problems:
            print(f"lockstep: error: {p}", file=sys.stderr)
        return 1 if folder.problems else 0
    if args.json:
        try:
            result = inspect_path(path, tensor_stats=args.tensors)
        except FormatError as e:
            print(json.dumps({"path": str(path), "valid": False, "error": str(e)}, indent=2))
            print(f"lockstep: error: {e}", file=sys.stderr)
            return 1
        print(json.dumps(_to_json(result), indent=2))
        return 0
    result = inspect_path(path, tensor_stats=args.tensors)  # FormatError -> one sentence, exit 1 (cli.main)
    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    _print(console, result)
    return 0


def _to_json(r: Inspection) -> dict:
    return {"path": r.info.path, "valid": True, "format": r.info.format, "kind": r.info.kind,
            "fields": r.info.fields, "derived": r.info.derived, "file_bytes": r.file_bytes,
            "tensors": [asdict(t) for t in r.tensors], "notes": r.notes}


def _fmt(key: str, value) -> str:
    if key == "magic":
        return str(value)  # a date (20240326): grouping its digits would hide that
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _kv_table(title: str, rows: dict) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", justify="right")
    for k, v in rows.items():
        t.add_row(escape(str(k)), escape(_fmt(str(k), v)))
    return t


def _print(console: Console, r: Inspection) -> None:
    info = r.info
    binary = info.kind in ("checkpoint", "token stream")
    what = f"{info.format} {info.kind}" if binary else info.kind
    console.print(f"[bold]{escape(info.path)}[/]: {escape(what)}, {r.file_bytes:,} bytes — [bold green]valid[/]")
    console.print(_kv_table("header" if binary else "contents", info.fields))
    console.print(_kv_table("derived", info.derived))
    if r.tensors:
        t = Table(title="tensors", title_justify="left")
        for col in ("name", "shape", "mean", "std", "min", "max", "zeros"):
            t.add_column(col, justify="left" if col in ("name", "shape") else "right")
        for s in r.tensors:
            t.add_row(s.name, "×".join(map(str, s.shape)), f"{s.mean:.3e}", f"{s.std:.5f}", f"{s.min:.4f}",
                      f"{s.max:.4f}", f"{s.zeros:,}")
        console.print(t)
    for note in r.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
