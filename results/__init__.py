"""The results store (SQLite: builds, cases, results, reruns; :mod:`results.store`) and failure groups."""
