"""The suite's hooks: what a reporter may implement (by name, see conformance.plugins).

    suite_start(run)                  cases selected, resumed ones dropped; nothing has run yet
    case_outcome(run, case, outcome)  one case finished (in completion order)
    case_progress(run, case, event)   a running case reported progress (a user script's training step)
    suite_finish(run, summary)        every case has an outcome; the summary counts the whole build
"""

from __future__ import annotations

from conformance.plugins import hookspec

PREFIXES = ("suite_", "case_")


class SuiteHooks:
    @hookspec
    def suite_start(self, run):
        """``run`` is the :class:`runner.suite.SuiteRun`: build id, settings, manifest, the cases to run."""

    @hookspec
    def case_outcome(self, run, case, outcome):
        """A case finished; called in the order cases finish."""

    @hookspec
    def case_progress(self, run, case, event):
        """A running case sent a progress event (a dict)."""

    @hookspec
    def suite_finish(self, run, summary):
        """The run is over; ``summary`` is the :class:`runner.suite.SuiteSummary`."""
