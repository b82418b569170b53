"""Terminal summaries (rich), shared by the suite commands; progress while they run is runner.reporters."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

STATUS_ORDER = ("pass", "mismatch", "error", "unsupported", "cpu_fallback", "crash", "timeout", "inconclusive", "skip",
                "xfail", "xpass")
STATUS_STYLE = {
    "pass": "green", "mismatch": "red", "error": "red", "unsupported": "yellow", "cpu_fallback": "yellow",
    "crash": "bold red", "timeout": "bold red", "inconclusive": "magenta", "skip": "dim", "xfail": "cyan", "xpass": "magenta",
}

console = Console(stderr=False, highlight=False)


def summary_table(title: str, counts: dict[str, int], by_group: dict[str, dict[str, int]] | None = None,
                  group_name: str = "dtype") -> Table:
    statuses = [s for s in STATUS_ORDER if counts.get(s)] or ["pass"]
    table = Table(title=title)
    table.add_column(group_name if by_group else "outcome")
    if by_group:
        for s in statuses:
            table.add_column(s, justify="right", style=STATUS_STYLE.get(s))
        table.add_column("total", justify="right")
        for group in sorted(by_group):
            row = by_group[group]
            table.add_row(group, *[str(row.get(s, 0)) for s in statuses], str(sum(row.values())))
        table.add_row("[bold]all", *[f"[bold]{counts.get(s, 0)}" for s in statuses], f"[bold]{sum(counts.values())}")
    else:
        table.add_column("cases", justify="right")
        for s in statuses:
            table.add_row(f"[{STATUS_STYLE.get(s, '')}]{s}", str(counts.get(s, 0)))
    return table
