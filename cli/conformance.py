"""neuron-conformance: suites, gates, dashboards and loss-curve demos.

    neuron-conformance ops      operator conformance (OpInfo x dtypes x forward/backward)
    neuron-conformance models   the model zoo
    neuron-conformance scripts  a folder of user scripts, each checked as neuron-validate checks it
    neuron-conformance gate     regressions of one build against a baseline
    neuron-conformance dashboard  static HTML dashboard of a build
    neuron-conformance curves   side-by-side loss curves of a zoo model
    neuron-conformance merge    merge shard stores into one
    neuron-conformance migrate  upgrade a results store's schema

The entry point only: each ``commands_*`` module adds its subcommands with
``register(subparsers)``, and what several of them share lives below them
(``common.py``, ``suite.py``), never here, so no module imports this one back.
The first line of this docstring is the ``--help`` description: plain text.
"""

from __future__ import annotations

import sys

from . import commands_ci, commands_curves, commands_distributed, commands_models, commands_ops, commands_scripts
from .common import OneLineParser, run_command

PROG = "neuron-conformance"

# In the order --help lists the subcommands.
COMMANDS = (commands_ops, commands_ci, commands_models, commands_curves, commands_scripts, commands_distributed)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(PROG, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
