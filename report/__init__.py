"""Per-build dashboards and coverage headlines from the results store."""
