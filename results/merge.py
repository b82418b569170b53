"""Merging stores: shard outputs into one build, or one results folder into another.

In three steps: the records of the builds copied (each in its own small transaction, keeping the
first record of a build and the earliest start), then the source's artifacts folder (files, outside
any transaction), then all their results and reruns in one transaction. A merge killed part-way
leaves at most build records and artifact files without their results, never some of a source's
results; merging it again completes it, and merging a shard twice changes nothing. Artifact paths
are rebased onto the copied files.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from conformance.outcome import Outcome
from results.paths import artifact_path, stored_path
from results.rows import CASE_COLUMNS, BuildInfo, case_from_columns
from results.writes import Transaction, ensure_build, insert_result, insert_rerun


def copy_builds(into: sqlite3.Connection, into_folder: Path, source: sqlite3.Connection, source_folder: Path,
                builds: list[BuildInfo]) -> int:
    """Copies ``builds`` of the source store, with their results, reruns and artifacts, into another store;
    returns the number of results copied."""
    for b in builds:
        ensure_build(into, b.id, target=b.target, label=b.label, manifest=b.manifest, created=b.created)
    artifacts = source_folder / "artifacts"
    if artifacts.is_dir():
        shutil.copytree(artifacts, into_folder / "artifacts", dirs_exist_ok=True)

    def rebase(stored: str) -> str:
        """Where a file the source names lives after its artifacts were copied."""
        path = artifact_path(source_folder, stored)
        try:
            return str(into_folder / path.resolve().relative_to(source_folder.resolve()))
        except ValueError:
            return str(path)

    copied = 0
    with Transaction(into):
        for b in builds:
            for created, *case_columns, evidence in source.execute(
                    f"SELECT r.created, {CASE_COLUMNS}, r.evidence "
                    "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=?", (b.id,)):
                outcome = Outcome.from_dict(json.loads(evidence))
                if outcome.repro:
                    outcome.repro = rebase(outcome.repro)
                extra = outcome.evidence.get("artifacts")
                if isinstance(extra, dict):
                    outcome.evidence["artifacts"] = {k: rebase(v) for k, v in extra.items() if v}
                insert_result(into, into_folder, b.id, case_from_columns(*case_columns), outcome, created=created)
                copied += 1
            for case_id, attempt, evidence, created in source.execute(
                    "SELECT case_id, attempt, evidence, created FROM reruns WHERE build_id=?", (b.id,)):
                record = json.loads(evidence)
                if record.get("repro"):
                    record["repro"] = stored_path(into_folder, rebase(record["repro"]))
                insert_rerun(into, b.id, case_id, attempt, record, created=created)
    return copied
