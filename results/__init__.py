"""The results store (SQLite: builds, cases, results) and per-build dashboards."""
