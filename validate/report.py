"""Reports: the terminal summary, ``report.json`` (with the full environment manifest) and ``report.html``.

``report.json`` is the record: the verdict, every finding with its evidence,
the layer and op comparison, both loss curves, and the manifest of both sides
(versions, environment variables, emulator profile and faults) so that the
check can be reproduced and compared with ``neuron-validate compare``.
``report.html`` is one self-contained file: the plots are inlined as SVG.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from .verdict import EXIT_CODES, Finding

if TYPE_CHECKING:
    from diff.curves import CurveComparison

SCHEMA = "neuron-validate.report/1"
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
SEVERITY_MARK = {"error": "x", "warning": "!", "info": "-"}
VERDICT_STYLE = {"ready": "bold green", "ready with warnings": "bold yellow", "not ready": "bold red"}


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (root / ".git" / ref[5:]).read_text().strip()
        return ref
    except OSError:
        return None


def build_report(*, obs: dict, findings: list[Finding], verdict: str, script, options, argv: list[str],
                 curves: CurveComparison | None, labels: dict) -> dict:
    loc = obs.get("localization")
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["neuron-validate", *argv],
        "cwd": os.getcwd(),
        "script": {"path": script.path, "display": script.display, "sha256": _sha256(script.path),
                   "convention": script.convention, "args": list(options.script_args)},
        "target": {"spec": options.target, "label": labels["target"]},
        "reference": {"spec": options.reference, "label": labels["reference"]},
        "mode": options.mode,
        "steps": options.steps,
        "seed": options.seed,
        "verdict": verdict,
        "exit_code": EXIT_CODES[verdict],
        "counts": {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")},
        "findings": [f.to_dict() for f in findings],
        "model": obs.get("model") or obs.get("target", {}).get("model"),
        "numerics": loc,
        "compiled": obs.get("compiled"),
        "curves": curves.to_dict() if curves is not None else None,
        "randomness": _randomness(obs),
        "notes": list(obs.get("notes", [])),
        "timings": {"total_s": obs.get("seconds"), "reference_s": obs.get("reference", {}).get("seconds"),
                    "target_s": obs.get("target", {}).get("seconds")},
        "manifest": {**(obs.get("manifest") or {}),
                     "harness": {"neuron_validate": _version(), "git_commit": _git_commit()}},
        "artifacts": {},
    }


def _randomness(obs: dict) -> dict | None:
    """What the sides drew (diff.draws): counts, the parting draw, the log's size, the own-stream check's
    draw differences, and the time of the target's training with shared draws against its own stream."""
    draws = obs.get("draws")
    if not draws:
        return None
    own = obs.get("own_stream") or {}
    steps = len(((obs.get("reference") or {}).get("curve") or {}).get("losses") or ()) or None
    shared_s, own_s = (obs.get("target") or {}).get("seconds"), own.get("seconds")
    return {**draws, "log_bytes_per_step": draws.get("log_bytes", 0) / steps if steps else None,
            "draw_differences": own.get("draw_differences", []), "stream_runs": len(own.get("streams") or ()),
            "target_seconds_shared": shared_s, "target_seconds_own": own_s,
            "harness": list(obs.get("harness") or [])}


def _version() -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version("neuron-validate")
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------- files
def write_plots(report: dict, out: Path, curves: CurveComparison | None) -> dict[str, list[str]]:
    from diff.plots import plot_curves, plot_layers

    plots: dict[str, list[str]] = {}
    if curves is not None and curves.steps:
        paths = plot_curves(curves, out / "loss_curves", title=f"{report['script']['display']}: loss")
        plots["loss_curves"] = [str(p) for p in paths]
    layers = (report.get("numerics") or {}).get("layers") or []
    if any(x["phase"] == "forward" for x in layers):
        paths = plot_layers(layers, out / "layers", title="relative error by depth (forward)")
        plots["layers"] = [str(p) for p in paths]
    return plots


def write_json(report: dict, out: Path) -> Path:
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    return path


def _inline_svg(path: str) -> str:
    text = Path(path).read_text()
    text = re.sub(r"<\?xml[^>]*\?>", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>", "", text)
    return text.strip()


def write_html(report: dict, out: Path) -> Path:
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    template = env.get_template("report.html.j2")
    svgs = {name: Markup(_inline_svg(next(p for p in paths if p.endswith(".svg"))))
            for name, paths in report["artifacts"].get("plots", {}).items()}
    path = out / "report.html"
    path.write_text(template.render(r=report, svgs=svgs, manifest_json=json.dumps(report["manifest"], indent=1),
                                    verdict_class=report["verdict"].replace(" ", "-")))
    return path


def write_reports(report: dict, out: Path, curves: CurveComparison | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    report["artifacts"]["plots"] = write_plots(report, out, curves)
    report["artifacts"]["json"] = str(out / "report.json")
    report["artifacts"]["html"] = str(out / "report.html")
    write_json(report, out)
    write_html(report, out)
    return report["artifacts"]


# ---------------------------------------------------------------- terminal
def print_summary(report: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    script = report["script"]
    console.print(f"[bold]neuron-validate[/] {escape(script['display'])} ({script['convention']} convention): "
                  f"[bold]{escape(report['target']['label'])}[/] against {escape(report['reference']['label'])}")
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("", width=1)
    table.add_column("check", no_wrap=True)
    table.add_column("finding")
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(report["findings"], key=lambda f: order[f["severity"]]):
        style = SEVERITY_STYLE[f["severity"]]
        text = escape(f["title"])
        if f.get("where"):
            text += f"\n  at {escape(f['where'])}"
        if f["severity"] != "info" and f.get("detail"):
            for line in f["detail"].splitlines()[:4]:  # long lines end at a word, never inside one
                text += f"\n  [dim]{escape(textwrap.shorten(line, width=240, placeholder=' ...'))}[/]"
        if f["severity"] != "info" and f.get("hint"):
            text += f"\n  [cyan]hint:[/] {escape(f['hint'])}"
        table.add_row(f"[{style}]{SEVERITY_MARK[f['severity']]}[/]", f"[{style}]{f['check']}[/]", text)
    console.print(table)
    layers = [x for x in ((report.get("numerics") or {}).get("layers") or []) if x["phase"] == "forward"]
    bad = next((i for i, x in enumerate(layers) if not x["ok"]), None)
    if bad is not None:
        t = Table(title="error by depth (forward, relative RMS against the float64 golden)", box=None,
                  title_justify="left", header_style="bold")
        t.add_column("layer")
        t.add_column("target", justify="right")
        t.add_column("reference", justify="right")
        t.add_column("")
        rows = list(range(max(0, bad - 2), min(len(layers), bad + 4)))
        if len(layers) - 1 not in rows:
            rows.append(len(layers) - 1)
        fmt = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
        for i in rows:
            x = layers[i]
            mark = "[red]first diverging[/]" if i == bad else ("" if x["ok"] else "[red]x[/]")
            t.add_row(escape(x["label"]), fmt(x["rel_error"]), fmt(x["reference_rel_error"]), mark)
        console.print(t)
    curves = report.get("curves")
    if curves:
        console.print(f"loss curves: {escape(curves['summary'])}")
    plots = report["artifacts"].get("plots", {})
    if "loss_curves" in plots:
        console.print(f"loss curve plot: {plots['loss_curves'][0]}", soft_wrap=True)
    verdict = report["verdict"]
    counts = report["counts"]
    console.print(f"verdict: [{VERDICT_STYLE[verdict]}]{verdict.upper()}[/] "
                  f"({counts['error']} errors, {counts['warning']} warnings) in {report['timings']['total_s'] or 0:.1f} s")
    console.print(f"report: {report['artifacts'].get('html')} and {report['artifacts'].get('json')}", soft_wrap=True)
