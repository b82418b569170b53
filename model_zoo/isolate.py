"""Run a function over many items, each in its own forked process, with a timeout and a memory cap.

The survey and the timm probe build thousands of models; a few hang, a few
allocate tens of GiB and a few crash the interpreter. Each item runs in a
child forked from a parent that has imported the model packages but run no
tensor op (so the fork is safe and the child starts in milliseconds). The
parent polls its children: one that runs past ``timeout`` is killed and
reported as ``timeout``, one whose resident memory passes ``rss_limit`` as
``memory``, one that dies without answering as ``crash``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from .errors import one_line


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildResult:
    item: Any
    ok: bool
    value: Any = None       # what the function returned, when ok
    status: str = "ok"      # ok | error | timeout | memory | crash
    reason: str = ""
    seconds: float = 0.0


def _child(fn: Callable[[Any], Any], item: Any, conn: Any, threads: int) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
        value = fn(item)
        conn.send(("ok", value, ""))
    except BaseException as exc:  # noqa: BLE001 - report every failure to the parent
        conn.send(("error", None, one_line(exc) + "\n" + traceback.format_exc(limit=-3)))
    finally:
        conn.close()


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def run_isolated(fn: Callable[[Any], Any], items: Iterable[Any], *, jobs: int = 1, timeout: float = 60.0,
                 rss_limit: int = 8 << 30, threads: int = 1, poll: float = 0.05) -> Iterator[ChildResult]:
    """Yields one ``ChildResult`` per item, in completion order."""
    ctx = mp.get_context("fork")
    pending = iter(items)
    running: dict[int, tuple[Any, Any, Any, float]] = {}  # pid -> (item, process, conn, start)
    exhausted = False
    while True:
        while not exhausted and len(running) < jobs:
            try:
                item = next(pending)
            except StopIteration:
                exhausted = True
                break
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(fn, item, child_conn, threads), daemon=True)
            proc.start()
            child_conn.close()
            running[proc.pid] = (item, proc, parent_conn, time.monotonic())
        if not running:
            return
        time.sleep(poll)
        for pid, (item, proc, conn, start) in list(running.items()):
            elapsed = time.monotonic() - start
            result = None
            if conn.poll():
                try:
                    kind, value, reason = conn.recv()
                except (EOFError, OSError):
                    kind, value, reason = "crash", None, f"child exited with code {proc.exitcode} before answering"
                result = ChildResult(item=item, ok=kind == "ok", value=value, status=kind,
                                     reason=reason.splitlines()[0] if reason else "", seconds=elapsed)
                if kind == "error":
                    result = ChildResult(item=item, ok=False, value=reason, status="error",
                                         reason=reason.splitlines()[0], seconds=elapsed)
            elif not proc.is_alive():
                code = proc.exitcode
                why = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                result = ChildResult(item=item, ok=False, status="crash", reason=f"child process died: {why}", seconds=elapsed)
            elif elapsed > timeout:
                result = ChildResult(item=item, ok=False, status="timeout", reason=f"timeout: over {timeout:.0f} s", seconds=elapsed)
            elif rss_limit and _rss(pid) > rss_limit:
                result = ChildResult(item=item, ok=False, status="memory",
                                     reason=f"memory: resident set over {rss_limit / 2**30:.1f} GiB", seconds=elapsed)
            if result is None:
                continue
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            conn.close()
            del running[pid]
            yield result
