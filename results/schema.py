"""The store's schema: the tables as version 1 shipped them, and one migration per later version.

Tables: ``builds`` (one row per backend build that was tested), ``cases`` (what ran, by stable case
id), ``results`` (one outcome per build and case) and, from version 2, ``reruns`` (the gate's reruns
of a build's cases); version 4 calls the case's category ``category`` (``family`` before). How the SQL is applied, to a new store and to an old one, is
:mod:`results.migrations`.
"""

from __future__ import annotations

SCHEMA_VERSION = 4

# The schema as version 1 shipped it, kept verbatim: every store, new or old, starts from it.
SCHEMA_V1 = """
CREATE TABLE builds (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    label TEXT NOT NULL,
    backend_version TEXT,
    torch_version TEXT,
    manifest TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE cases (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    family TEXT NOT NULL,
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,
    mode TEXT NOT NULL,
    config TEXT NOT NULL,
    title TEXT NOT NULL
);
CREATE TABLE results (
    build_id TEXT NOT NULL REFERENCES builds(id),
    case_id TEXT NOT NULL REFERENCES cases(id),
    outcome TEXT NOT NULL,
    message TEXT NOT NULL,
    metrics TEXT NOT NULL,
    error TEXT,
    duration REAL NOT NULL,
    artifacts TEXT NOT NULL,
    evidence TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (build_id, case_id)
);
CREATE INDEX results_by_outcome ON results(build_id, outcome);
"""

# From version N to N + 1: the SQL of that one step, never edited once shipped (old files depend on it).
MIGRATIONS: dict[int, str] = {
    # 2: the case seed (part of the case id, so rows rebuild the right Case), and the gate's reruns.
    1: """
ALTER TABLE cases ADD COLUMN seed INTEGER NOT NULL DEFAULT 0;
CREATE TABLE reruns (
    build_id TEXT NOT NULL REFERENCES builds(id),
    case_id TEXT NOT NULL REFERENCES cases(id),
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    message TEXT NOT NULL,
    evidence TEXT NOT NULL,
    duration REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (build_id, case_id, attempt)
);
""",
    # 3: how many times the harness ran a case again for a reason outside the backend (a lost node, a killed
    # worker, the memory cap shared by both sides); the retries themselves (node, reason) are in the evidence.
    2: """
ALTER TABLE results ADD COLUMN infra_retries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX results_with_retries ON results(build_id, infra_retries);
""",
    # 4: the case's category (an op's OpInfo variant, a model's family, a distributed suite, a script's
    # convention) was the column ``family``, a word the model zoo and the op suite's input strategies used too.
    3: """
ALTER TABLE cases RENAME COLUMN family TO category;
""",
}
RETRIES_KEY = "infra_retries"  # the outcome's evidence: the retries runner.supervisor made, [{node, reason, ...}]


def statements(sql: str) -> list[str]:
    """The SQL statements of a schema or migration text, one by one."""
    return [s.strip() for s in sql.split(";") if s.strip()]
