"""Observations made inside the process that runs the user's model, shared by both conventions.

Each probe returns plain JSON-ready data; turning observations into findings
(severity, wording, hints) is the parent's job (:mod:`validate.checks`),
so a report can be rebuilt or compared without rerunning anything.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import sys
import traceback
from collections import Counter
from typing import Any, Iterable

import torch

from conformance.serialize import value_bytes
from diff.localize import SourceLine, TraceEvent, exception_frames, find_source
from model_zoo.built import left_behind_by_to

COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from", "aten::_copy_from_and_resize"})
CREATION_OPS = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy", "aten::lift", "aten::scalar_tensor"})
INT32 = (-(2**31), 2**31 - 1)



def _source_dict(source: SourceLine | None) -> dict | None:
    return source.to_dict() if source is not None else None


def placement_from_trace(events: Iterable[TraceEvent], device_type: str) -> list[dict]:
    """Host-side work in the target's forward pass, grouped by (kind, op, source line).

    kinds: ``mixed`` a device op received a CPU tensor (a real device raises "Expected all tensors to be
    on the same device"); ``cpu_tensor`` a tensor was created on the CPU; ``to_host`` a device tensor was
    copied to the CPU (a sync point); ``to_device`` a CPU tensor was copied to the device (each call).
    """
    if device_type == "cpu":
        return []
    groups: Counter = Counter()
    info: dict[tuple, dict] = {}
    for e in events:
        kind = None
        if e.op in COPY_OPS:
            if device_type in e.input_devices and e.output_devices == ("cpu",):
                kind = "to_host"
            elif e.cpu_inputs and e.input_devices == ("cpu",) and device_type in e.output_devices:
                kind = "to_device"
            elif e.op == "aten::copy_" and e.cpu_inputs and device_type in e.input_devices:
                kind = "to_device"
        elif (e.factory or e.op in CREATION_OPS) and e.output_devices == ("cpu",):
            kind = "cpu_tensor"
        elif e.cpu_inputs and device_type in e.input_devices:
            kind = "mixed"
        if kind is None:
            continue
        key = (kind, e.op, e.source.file if e.source else None, e.source.line if e.source else None)
        groups[key] += 1
        info.setdefault(key, {"kind": kind, "op": e.op, "source": _source_dict(e.source), "module": e.module})
    return [{**info[k], "count": n} for k, n in groups.items()]


def placement_scan(model: torch.nn.Module, device_type: str) -> dict:
    """Parameters and buffers left on the CPU, and tensor attributes and modules that ``model.to()`` never moves."""
    cpu_state = []
    if device_type != "cpu":
        for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, t in items:
                if t.device.type == "cpu":
                    cpu_state.append({"kind": kind, "name": name, "shape": list(t.shape), "dtype": _dtype(t)})
    plain = []
    for module_name, module in model.named_modules():
        # keys(): a TorchScript module's _parameters (an OrderedDictWrapper) cannot be iterated directly
        registered = set(module._parameters.keys()) | set(module._buffers.keys())
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr in registered or not isinstance(value, torch.Tensor):
                continue
            if isinstance(value, torch.nn.Parameter):
                continue
            plain.append({"name": f"{module_name}.{attr}" if module_name else attr, "device": value.device.type,
                          "shape": list(value.shape), "dtype": _dtype(value)})
    return {"cpu_state": cpu_state, "plain_tensors": plain, "unregistered_modules": left_behind_by_to(model)}


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def wide_tensors(named: Iterable[tuple[str, Any]]) -> list[dict]:
    """64-bit tensors (int64, float64) that a Neuron compiled graph narrows to 32 bits on the way in."""
    found = []
    for name, t in named:
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.float64):
            continue
        if t.dtype == torch.int64 and t.dim() == 0:
            continue  # a counter (BatchNorm's num_batches_tracked): narrowing it changes nothing
        entry = {"name": name, "dtype": _dtype(t), "shape": list(t.shape)}
        if t.dtype == torch.int64 and t.numel():
            lo, hi = int(t.min()), int(t.max())
            entry.update(min=lo, max=hi, fits=INT32[0] <= lo and hi <= INT32[1])
        elif t.dtype == torch.float64 and t.numel():
            cpu = t.detach().cpu()
            entry["fits"] = bool(torch.equal(cpu.to(torch.float32).to(torch.float64), cpu))
        else:
            entry["fits"] = True
        found.append(entry)
    return found


def named_inputs(args, kwargs) -> list[tuple[str, Any]]:
    from torch.utils._pytree import tree_flatten_with_path, keystr

    items = []
    for path, leaf in tree_flatten_with_path((tuple(args), dict(kwargs or {})))[0]:
        text = keystr(path)
        if text.startswith("[0]"):
            text = "input" + text[3:]
        elif text.startswith("[1]"):
            text = text[3:].strip("[]'\"") or "kwargs"
        items.append((text, leaf))
    return items


SKETCH_SAMPLES = 4096  # values of a tensor, evenly spaced, that its sketch projects
SKETCH_PROJECTIONS = 4
_sketch_signs: list[torch.Tensor] = []


def sketch(cpu: torch.Tensor) -> list[float]:
    """A floating tensor's root mean square and a few projections of its values (evenly spaced samples on
    fixed random signs, scaled by the root of their count): close for two tensors within rounding of each
    other, and for two unrelated ones (another seed, another batch) as far apart as the values themselves."""
    if not _sketch_signs:
        bits = random.Random(0).getrandbits(SKETCH_PROJECTIONS * SKETCH_SAMPLES)  # no torch generator: no draw
        signs = [1.0 if bits >> i & 1 else -1.0 for i in range(SKETCH_PROJECTIONS * SKETCH_SAMPLES)]
        _sketch_signs.append(torch.tensor(signs, dtype=torch.float64, device="cpu").view(SKETCH_PROJECTIONS, -1))
    values = cpu.reshape(-1)
    sample = values[::max(1, values.numel() // SKETCH_SAMPLES)][:SKETCH_SAMPLES].double()
    projections = _sketch_signs[0][:, :sample.numel()] @ sample / sample.numel() ** 0.5
    return [x if math.isfinite(x) else None for x in (sample.pow(2).mean().sqrt().item(), *projections.tolist())]


def fingerprint(tensors: Iterable[Any], sketches: list[list] | None = None) -> str:
    """A hash of the exact values: equal on both sides when they start from the same weights and data.

    ``sketches``, when given, gets each floating tensor's :func:`sketch`: where the hashes differ, they tell
    another start (another seed, a checkpoint read on one side only, another batch: values unrelated) from
    the same start reached through arithmetic on each side's device (values within rounding), as where the
    model's first call comes after training steps (``validate.checks.same_start_within_rounding``)."""
    h = hashlib.sha1()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            if hasattr(t, "to_local"):  # a DTensor: this rank's shard (gathering it would be a collective)
                t = t.to_local()
            cpu = t.detach().to("cpu")  # one copy off the device (on the CPU side, the tensor itself)
            h.update(str(cpu.dtype).encode() + str(tuple(cpu.shape)).encode())
            if cpu.numel():
                h.update(value_bytes(cpu))
                if sketches is not None and cpu.is_floating_point():
                    sketches.append(sketch(cpu))
    return h.hexdigest()[:16]


def compile_observations(graphs: list[dict], *, emulated: bool) -> dict:
    """The graphs compiled on the target, as its GraphCounter saw them (conformance.target.graph_inputs).

    Counted at the torch.compile backend boundary, so the recompilation check sees cpu:compile,
    cuda:compile and a real torch_neuronx alike. Narrowing losses are the emulated compiler's own record
    (a real compiler narrows without telling), so they come only from it.
    """
    losses: list[str] = []
    if emulated:
        from emulator import compile_backend

        losses = list(compile_backend.narrowing_losses)
    return {"events": [{"graph": i, **g} for i, g in enumerate(graphs)], "narrowing_losses": losses}


def error_info(exc: BaseException, *, files: Iterable[str] = (), phase: str = "") -> dict:
    """One-line description of an exception and the user's line that raised it."""
    frames = exception_frames(exc)  # innermost first
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.insert(0, (os.path.abspath(exc.filename), exc.lineno or 0, "<module>"))
    source = find_source(frames, frozenset(os.path.abspath(f) for f in files))
    lines = str(exc).strip().splitlines()
    return {
        "type": type(exc).__name__,
        "message": f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ").strip(),
        "source": _source_dict(source),
        "phase": phase,
        "import_error": isinstance(exc, ImportError),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:],
    }


def progress(path: str | None, **event) -> None:
    """Appends one JSON line to the progress file the parent polls for live status."""
    if not path:
        return
    import json

    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
