"""What the site shows, worked out from the history's runs once: each (case, framework)'s latest
result (the overview), its series per set of case inputs (the trend pages, one x position per
framework commit), and each run's previous run (the run page's diff)."""

from __future__ import annotations

import hashlib
import re
import statistics
from dataclasses import dataclass, field

from lockstep.history.store import ResultRow, RunRow
from lockstep.history.trend import short_commit

# Worst first: a commit's several runs are shown by their worst class.
SEVERITY = ("ERROR", "NOT IDENTICAL", "FAIL unexplained", "FAIL", "PASS within logging precision", "PASS",
            "IDENTICAL", "speed only", "SKIPPED", None)
CSS_CLASS = {"PASS": "v-pass", "PASS within logging precision": "v-passp", "FAIL": "v-fail",
             "FAIL unexplained": "v-failu", "ERROR": "v-error", "SKIPPED": "v-skip", None: "v-base",
             "IDENTICAL": "v-pass", "NOT IDENTICAL": "v-fail", "speed only": "v-skip"}
COLOR = {"PASS": "#2e8b3a", "PASS within logging precision": "#86c06c", "FAIL": "#cc2222",
         "FAIL unexplained": "#7a0f0f", "ERROR": "#e07b00", "SKIPPED": "#9a9a9a", None: "#3465a4",
         "IDENTICAL": "#2e8b3a", "NOT IDENTICAL": "#cc2222", "speed only": "#5f87af"}


def verdict_label(r: ResultRow) -> str:
    if r.verdict:
        return r.verdict
    return "baseline" if r.role == "baseline" else "not compared"


def worst(verdicts) -> str | None:
    vs = set(verdicts)
    return next((v for v in SEVERITY if v in vs), None)


def safe_name(text: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", text)
    if clean != text:  # two names that clean to the same text stay apart
        clean += "-" + hashlib.sha1(text.encode()).hexdigest()[:6]
    return clean


@dataclass
class Point:
    run: RunRow
    result: ResultRow


@dataclass
class CommitPoint:
    """The runs of one series on one framework commit: one x position of a trend."""

    commit: str
    points: list[Point]

    @property
    def verdict(self) -> str | None:
        return worst(p.result.verdict for p in self.points)

    def _vals(self, name: str) -> list[float]:
        return [v for p in self.points if (v := getattr(p.result, name)) is not None]

    @property
    def max_abs_diff(self) -> float | None:
        vals = self._vals("max_abs_diff")
        return max(vals) if vals else None

    @property
    def threshold(self) -> float | None:
        vals = self._vals("threshold")
        return vals[-1] if vals else None

    @property
    def tps_median(self) -> float | None:
        vals = self._vals("tps_median")
        return statistics.median(vals) if vals else None

    @property
    def tps_band(self) -> tuple[float | None, float | None]:
        lo, hi = self._vals("tps_min"), self._vals("tps_max")
        return (min(lo) if lo else None), (max(hi) if hi else None)

    @property
    def tps_cv(self) -> float | None:
        vals = self._vals("tps_cv")
        return statistics.median(vals) if vals else None

    @property
    def peak_mem_mb(self) -> float | None:
        vals = self._vals("peak_mem_mb")
        return max(vals) if vals else None

    @property
    def mfu(self) -> float | None:
        vals = self._vals("mfu")
        return statistics.median(vals) if vals else None

    @property
    def roofline_fraction(self) -> float | None:
        vals = self._vals("roofline_fraction")
        return statistics.median(vals) if vals else None

    def distinct(self, fn) -> list[str]:
        seen = []
        for p in self.points:
            v = fn(p)
            if v and v not in seen:
                seen.append(v)
        return seen

    def machines(self) -> list[str]:
        return self.distinct(lambda p: " ".join(x for x in (p.result.machine or p.run.host,
                                                            f"({p.result.device_name})" if p.result.device_name
                                                            else None) if x))

    def versions(self) -> list[str]:
        return self.distinct(versions_of)


def versions_of(p: Point) -> str:
    r = p.result
    parts = [r.framework_version, f"torch {r.torch_version}" if r.torch_version else None,
             f"megatron-core {r.megatron_core_version}" if r.megatron_core_version else None]
    return " · ".join(x for x in parts if x)


@dataclass
class Series:
    """One (case, framework) on one set of inputs, in history order."""

    case: str
    framework: str
    inputs: str | None
    points: list[Point] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return safe_name(f"{self.case}__{self.framework}") + "__" + (self.inputs or "unstated")[:10]

    @property
    def steps(self) -> int:
        return max((p.result.steps if p.result.steps is not None else len(p.result.losses)
                    for p in self.points), default=0)

    def commits(self) -> list[CommitPoint]:
        """One x position per framework commit, in the order commits first appear."""
        by: dict[str, CommitPoint] = {}
        for p in self.points:
            c = short_commit(p.result.framework_commit or p.run.lockstep_commit)
            by.setdefault(c, CommitPoint(c, [])).points.append(p)
        return list(by.values())


@dataclass
class SiteModel:
    runs: list[RunRow]
    latest: dict[tuple[str, str], Point]
    series: dict[tuple[str, str, str | None], Series]
    series_of_pair: dict[tuple[str, str], list[Series]]
    previous: dict[str, RunRow | None]

    def series_for(self, run: RunRow, r: ResultRow) -> Series | None:
        for s in self.series_of_pair.get((r.case, r.framework), []):
            if s.inputs == self._inputs_key(r):
                return s
        return None

    def _inputs_key(self, r: ResultRow) -> str | None:
        if r.inputs_sha256 or r.steps or r.losses:
            return r.inputs_sha256
        return self.unstated_home.get((r.case, r.framework))

    unstated_home: dict[tuple[str, str], str | None] = field(default_factory=dict)

    @property
    def cases(self) -> list[str]:
        return sorted({c for c, _ in self.latest})

    @property
    def frameworks(self) -> list[str]:
        """Baselines first (the reference of the overview's columns), then the rest by name."""
        base = {fw for (_, fw), p in self.latest.items() if p.result.role == "baseline"}
        return sorted({fw for _, fw in self.latest}, key=lambda fw: (fw not in base, fw))


def build_model(runs: list[RunRow]) -> SiteModel:
    latest: dict[tuple[str, str], Point] = {}
    last_inputs: dict[tuple[str, str], str | None] = {}
    last_run_of_pair: dict[tuple[str, str], RunRow] = {}
    previous: dict[str, RunRow | None] = {}
    order = {r.run_id: i for i, r in enumerate(runs)}
    for run in runs:
        prev = [last_run_of_pair[(r.case, r.framework)] for r in run.results if (r.case, r.framework) in last_run_of_pair]
        previous[run.run_id] = max(prev, key=lambda x: order[x.run_id]) if prev else None
        for r in run.results:
            key = (r.case, r.framework)
            latest[key] = Point(run, r)
            last_run_of_pair[key] = run
            if r.inputs_sha256:
                last_inputs[key] = r.inputs_sha256
    model = SiteModel(runs, latest, {}, {}, previous, unstated_home=last_inputs)
    seen = set()
    for run in runs:
        for r in run.results:
            once = (r.case, r.framework, r.record_sha256, r.verdict, r.max_abs_diff) if r.record_sha256 else None
            if once is not None and once in seen:  # a run and a later compare of its records: one point
                continue
            seen.add(once)
            key = (r.case, r.framework, model._inputs_key(r))
            s = model.series.get(key)
            if s is None:
                s = model.series[key] = Series(*key)
                model.series_of_pair.setdefault((r.case, r.framework), []).append(s)
            s.points.append(Point(run, r))
    return model
