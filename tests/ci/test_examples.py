"""The example CI workflow and expectations file stay in step with the command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from ci.expectations import load_expectations
from cli.conformance import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "ci" / "examples"


def commands(workflow: dict) -> list[list[str]]:
    """Every neuron-conformance command line in the workflow's run steps, ${{ }} and $VARS filled in."""
    found = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                line = re.sub(r"\$\{\{[^}]*\}\}", "1", line).split("||")[0]
                line = line.replace("$SHARDS", "4").replace('"$BUILD"', "b2").replace('"$BASELINE"', "b1")
                if "neuron-conformance" in line:
                    words = shlex.split(line.split("then", 1)[-1].split(";")[0])
                    found.append(words[words.index(next(w for w in words if w.endswith("neuron-conformance"))) + 1:])
    return found


def test_workflow_shards_runs_merges_gates_and_publishes():
    workflow = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    assert workflow["jobs"]["sweep"]["strategy"]["matrix"]["shard"] == [1, 2, 3, 4]
    parser = build_parser()
    seen = []
    for argv in commands(workflow):
        args = parser.parse_args(argv)  # exits (and fails the test) on an option the CLI does not have
        seen.append(args.command)
    assert seen == ["ops", "models", "migrate", "merge", "gate", "dashboard"]


def test_example_expectations_load():
    exp = load_expectations(EXAMPLES / "neuron-expectations.toml")
    assert exp.backend == "neuron" and len(exp.failures) == 2
