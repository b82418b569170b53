"""``neuron-validate SCRIPT``: migration check of a user's own script (see conformance.validate)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from conformance.validate.cli import main as validate_main

    return validate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
