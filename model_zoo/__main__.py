"""``python -m model_zoo``: see ``model_zoo.cli``."""

from .cli import main

raise SystemExit(main())
