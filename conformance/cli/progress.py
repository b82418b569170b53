"""Terminal progress and summaries (rich), shared by the suite commands."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

STATUS_ORDER = ("pass", "mismatch", "error", "unsupported", "cpu_fallback", "crash", "timeout", "skip", "xfail", "xpass")
STATUS_STYLE = {
    "pass": "green", "mismatch": "red", "error": "red", "unsupported": "yellow", "cpu_fallback": "yellow",
    "crash": "bold red", "timeout": "bold red", "skip": "dim", "xfail": "cyan", "xpass": "magenta",
}

console = Console(stderr=False, highlight=False)


@contextmanager
def case_progress(description: str):
    """Yields (start(total), advance(case, outcome)) callbacks for run_suite."""
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=console,
        disable=not sys.stdout.isatty(), transient=False,
    )
    state = {"task": None, "failures": 0}

    def start(total: int) -> None:
        state["task"] = progress.add_task(description, total=total, last="")

    def advance(case, outcome) -> None:
        if outcome.failed:
            state["failures"] += 1
        progress.update(state["task"], advance=1, last=f"{outcome.status.value:12s} {case.title[:60]}")
        if not progress.console.is_terminal and outcome.failed:
            console.print(f"  {outcome.status.value:12s} {case.title}: {outcome.message[:200]}", markup=False, soft_wrap=True)

    with progress:
        yield start, advance


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
