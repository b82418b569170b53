"""Reproducers for operator cases: a standalone script plus its saved inputs, at most 1 MB by default.

``repro.py`` reruns the failing sample on the reference and on the target
and prints the comparison. For a failure judged in the worker (a mismatch,
an error), the saved sample is the failing one with the fewest input bytes,
shrunk while it keeps failing the same way (shrink.py); the script says
which input strategy found it ("length 129 on dim -1", "transposed input")
and how it was shrunk. After a crash or a hang, samples are saved in order
while they fit the budget. Inputs are saved with ``torch.save`` as plain
tensors and a JSON structure and loaded with ``weights_only=True``, never
unpickled. The script needs only torch (it uses neuron-validate's target
resolution and comparison when installed, ``torch.testing.assert_close``
otherwise); it sets the emulator profile, faults and backend modules the
case ran with before importing torch.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from conformance import serialize
from conformance.case import Case
from conformance.outcome import Outcome
from conformance.outcome import Status
from conformance.settings import BACKEND_MODULES_ENV, EMULATOR_ENV
from diff.sides import same_layout_copy

import torch

from .samples import generate_samples, sample_parts, sample_variant
from .rules import resolved_for_device, rule_for
from .sources import case_op, op_key, sample_seed

JUDGED = (Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED)  # failures seen in the worker, not crashes or hangs


def _mark_cpu(t: torch.Tensor) -> torch.Tensor:
    """Saved with a CPU mark: the script keeps this argument on the CPU."""
    t = t.detach().clone()
    t.keep_on_cpu = True
    return t

SCRIPT = '''#!/usr/bin/env python
"""Reproducer for {title} (case {case_id}).

Outcome: {status}: {message}
{found}
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
BACKEND_MODULES = [m for m in RUN_ENV.get("NEURON_VALIDATE_BACKEND_MODULES", "").split(",") if m]
COMPILE_BACKEND = {compile_backend!r}  # a DEVICE:compile target compiles each sample whole with this backend
sys.path.insert(0, os.getcwd())  # backend modules named relative to where the run started

import torch  # noqa: E402

{decoder}

{same_layout_copy}

{run_variant}


def prepare_target(target):
    """The target device, set up as the run did: neuron-validate's resolution when installed."""
    try:
        from conformance.target import resolve_target
    except ImportError:
        import importlib

        for name in BACKEND_MODULES:
            importlib.import_module(name)
        return
    resolve_target(target, backend_modules=tuple(BACKEND_MODULES))


def load_samples():
    data = torch.load(Path(__file__).with_name("inputs.pt"), weights_only=True)
    return _decode(json.loads(data["structure"]), data["tensors"], True)


def find_op():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if op.name == CASE["name"] and op.variant_test_name == CASE["category"]:
            return op
    sys.exit(f"op {{CASE['name']}} not found in this torch's op_db")


def to_device(value, device):
    from torch.utils._pytree import tree_map

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if getattr(t, "_saved_on", "") == "cpu_argument":  # the op's API wants this argument on the CPU
            return t
        out = same_layout_copy(t.detach(), device)  # the layout the case saw: a kernel may take another path
        return out.requires_grad_(t.requires_grad) if (out.is_floating_point() or out.is_complex()) else out

    return tree_map(move, value)


def run(op, sample, target):
    from torch.utils._pytree import tree_leaves

    device, _, mode = target.partition(":")
    inp, args, kwargs = to_device((sample["input"], tuple(sample["args"]), sample["kwargs"]), device)
    call = (lambda i, *a, **k: run_variant(op, sample["variant"], i, a, k)) if sample.get("variant") else op
    if mode == "compile":  # as the case ran it: one graph, whole, for this sample alone
        torch._dynamo.reset()
        call = torch.compile(call, backend=COMPILE_BACKEND, fullgraph=True, dynamic=False)
    out = call(inp, *args, **kwargs)
    if sample.get("variant"):
        return out
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
    prepare_target(args.target)
    op = find_op()
    failed = 0
    samples = load_samples()
    if not samples:
        sys.exit("no inputs were saved: " + NOTE)
    for sample in samples:
        if args.sample is not None and sample["index"] != args.sample:
            continue
        print(f"sample {{sample['index']}} (found by: {{sample.get('found_by') or 'OpInfo sample'}}"
              + (f"; {{sample['shrunk']}}" if sample.get("shrunk") else "") + "):", flush=True)
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

            result = compare(actual, expected, device=torch.device(args.target.split(":")[0]).type)
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


NOTE = {note!r}

if __name__ == "__main__":
    main()
'''


def write_repro(case: Case, outcome: Outcome, ctx, *, check=None) -> str | None:
    """Writes the reproducer; ``check(op, case, sample, index, target)`` judges a shrunk candidate (None: the
    failing sample is saved as it is)."""
    op = case_op(case)
    samples = resolved_for_device(op_key(op), generate_samples(op, case), ctx.target.device.type)
    budget = int(getattr(ctx.settings, "repro_max_bytes", DEFAULT_MAX_BYTES))
    failing = [f["sample"] for f in outcome.evidence.get("failures", []) if f["sample"] < len(samples)]
    keep = rule_for(op_key(op)).cpu_arguments
    note = ""
    if failing and outcome.status in JUDGED:
        chosen = min(failing, key=lambda i: (_input_bytes(samples[i]), i))
        saved_sample, shrunk = _shrunk(op, case, samples[chosen], chosen, outcome, ctx, check)
        saved = [_record(saved_sample, chosen, case, keep, shrunk)]
        payload = serialize.pack(saved)
        if len(payload) > budget:
            note = (f"the smallest failing sample needs {len(payload) / 2**20:.1f} MB of inputs, over the "
                    f"{budget / 2**20:.1f} MB budget; rerun the case: neuron-conformance ops --ops {case.name}")
            payload = serialize.pack([])
    else:  # a crash or a hang: every sample, in order, while they fit (the process died, so nothing was shrunk)
        saved, payload = [], serialize.pack([])
        for i in range(len(samples)):
            attempt = serialize.pack(saved + [_record(samples[i], i, case, keep, "")])
            if len(attempt) > budget:
                note = f"samples {i} and later are not saved (over the {budget / 2**20:.1f} MB budget)"
                break
            saved.append(_record(samples[i], i, case, keep, ""))
            payload = attempt
    folder = Path(ctx.artifacts) / "repro" / case.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inputs.pt").write_bytes(payload)
    env = {k: os.environ[k] for k in (*EMULATOR_ENV, BACKEND_MODULES_ENV) if k in os.environ}
    from .strategies.variants import run_variant

    found = ""
    if saved and saved[0].get("found_by"):
        found = f"Found by: {saved[0]['found_by']}" + (f"; {saved[0]['shrunk']}" if saved[0].get("shrunk") else "")
    script = SCRIPT.format(
        title=case.title,
        case_id=case.id,
        status=outcome.status.value,
        message=outcome.message.replace('"""', "'''")[:500],
        found=found.replace('"""', "'''"),
        target=str(ctx.target.spec),  # DEVICE:compile reproduces compiled
        compile_backend=ctx.target.compile_backend() if ctx.target.compiles else "",
        reference=str(ctx.reference.spec.device),
        case_json=json.dumps(case.to_dict()),
        env_json=json.dumps(env),
        decoder=inspect.getsource(serialize._decode),
        same_layout_copy=inspect.getsource(same_layout_copy),
        run_variant=inspect.getsource(run_variant),
        note=note,
    )
    path = folder / "repro.py"
    path.write_text(script)
    return str(path)


DEFAULT_MAX_BYTES = 2**20


def _input_bytes(sample) -> int:
    from .shrink import input_bytes

    return input_bytes(sample)


def _shrunk(op, case: Case, sample, index: int, outcome: Outcome, ctx, check):
    """The sample shrunk while it fails as the case did: the outcome's status and, where the case named one,
    its cause (evidence["cause"]); the sample as it was when shrinking is off."""
    from .causes import ALL_INPUTS, SOME_INPUTS, sample_facts
    from .shrink import FailureKind, shrink

    if check is None or not getattr(ctx.settings, "shrink", True):
        return sample, ""
    cause = (outcome.evidence.get("cause") or {}).get("key")
    if cause in (ALL_INPUTS[0], SOME_INPUTS[0]):
        cause = None  # no fact of the inputs separates the failing samples: there is no cause to keep
    strategy = case.config.get("inputs", "")

    def fails_how(candidate) -> FailureKind:
        status = check(op, case, candidate, index, ctx.target).status
        return FailureKind(status, cause if cause in sample_facts(candidate, strategy, case.name) else None)

    result = shrink(sample, FailureKind(outcome.status, cause), fails_how)
    return result.sample, result.describe()


def _record(sample, index: int, case: Case, keep: tuple[int, ...], shrunk: str) -> dict:
    inp, args, kwargs = sample_parts(sample)
    args = tuple(a if j not in keep or not isinstance(a, torch.Tensor) else _mark_cpu(a) for j, a in enumerate(args))
    return {"index": index, "seed": sample_seed(case, index), "input": inp, "args": list(args), "kwargs": kwargs,
            "variant": sample_variant(sample), "found_by": sample.name or "", "shrunk": shrunk}
