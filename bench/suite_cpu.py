"""Where the test suite's processor time goes: every process it starts, by kind.

    .venv/bin/python bench/suite_cpu.py [--interval 0.3] [--top 12] [-- COMMAND ...]

Runs COMMAND (default: the README's test command, ``python -m pytest -n 2 -q``) and reads ``/proc`` every
``--interval`` seconds meanwhile: each process's command line, parent and processor time (user + system)
as last seen. Then it prints the wall time, the processor time of all the processes seen, and that time by
kind of process: the test processes, the CLIs by subcommand, zygotes and spawned workers (and whose they
are), workers forked from a zygote, the distributed launcher's processes, Ray's. Start-up (a new interpreter
importing torch and OpInfo's database: 3 to 5 s of a core each) against the cases' own work is what it shows.

Linux only. A process that lives less than one interval may be missed, and one's time is as last seen (up to
one interval short); both are small beside the suite's. Processes that other work starts meanwhile are
counted too, and any other work slows the suite's: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    pid: int
    ppid: int
    command: str
    cpu_s: float


def _read(pid: str) -> tuple[int, float, int] | None:
    """(parent pid, processor seconds, start time in ticks), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[19])


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def sample(seen: dict[tuple[int, int], Seen], stop: threading.Event, interval: float) -> None:
    """Records every process of the machine until ``stop`` (keyed by pid and start time: pids are reused)."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            read = _read(pid)
            if read is None:
                continue
            ppid, cpu, start = read
            key = (int(pid), start)
            if key in seen:
                seen[key].cpu_s = cpu
            else:
                seen[key] = Seen(pid=int(pid), ppid=ppid, command=_command(pid), cpu_s=cpu)
        stop.wait(interval)


def kind(process: Seen, by_pid: dict[int, Seen]) -> str:
    """What a process is, from its command line and its parent's."""
    command = process.command
    cli = re.search(r"bin/(neuron-conformance|neuron-validate)(?:\s+(\S+))?", command)
    if cli:
        return f"CLI {cli.group(1)}" + (f" {cli.group(2)}" if cli.group(1) == "neuron-conformance" else "")
    if "spawn_main" in command:
        parent = by_pid.get(process.ppid)
        if parent is not None and "spawn_main" in parent.command:
            return "worker forked from a zygote (or a spawned process's child)"
        return f"zygote or spawned worker, of: {kind(parent, by_pid) if parent else 'gone'}"
    if "forkserver" in command:
        return "multiprocessing forkserver and its children (the distributed launcher's ranks)"
    if "pytest" in command or "execnet" in command or "-u -c import sys;exec(eval(sys.stdin.readline()))" in command:
        return "test processes (pytest, xdist workers)"
    if "default_worker.py" in command:
        return "Ray workers"
    if any(name in command for name in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py")):
        return "Ray daemons"
    if not command:
        return "ended before its command line was read"
    return "other: " + " ".join(command.split()[:2])[-60:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.3)
    parser.add_argument("--top", type=int, default=12, help="kinds printed, most processor time first")
    parser.add_argument("command", nargs="*", help="the command to measure (after --)")
    args = parser.parse_args(argv)
    command = args.command or [sys.executable, "-m", "pytest", "-n", "2", "-q"]
    before = {(int(p), r[2]) for p in os.listdir("/proc") if p.isdigit() and (r := _read(p)) is not None}
    seen: dict[tuple[int, int], Seen] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, stop, args.interval), daemon=True)
    sampler.start()
    started = time.perf_counter()
    code = subprocess.call(command)
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    mine = {k: s for k, s in seen.items() if k not in before and s.pid != os.getpid()}
    by_pid = {s.pid: s for s in mine.values()}
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for process in mine.values():
        entry = totals[kind(process, by_pid)]
        entry[0] += process.cpu_s
        entry[1] += 1
    cpu = sum(s.cpu_s for s in mine.values())
    print(f"command: {' '.join(command)} (exit {code})")
    print(f"wall {wall:,.1f} s; processor time {cpu:,.1f} s in {len(mine)} processes ({cpu / wall:.2f} cores)")
    for name, (seconds, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{seconds:9,.1f} s {count:5d}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
