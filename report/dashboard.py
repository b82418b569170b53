"""Per-build dashboards: a static, self-contained HTML site.

``write_dashboard`` writes ``index.html`` plus the files it shows (loss
curves, reproducers) into one folder: no network, no server, no script, so
the folder can be published as a CI artifact or opened from disk. Everything
that comes from results (case names, error messages, build ids) is escaped
by Jinja2's autoescape; nothing is marked safe. Images a run wrote (SVG
included) are shown through ``<img>``, where a script inside them cannot run.

Sections: the headline (op x dtype pass rate; architectures passing
forward, backward and training, per family), regressions and fixes against
a baseline (through ci.baseline, so the dashboard and the gate agree), the
trend over every build in the store, the op x dtype matrix, the model-family
table, the most common errors, grouped, the failing cases with links to
their reproducers, and the loss curves.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from conformance.outcome import FAILING

from results.groups import FailureGroup, failures_from_rows, group_failures

from .coverage import COLUMNS, Headline, headline, model_families, op_matrix

IMAGE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")
# Only each failure group's smallest reproducer is copied into the site, within this budget; every other
# case links to its reproducer in the results folder, so a site stays a few MB however much fails.
REPRO_BUDGET_BYTES = 4 * 2**20
MAX_FAILURE_ROWS = 2000
SERIES_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass(slots=True, kw_only=True)
class Point:
    x: float
    y: float
    label: str


@dataclass(slots=True, kw_only=True)
class Series:
    name: str
    colour: str
    points: list[Point]

    @property
    def polyline(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass(slots=True, kw_only=True)
class Chart:
    """A line chart of pass rates (0-100%) over builds, drawn as inline SVG by the template."""

    width: int
    height: int
    left: int
    top: int
    plot_w: int
    plot_h: int
    series: list[Series]
    xlabels: list[Point]
    yticks: list[Point]
    current_x: float | None = None


def trend_chart(trend: list[tuple[object, Headline]], current: str) -> Chart:
    width, height, left, top, right, bottom = 860, 300, 48, 12, 200, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(trend)

    def x(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(percent: float) -> float:
        return top + plot_h * (1 - percent / 100.0)

    named: dict[str, list[Point]] = {}
    for i, (build, h) in enumerate(trend):
        values = [("op x dtype pairs", h.ops)]
        for fam in h.families:
            values += [(f"{fam.family} {c}", fam.rate(c)) for c in COLUMNS]
        for name, rate in values:
            if rate.percent is not None:
                named.setdefault(name, []).append(
                    Point(x=x(i), y=y(rate.percent), label=f"{build.id}: {name} {rate}"))
    series = [Series(name=k, colour=SERIES_COLOURS[j % len(SERIES_COLOURS)], points=v)
              for j, (k, v) in enumerate(named.items())]
    step = max(1, n // 12)
    xlabels = [Point(x=x(i), y=top + plot_h + 14, label=b.id) for i, (b, _) in enumerate(trend) if i % step == 0 or i == n - 1]
    yticks = [Point(x=left - 6, y=y(p), label=f"{p}%") for p in (0, 25, 50, 75, 100)]
    current_x = next((x(i) for i, (b, _) in enumerate(trend) if b.id == current), None)
    return Chart(width=width, height=height, left=left, top=top, plot_w=plot_w, plot_h=plot_h, series=series,
                 xlabels=xlabels, yticks=yticks, current_x=current_x)


@dataclass(slots=True, kw_only=True)
class Image:
    src: str  # relative URL inside the site
    caption: str


@dataclass(slots=True, kw_only=True)
class Failure:
    case_id: str
    title: str
    status: str
    message: str
    repro: str | None  # relative URL inside the site, or None
    repro_note: str = ""


@dataclass(slots=True, kw_only=True)
class GroupRow:
    """A failure group (results/groups.py) with its smallest reproducer, copied into the site."""

    group: FailureGroup
    repro: str | None  # relative URL inside the site, or None
    repro_note: str = ""


@dataclass(slots=True, kw_only=True)
class ScriptRow:
    """A user script checked in this build (``neuron-validate`` or ``neuron-conformance scripts``)."""

    case_id: str
    script: str
    mode: str
    status: str
    verdict: str
    message: str
    report: str | None  # relative URL of its report.html inside the site, or None


@dataclass(slots=True, kw_only=True)
class TrendRow:
    build: object
    headline: Headline
    current: bool


@dataclass(slots=True, kw_only=True)
class DriftTrendRow:
    """One drifting op x dtype's worst error (max ULP against the CPU) in every build of the store."""

    op: str
    dtype: str
    values: list[str]  # per build, in the trend's order; "–" where the build has no passing case of it


@dataclass(slots=True, kw_only=True)
class Page:
    build: object
    baseline: object | None
    generated: str
    results: str
    headline: Headline
    matrix: object
    families: list
    comparison: object | None
    trend: list[TrendRow]
    chart: Chart | None
    groups: list[GroupRow]
    failures: list[Failure]
    failures_total: int
    images: list[Image]
    survey: list = field(default_factory=list)  # zoo architectures that do not build or train on the CPU
    survey_counts: dict = field(default_factory=dict)  # family -> {status: count}
    columns: tuple[str, ...] = COLUMNS
    repro_links: dict[str, str] = field(default_factory=dict)  # case id -> reproducer inside the site
    scripts: list[ScriptRow] = field(default_factory=list)
    drift: object | None = None  # ci.drift.DriftReport against the baseline
    drift_trend: list[DriftTrendRow] = field(default_factory=list)


class _Copier:
    """Copies files into the site under collision-free, harmless names."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.copied_bytes = 0

    def copy(self, source: Path, folder: str) -> str:
        digest = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:10]
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in source.name)[-80:]
        target = self.out / folder / f"{digest}-{safe}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        self.copied_bytes += target.stat().st_size
        return quote(f"{folder}/{target.name}")

    def copy_repro(self, script: Path, case_id: str) -> str | None:
        """The reproducer's folder (script and saved inputs), if it fits the site's budget."""
        files = [p for p in script.parent.iterdir() if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        if self.copied_bytes + size > REPRO_BUDGET_BYTES:
            return None
        folder = self.out / "repro" / "".join(ch for ch in case_id if ch.isalnum())
        folder.mkdir(parents=True, exist_ok=True)
        for p in files:
            shutil.copyfile(p, folder / p.name)
        self.copied_bytes += size
        return quote(f"repro/{folder.name}/{script.name}")


def _images(store, build_id: str, copier: _Copier) -> list[Image]:
    """Loss curves: images this build's results name, then the ones under artifacts/curves/ that no other
    build claims."""
    images, seen = [], set()
    claimed_by_others = set()
    for b in store.builds():
        for case_id, named in store.artifacts(b.id).items():
            for name, stored in named.items():
                path = store.artifact(stored)
                if path.suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                if b.id != build_id:
                    claimed_by_others.add(path.resolve())
                elif path.is_file() and path.resolve() not in seen:
                    seen.add(path.resolve())
                    result = store.result(build_id, case_id)
                    caption = f"{result.title if result else case_id}: {name}"
                    images.append(Image(src=copier.copy(path, "curves"), caption=caption))
    curves = store.folder / "artifacts" / "curves"
    if curves.is_dir():
        for path in sorted(curves.rglob("*")):
            if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
                resolved = path.resolve()
                if resolved in seen or resolved in claimed_by_others:
                    continue
                seen.add(resolved)
                images.append(Image(src=copier.copy(path, "curves"), caption=str(path.relative_to(curves))))
    return images


def _repro_of(store, row, reruns) -> Path | None:
    stored = row.outcome.repro or next((r.outcome.repro for r in reversed(reruns.get(row.outcome.case_id, []))
                                        if r.outcome.repro), None)
    return store.artifact(stored) if stored else None


def _folder_bytes(script: Path) -> int | None:
    try:
        return sum(p.stat().st_size for p in script.parent.iterdir() if p.is_file())
    except OSError:
        return None


def _failures(store, build_id: str, copier: _Copier) -> tuple[list[GroupRow], list[Failure], int]:
    """Failure groups, each with its smallest reproducer copied into the site, and the failing cases, each
    linking to its reproducer where it lies in the results folder."""
    reruns = store.reruns(build_id)
    rows = list(store.results(build_id, statuses=FAILING))
    paths = {row.outcome.case_id: _repro_of(store, row, reruns) for row in rows}
    # A reproducer written by a rerun counts as the case's own.
    found = [f if f.repro or paths.get(f.case_id) is None else dataclasses.replace(f, repro=str(paths[f.case_id]))
             for f in failures_from_rows(rows)]
    groups = group_failures(found, repro_size=lambda stored: _folder_bytes(store.artifact(stored)))
    group_rows = []
    for g in groups:
        link, note = None, ""
        if g.repro:
            path = store.artifact(g.repro)
            if path.is_file():
                lead = next(m for m in g.members if m.repro == g.repro)
                link = copier.copy_repro(path, lead.case_id)
                note = "" if link else f"not copied (over the site's size budget): {path}"
            else:
                note = f"missing: {path}"
        group_rows.append(GroupRow(group=g, repro=link, repro_note=note))
    failures = []
    for row in rows[:MAX_FAILURE_ROWS]:
        path = paths.get(row.outcome.case_id)
        link, note = None, ""
        if path is not None:
            if path.is_file():
                link = _relative_link(path, copier.out)
            else:
                note = f"missing: {path}"
        failures.append(Failure(case_id=row.outcome.case_id, title=row.title, status=row.outcome.status.value,
                                message=row.outcome.message, repro=link, repro_note=note))
    return group_rows, failures, len(rows)


def _relative_link(path: Path, site: Path) -> str:
    """A link from the site to a file in the results folder (the site works where the results lie)."""
    import os

    try:
        return quote(os.path.relpath(path.resolve(), site.resolve()).replace(os.sep, "/"))
    except ValueError:  # another drive
        return path.resolve().as_uri()


def _scripts(store, build_id: str, copier: _Copier) -> list[ScriptRow]:
    """Each script check of the build with its verdict, linking its report (copied: one self-contained file)."""
    rows = []
    for row in store.results(build_id, kind="script"):
        outcome = row.outcome
        report = None
        stored = (outcome.evidence.get("artifacts") or {}).get("report")
        if stored:
            html = store.artifact(stored).with_suffix(".html")
            if html.is_file():
                report = copier.copy(html, "scripts")
        verdict = outcome.evidence.get("verdict") or ("cannot be checked" if outcome.status.value == "skip" else "")
        rows.append(ScriptRow(case_id=outcome.case_id, script=row.case.name, mode=row.case.mode,
                              status=outcome.status.value, verdict=verdict, message=outcome.message, report=report))
    return rows


MAX_DRIFT_TRENDS = 20  # drifting op x dtype pairs whose trend is drawn, worst first


def _drift(store, build: str, baseline: str, builds: list[str]):
    from ci.drift import precision_drift, precision_trend

    report = precision_drift(store, build, baseline)
    pairs = list(dict.fromkeys((d.name, d.dtype) for d in report.drifts))[:MAX_DRIFT_TRENDS]
    trend = precision_trend(store, pairs, builds)
    rows = [DriftTrendRow(op=name, dtype=dtype, values=["–" if v is None else f"{v:.0f}" for v in trend[(name, dtype)]])
            for name, dtype in pairs]
    return report, rows


def collect(store, *, build: str, baseline: str | None, out: Path) -> Page:
    from ci.baseline import compare_builds, flaky_from_reruns

    info = store.build(build)
    base = store.build(baseline) if baseline else None
    rows = store.statuses(build)
    copier = _Copier(out)
    comparison = None
    if base is not None:
        comparison = compare_builds(store, build, baseline)
        flaky_from_reruns(comparison, store.reruns(build))
    trend = [TrendRow(build=b, headline=headline(store.statuses(b.id)) if b.id != build else None, current=b.id == build)
             for b in store.builds()]
    current = headline(rows, info.manifest)
    for t in trend:
        if t.current:
            t.headline = current
    groups, failures, failures_total = _failures(store, build, copier)
    page = Page(
        build=info, baseline=base, generated=datetime.datetime.now().isoformat(timespec="seconds"),
        results=str(store.path), headline=current, matrix=op_matrix(rows), families=model_families(rows),
        comparison=comparison, trend=trend,
        chart=trend_chart([(t.build, t.headline) for t in trend], build) if trend else None,
        groups=groups, failures=failures, failures_total=failures_total,
        images=_images(store, build, copier),
    )
    page.repro_links = {f.case_id: f.repro for f in failures if f.repro}
    for g in groups:  # a group's lead reproducer is in the site itself
        if g.repro:
            for m in g.group.members:
                if m.repro == g.group.repro:
                    page.repro_links[m.case_id] = g.repro
    page.scripts = _scripts(store, build, copier)
    if base is not None:
        page.drift, page.drift_trend = _drift(store, build, baseline, [t.build.id for t in trend])
    if page.families:
        page.survey_counts, page.survey = _survey()
    return page


def _survey() -> tuple[dict, list]:
    """The shipped zoo survey (model_zoo/data/arch_status.json): per family, what builds; each failure's reason."""
    from model_zoo.status import load_status

    counts: dict[str, dict[str, int]] = {}
    failing = []
    for name, record in sorted(load_status().items()):
        family, status = name.split("/", 1)[0], record.get("status", "?")
        counts.setdefault(family, {})
        counts[family][status] = counts[family].get(status, 0) + 1
        if status != "ok":
            failing.append((name, status, record.get("reason", "")))
    return counts, failing


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).with_name("templates"))),
        autoescape=True,  # every template, whatever its name: results are untrusted text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda rate: "–" if rate.percent is None else f"{rate.percent:.1f}%"
    env.filters["datetime"] = lambda t: datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
    env.filters["status"] = lambda s: "none" if s is None else s.value
    return env


def render(page: Page) -> str:
    return _environment().get_template("dashboard.html.j2").render(page=page)


def write_dashboard(store, *, build: str, baseline: str | None, out: str | Path) -> Path:
    """Writes the site into ``out`` and returns the path of its index.html."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    page = collect(store, build=build, baseline=baseline, out=out)
    index = out / "index.html"
    index.write_text(render(page), encoding="utf-8")
    return index
