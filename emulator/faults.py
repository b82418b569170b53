"""Fault injection into the emulated device, for the harness's own tests.

A test that claims the harness finds bugs must break a backend for real and
watch the harness catch it. Faults are given as a spec string, in the
environment variable NEURON_VALIDATE_FAULTS (so worker processes inherit
them) or through :func:`emulator.set_faults`::

    KIND@OP_GLOB[,key=value...][;KIND@OP_GLOB...]

    perturb@aten::tanh,rel=0.01          outputs scaled by (1 + rel)
    perturb@aten::mm,rel=0.01,phase=backward
    raise@aten::cumsum                   the op raises
    crash@aten::sort                     segfault (also: abort)
    hang@aten::topk                      never returns
    wrong_dtype@aten::add                fresh outputs come back in another dtype
    wrong_shape@aten::mul                fresh outputs gain a leading dimension
    host_fallback@aten::gelu             runs on the host silently (tracked, no warning)
    host_output@aten::relu               outputs come back as CPU tensors
    perturb@aten::tanh,rel=0.005,mode=compile   only inside compiled graphs
    crash@aten::tanh,mode=compiler       the compiler itself dies (also: abort, hang, raise) while compiling a graph
                                         that holds the op; the op's kernels are untouched
    hog@aten::mm,mb=8192                 the kernel allocates (and touches) an 8 GiB workspace
    crash@aten::sort,host=1              the host's own (CPU) kernel crashes too: a bug in a library
                                         both sides share, which the reference cannot survive either

Collectives of the ``neuron`` process group (process_group.py) are named ``c10d::allreduce``,
``c10d::reduce``, ``c10d::reduce_scatter``, ``c10d::broadcast``, ``c10d::all_gather``, ``c10d::gather``,
``c10d::scatter``, ``c10d::all_to_all``, ``c10d::send``, ``c10d::recv`` and ``c10d::barrier``:

    drop@c10d::allreduce,rank=1          rank 1's contribution is zeros (default: the last rank)
    wrong_op@c10d::reduce_scatter        reduces with MAX instead of SUM (any other op: SUM)
    stale@c10d::all_gather               the output buffer is left as it was
    offset@c10d::allreduce               the result is written at the start of the output's storage,
                                         ignoring a view's offset
    perturb@c10d::allreduce,rel=0.01     results scaled by (1 + rel)
    hang@c10d::allreduce,rank=0          the collective never returns on rank 0

Keys: ``rel`` (perturb), ``mb`` (hog), ``rank`` (collectives: only on that rank), ``mode`` (any | eager | compile: only in eager code, or only
inside graphs ``torch.compile(backend="neuron")`` built: a compiler's bug; compiler: in the compiler, as it compiles
a graph that holds the op; raise, crash, abort or hang only), ``host`` (crash, abort, hang: 1 breaks the
CPU kernel of that exact op too), ``phase`` (any | forward | backward), ``dtype``
(only when an input has this dtype, e.g. ``float32``), ``p`` (probability
that the fault is active in a process: a flaky fault; drawn again in each forked child, so the workers a
preloaded parent forks draw as spawned ones do).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

FAULTS_ENV = "NEURON_VALIDATE_FAULTS"

FAULT_KINDS = {
    "perturb": 0,
    "raise": 1,
    "crash": 2,
    "hang": 3,
    "wrong_dtype": 4,
    "wrong_shape": 5,
    "host_fallback": 6,
    "host_output": 7,
    "abort": 8,
    "hog": 9,
}
# Faults of the process group alone (never handed to the device's kernels).
COLLECTIVE_KINDS = ("drop", "wrong_op", "stale", "offset")
COLLECTIVE_PREFIX = "c10d::"
PHASES = ("any", "forward", "backward")
MODES = ("any", "eager", "compile", "compiler")
COMPILER_KINDS = ("raise", "crash", "abort", "hang")  # what mode=compiler can do to the compiler
HOST_KINDS = ("crash", "abort", "hang")


class FaultSpecError(ValueError):
    """A fault spec that cannot be parsed; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    kind: str
    op: str
    rel: float = 0.0  # perturb: relative error; hog: the workspace in MiB (the spec's ``mb``)
    phase: str = "any"
    dtype: str = ""
    probability: float = 1.0
    host: bool = False
    mode: str = "any"
    rank: int = -1  # collectives: the one rank it applies to (-1: every rank; drop: the last)

    @property
    def collective(self) -> bool:
        """A fault of the process group (``c10d::...``), not of the device's kernels."""
        return self.op.startswith(COLLECTIVE_PREFIX)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS and self.kind not in COLLECTIVE_KINDS:
            close = difflib.get_close_matches(self.kind, [*FAULT_KINDS, *COLLECTIVE_KINDS], n=2)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise FaultSpecError(f"kind={self.kind!r} (type=str): unknown fault kind{hint}")
        if self.phase not in PHASES:
            raise FaultSpecError(f"phase={self.phase!r} (type=str): expected one of {', '.join(PHASES)}")
        if self.mode not in MODES:
            raise FaultSpecError(f"mode={self.mode!r} (type=str): expected one of {', '.join(MODES)}")
        if not 0.0 <= self.probability <= 1.0:
            raise FaultSpecError(f"p={self.probability!r} (type=float): must lie in [0, 1]")
        if not self.op:
            raise FaultSpecError("op='' (type=str): a fault needs an op name or glob, e.g. aten::tanh")
        if self.kind in COLLECTIVE_KINDS and not self.collective:
            raise FaultSpecError(f"{self.kind}@{self.op}: a {self.kind} fault breaks a collective; name one as "
                                 "c10d::allreduce, c10d::all_gather, ...")
        if self.mode == "compiler" and self.kind not in COMPILER_KINDS:
            raise FaultSpecError(f"{self.kind}@{self.op},mode=compiler: a compiler can {', '.join(COMPILER_KINDS)}")
        if self.host and (self.kind not in HOST_KINDS or any(c in self.op for c in "*?[")):
            raise FaultSpecError(f"host=1 with {self.kind}@{self.op}: only {', '.join(HOST_KINDS)} of one exact op "
                                 "(e.g. crash@aten::sort) can break the host's kernel")

    def spec(self) -> str:
        parts = [f"{self.kind}@{self.op}"]
        if self.rel:
            parts.append(f"mb={self.rel!r}" if self.kind == "hog" else f"rel={self.rel!r}")
        if self.phase != "any":
            parts.append(f"phase={self.phase}")
        if self.dtype:
            parts.append(f"dtype={self.dtype}")
        if self.probability != 1.0:
            parts.append(f"p={self.probability!r}")
        if self.host:
            parts.append("host=1")
        if self.mode != "any":
            parts.append(f"mode={self.mode}")
        if self.rank >= 0:
            parts.append(f"rank={self.rank}")
        return ",".join(parts)


_DTYPE_NAMES = {
    "float32": "Float",
    "float": "Float",
    "float64": "Double",
    "double": "Double",
    "float16": "Half",
    "half": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}


def host_kernel(kind: str):
    """A CPU kernel that fails the way ``kind`` says, for ``host=1`` faults."""
    def crash(*args, **kwargs):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV

    def abort(*args, **kwargs):
        import os

        os.abort()

    def hang(*args, **kwargs):
        import time

        while True:
            time.sleep(3600)

    return {"crash": crash, "abort": abort, "hang": hang}[kind]


def c10_dtype_name(dtype: str) -> str:
    """The name c10::toString gives a dtype, which the device compares against."""
    if not dtype:
        return ""
    key = dtype.removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise FaultSpecError(f"dtype={dtype!r} (type=str): unknown dtype")
    return _DTYPE_NAMES[key]


def parse_faults(spec: str | None) -> list[Fault]:
    """Parses a fault spec string (see the module docstring) or a JSON list."""
    if not spec or not spec.strip():
        return []
    spec = spec.strip()
    if spec.startswith("["):
        try:
            items = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise FaultSpecError(f"fault spec is not valid JSON: {exc}") from None
        return [Fault(**item) for item in items]
    faults = []
    for chunk in filter(None, (c.strip() for c in spec.split(";"))):
        head, *options = chunk.split(",")
        kind, sep, op = head.partition("@")
        if not sep:
            raise FaultSpecError(f"fault {chunk!r} must look like KIND@OP[,key=value...]")
        fields: dict = {"kind": kind.strip(), "op": op.strip()}
        for option in options:
            key, sep, value = option.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                raise FaultSpecError(f"fault option {option!r} in {chunk!r} must look like key=value")
            if key in ("phase", "dtype", "mode"):
                fields[key] = value
            elif key == "host":
                if value not in ("0", "1"):
                    raise FaultSpecError(f"host={value!r} (type=str) in {chunk!r}: expected 0 or 1")
                fields["host"] = value == "1"
            elif key == "rank":
                if not value.isdigit():
                    raise FaultSpecError(f"rank={value!r} (type=str) in {chunk!r}: expected a rank number")
                fields["rank"] = int(value)
            elif key in ("rel", "p", "mb"):
                try:
                    fields["probability" if key == "p" else "rel"] = float(value)
                except ValueError:
                    raise FaultSpecError(f"{key}={value!r} (type=str) in {chunk!r}: expected a number") from None
            else:
                raise FaultSpecError(f"unknown fault option {key!r} in {chunk!r} (known: rel, mb, phase, mode, dtype, p, host, rank)")
        faults.append(Fault(**fields))
    return faults


def format_faults(faults: list[Fault]) -> str:
    return ";".join(f.spec() for f in faults)
