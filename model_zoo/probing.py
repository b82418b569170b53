"""Running a probe over many zoo entries, each isolated: the survey's and timm's size probe's loop.

Each entry is a case of kind ``survey`` (its category names the probe, ``build`` or ``timm-probe``; the
executor is in survey.py) on the runner's supervisor, so a hang, a memory
blow-up or a crash costs that entry, never the run, with the rules every
case gets.
"""

from __future__ import annotations

from conformance.case import Case
from conformance.outcome import Status


def run_probes(probe: str, names: list[str], *, jobs: int, timeout: float, rss_limit_mb: int):
    """Yields (name, ok, record or None, status, reason, seconds) per entry, in completion order.

    Each entry runs on the supervisor like any case: one that runs past
    ``timeout`` is ``timeout``, one that needs more memory than the cap is
    ``memory``, one whose process dies is ``crash``, one that raises is ``error``.
    """
    from conformance.settings import RunSettings
    from runner.supervisor import Supervisor

    settings = RunSettings(target="cpu", timeout_s=timeout, rss_limit_mb=rss_limit_mb, threads=1,
                           env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    cases = {Case(kind="survey", name=name, category=probe).id: name for name in names}
    with Supervisor(settings, jobs=jobs) as supervisor:
        for outcome in supervisor.run(Case(kind="survey", name=name, category=probe) for name in names):
            name = cases[outcome.case_id]
            if outcome.status is Status.PASS:
                yield name, True, outcome.evidence["record"], "ok", "", outcome.duration_s
                continue
            status = {Status.TIMEOUT: "timeout", Status.ERROR: "error"}.get(outcome.status, "crash")
            if outcome.evidence.get("memory_cap"):
                status = "memory"
            yield name, False, None, status, outcome.message.splitlines()[0] if outcome.message else "", \
                outcome.duration_s
