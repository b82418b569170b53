"""``neuron-validate compare OLD.json NEW.json``: what changed between two runs of the same check.

Typical use: the same script checked before and after a backend or compiler
update. Findings are matched by key (check and subject), so a finding that
appears, disappears or changes severity is reported as such; so are the
verdict, the first diverging layer and op, the loss-curve gap, the speed
ratio, and every manifest entry (versions, environment, emulator profile,
faults) that differs. The exit code is 1 when the new run is worse (a worse
verdict or a new error), else 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .report import SCHEMA
from .verdict import rank


class ReportError(Exception):
    """A file that is not a neuron-validate report (one line)."""


def load_report(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{path}: no such file")
    if p.is_dir():
        candidate = p / "report.json"
        if not candidate.exists():
            raise ReportError(f"{path}: is a directory without a report.json")
        p = candidate
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ReportError(f"{path}: not a neuron-validate report (schema {found!r}, expected {SCHEMA!r})")
    return data


def _flatten(value, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list) and all(not isinstance(x, (dict, list)) for x in value):
        out[prefix] = value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


@dataclass(kw_only=True, slots=True)
class ReportDiff:
    old_verdict: str
    new_verdict: str
    added: list[dict] = field(default_factory=list)
    resolved: list[dict] = field(default_factory=list)
    changed: list[tuple[dict, dict]] = field(default_factory=list)
    metrics: list[tuple[str, object, object]] = field(default_factory=list)
    environment: list[tuple[str, object, object]] = field(default_factory=list)

    @property
    def worse(self) -> bool:
        new_errors = any(f["severity"] == "error" for f in self.added) or any(
            n["severity"] == "error" and o["severity"] != "error" for o, n in self.changed)
        return rank(self.new_verdict) > rank(self.old_verdict) or new_errors

    def to_dict(self) -> dict:
        return {"old_verdict": self.old_verdict, "new_verdict": self.new_verdict, "worse": self.worse,
                "added": self.added, "resolved": self.resolved,
                "changed": [{"old": o, "new": n} for o, n in self.changed],
                "metrics": [{"name": k, "old": a, "new": b} for k, a, b in self.metrics],
                "environment": [{"name": k, "old": a, "new": b} for k, a, b in self.environment]}


ENV_SKIP = ("harness.git_commit",)


def diff_reports(old: dict, new: dict) -> ReportDiff:
    result = ReportDiff(old_verdict=old["verdict"], new_verdict=new["verdict"])
    old_f = {f["key"]: f for f in old.get("findings", [])}
    new_f = {f["key"]: f for f in new.get("findings", [])}
    result.added = [new_f[k] for k in new_f if k not in old_f and new_f[k]["severity"] != "info"]
    result.resolved = [old_f[k] for k in old_f if k not in new_f and old_f[k]["severity"] != "info"]
    result.changed = [(old_f[k], new_f[k]) for k in new_f if k in old_f and old_f[k]["severity"] != new_f[k]["severity"]]

    def metric(name, getter):
        try:
            a = getter(old)
        except (KeyError, TypeError, IndexError):
            a = None
        try:
            b = getter(new)
        except (KeyError, TypeError, IndexError):
            b = None
        if a != b:
            result.metrics.append((name, a, b))

    metric("first diverging layer", lambda r: (r.get("numerics") or {}).get("culprit"))
    metric("first diverging op", lambda r: (((r.get("numerics") or {}).get("ops") or {}).get("first") or {}).get("op"))
    metric("loss curves diverge at step", lambda r: (r.get("curves") or {}).get("diverged_at"))
    metric("greatest loss gap (relative)", lambda r: _round((r.get("curves") or {}).get("max_rel_gap")))
    metric("speed ratio (target/reference)", lambda r: _round((r.get("curves") or {}).get("speed_ratio"), 2))
    metric("host-fallback ops", lambda r: sorted(f["subject"] for f in r["findings"] if f["check"] == "host-fallback"))
    a, b = _flatten(old.get("manifest", {})), _flatten(new.get("manifest", {}))
    for key in sorted(set(a) | set(b)):
        if key.startswith(ENV_SKIP) or key.endswith(("platform",)):
            continue
        if a.get(key) != b.get(key):
            result.environment.append((key, a.get(key), b.get(key)))
    return result


def _round(x, digits: int = 4):
    return round(x, digits) if isinstance(x, (int, float)) else x


def print_diff(d: ReportDiff, old_path: str, new_path: str, console) -> None:
    from rich.markup import escape

    style = "bold red" if d.worse else "bold green"
    arrow = f"{d.old_verdict} -> {d.new_verdict}" if d.old_verdict != d.new_verdict else f"{d.new_verdict} (unchanged)"
    console.print(f"[bold]neuron-validate compare[/] {escape(old_path)} -> {escape(new_path)}")
    console.print(f"verdict: [{style}]{escape(arrow)}[/]")
    for f in d.added:
        console.print(f"  [red]+ new {f['severity']}[/] {f['check']}: {escape(f['title'])}")
    for f in d.resolved:
        console.print(f"  [green]- resolved {f['severity']}[/] {f['check']}: {escape(f['title'])}")
    for o, n in d.changed:
        console.print(f"  [yellow]~ {o['severity']} -> {n['severity']}[/] {n['check']}: {escape(n['title'])}")
    for name, a, b in d.metrics:
        console.print(f"  {name}: {escape(str(a))} -> {escape(str(b))}")
    if d.environment:
        console.print("environment changes:")
        for name, a, b in d.environment[:40]:
            console.print(f"  {escape(name)}: {escape(str(a))} -> {escape(str(b))}")
        if len(d.environment) > 40:
            console.print(f"  ... and {len(d.environment) - 40} more")
    if not (d.added or d.resolved or d.changed or d.metrics or d.environment):
        console.print("no changes")
