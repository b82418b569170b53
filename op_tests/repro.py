"""Reproducers for operator cases: a standalone script plus its saved inputs.

``repro.py`` reruns exactly the failing samples on the reference and on the
target and prints the comparison. Inputs are saved with ``torch.save`` as
plain tensors and a JSON structure and loaded with ``weights_only=True``,
never unpickled. The script needs only torch (it uses neuron-validate's
comparison when installed, ``torch.testing.assert_close`` otherwise), and it
sets the emulator profile and faults the case ran with before importing torch.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from conformance import serialize
from conformance.case import Case
from conformance.outcome import Outcome
from conformance.settings import EMULATOR_ENV

import torch

from .samples import generate_samples, sample_parts
from .rules import rule_for
from .sources import get_op, op_key


def _mark_cpu(t: torch.Tensor) -> torch.Tensor:
    """Saved with a CPU mark: the script keeps this argument on the CPU."""
    t = t.detach().clone()
    t.keep_on_cpu = True
    return t

SCRIPT = '''#!/usr/bin/env python
"""Reproducer for {title} (case {case_id}).

Outcome: {status}: {message}

Run:  python repro.py [--target {target}] [--reference {reference}] [--sample N]
"""
import argparse
from typing import Any  # noqa: F401 - used by the embedded decoder
import json
import os
import sys
from pathlib import Path

CASE = json.loads({case_json!r})
RUN_ENV = json.loads({env_json!r})
for _k, _v in RUN_ENV.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

{decoder}


def load_samples():
    data = torch.load(Path(__file__).with_name("inputs.pt"), weights_only=True)
    return _decode(json.loads(data["structure"]), data["tensors"], True)


def find_op():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if op.name == CASE["name"] and op.variant_test_name == CASE["family"]:
            return op
    sys.exit(f"op {{CASE['name']}} not found in this torch's op_db")


def to_device(value, device):
    from torch.utils._pytree import tree_map

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if getattr(t, "_saved_on", "") == "cpu_argument":  # the op's API wants this argument on the CPU
            return t
        out = t.detach().to(device)
        return out.requires_grad_(t.requires_grad) if (out.is_floating_point() or out.is_complex()) else out

    return tree_map(move, value)


def run(op, sample, device):
    from torch.utils._pytree import tree_leaves

    inp, args, kwargs = to_device((sample["input"], tuple(sample["args"]), sample["kwargs"]), device)
    out = op(inp, *args, **kwargs)
    if CASE["mode"] != "backward":
        return out
    inputs = [t for t in tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    gen = torch.Generator().manual_seed(sample["seed"])
    cots = []
    for o in outputs:
        c = torch.randn(o.shape, generator=gen, dtype=torch.float64)
        if o.is_complex():
            c = torch.complex(c, torch.randn(o.shape, generator=gen, dtype=torch.float64))
        cots.append(c.to(dtype=o.dtype).to(device))
    return list(torch.autograd.grad(outputs, inputs, cots, allow_unused=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--target", default={target!r})
    parser.add_argument("--reference", default={reference!r})
    parser.add_argument("--sample", type=int, default=None, help="only this sample index")
    args = parser.parse_args()
    op = find_op()
    failed = 0
    for sample in load_samples():
        if args.sample is not None and sample["index"] != args.sample:
            continue
        print(f"sample {{sample['index']}}:", flush=True)
        try:
            expected = run(op, sample, args.reference)
        except Exception as exc:
            print(f"  reference raised {{type(exc).__name__}}: {{exc}}")
            continue
        try:
            actual = run(op, sample, args.target)
        except Exception as exc:
            print(f"  target raised {{type(exc).__name__}}: {{exc}}")
            failed += 1
            continue
        try:
            from diff.compare import compare

            result = compare(actual, expected, device=torch.device(args.target).type)
            print("  " + result.report().replace("\\n", "\\n  "))
            failed += not result
        except ImportError:
            try:
                torch.testing.assert_close(actual, expected)
                print("  match")
            except AssertionError as exc:
                print("  " + str(exc).replace("\\n", "\\n  "))
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
'''


def write_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    op = get_op(f"{case.name}.{case.family}" if case.family else case.name)
    samples = generate_samples(op, case)
    failing = [f["sample"] for f in outcome.evidence.get("failures", [])]
    indices = failing or list(range(len(samples)))  # a crash or hang: all samples, in order
    saved = []
    for i in indices:
        inp, args, kwargs = sample_parts(samples[i])
        keep = rule_for(op_key(op)).cpu_arguments
        args = tuple(a if j not in keep or not isinstance(a, torch.Tensor) else _mark_cpu(a) for j, a in enumerate(args))
        saved.append({"index": i, "seed": case.seed * 100_003 + i, "input": inp, "args": list(args), "kwargs": kwargs})
    folder = Path(ctx.artifacts) / "repro" / case.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inputs.pt").write_bytes(serialize.pack(saved))
    env = {k: os.environ[k] for k in EMULATOR_ENV if k in os.environ}
    script = SCRIPT.format(
        title=case.title,
        case_id=case.id,
        status=outcome.status.value,
        message=outcome.message.replace('"""', "'''")[:500],
        target=str(ctx.target.spec.device),
        reference=str(ctx.reference.spec.device),
        case_json=json.dumps(case.to_dict()),
        env_json=json.dumps(env),
        decoder=inspect.getsource(serialize._decode),
    )
    path = folder / "repro.py"
    path.write_text(script)
    return str(path)
