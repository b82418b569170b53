"""Precision models and the noise floor: is a difference more than the device's documented precision explains?

A device that evaluates activations from tables, or rounds matmul operands
to bfloat16, by design, differs from the CPU by more than the golden rule
allows on almost any deep model; a real fault then drowns in the flood. So a
target may carry a :class:`PrecisionModel`: which ops it computes at lower
precision, and how much (a relative and an absolute unit roundoff, on the
op's inputs or on its outputs).

The noise floor follows stochastic arithmetic (verificarlo's Monte Carlo
Arithmetic, CADNA): the CPU reference runs K more times with the named ops'
inputs or outputs perturbed at random at the model's unit roundoff
(:class:`PerturbMode`, a dispatch mode). The spread of those runs around
the reference says how far the device may be from it by design. The judge
(diff.judge) then decides:

- the target's deviation within ``SPREAD_MULTIPLE`` times the spread:
  ``pass``, marked "within device precision", with the significant bits the
  target kept against those the model expects;
- a reference so sensitive that the spread leaves no significant bit:
  ``inconclusive``, with its condition estimate; never a pass;
- otherwise ``mismatch``.

Models: the emulated Neuron device's comes from its numerics profile; the
real torch_neuronx backend gets the same model from the profile of the
release (so both share it); CUDA's from its TF32 and reduced-precision
reduction switches. A JSON file (``NEURON_VALIDATE_PRECISION_MODEL`` or
``--precision-model``) replaces either; every report records the model used.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from conformance.settings import PRECISION_MODEL_ENV

RUNS = 4  # perturbed reference runs (the K of the noise floor)
SPREAD_MULTIPLE = 4.0  # the target may deviate this many times the reference's spread
# Each element's spread is at least this share of its tensor's RMS spread: with K runs, some elements'
# perturbations are small by chance, and the device's own rounding is not.
SPREAD_FLOOR = 1.0
# A few elements (at most this share) may exceed the multiple, up to OUTLIER_MULTIPLE x their spread: with
# K runs the spread of a single element is a rough estimate. A fault moves most elements, or moves few far.
OUTLIER_SHARE = 0.01
OUTLIER_MULTIPLE = 4 * SPREAD_MULTIPLE
INCONCLUSIVE_RELATIVE_SPREAD = 0.5  # relative spread beyond which nothing can be judged (under one bit left)

BF16_U = 2.0**-8
FP16_U = 2.0**-11
TF32_U = 2.0**-11
FP32_U = 2.0**-24
FP8_E4M3_U = 2.0**-4
TABLE_U = 2.0**-14  # linear interpolation over 1/64 steps: h^2/8 |f''| <= 2^-15, with a margin of 2

# ATen ops whose operands the matmul engine takes (what --auto-cast matmult casts).
MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::addbmm", "aten::baddbmm", "aten::mv", "aten::addmv",
              "aten::dot", "aten::vdot", "aten::matmul", "aten::linear", "aten::convolution*", "aten::_convolution*",
              "aten::conv*", "aten::_scaled_dot_product*", "aten::addr", "aten::ger", "aten::outer",
              "aten::_addmm_activation", "aten::tensordot", "aten::einsum")


class PrecisionModelError(ValueError):
    """A precision model file or value that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpPrecision:
    """One group of ops the device computes at lower precision."""

    pattern: str  # glob over ATen op names, e.g. "aten::mm" or "aten::*"
    rel: float  # relative unit roundoff
    abs: float = 0.0  # absolute error floor (tables are accurate to an absolute error near 0)
    where: str = "outputs"  # "inputs": the operands are rounded (auto-cast); "outputs": the results
    reason: str = ""
    values: str = "float"  # which tensors it applies to: "float", "int" (integer ops computed in float) or "any"
    # How the error depends on the value: "rounding", pseudo-random per value (roundings, stochastic rounding);
    # "smooth", a slowly varying function of the value that keeps near-equal values in order (a table that
    # interpolates a monotone function between knots does: its error varies with the knots' spacing).
    noise: str = "rounding"

    def __post_init__(self) -> None:
        if self.noise not in ("rounding", "smooth"):
            raise PrecisionModelError(f"noise={self.noise!r} (type=str): expected rounding or smooth")
        if self.where not in ("inputs", "outputs"):
            raise PrecisionModelError(f"where={self.where!r} (type=str): expected inputs or outputs")
        if self.values not in ("float", "int", "any"):
            raise PrecisionModelError(f"values={self.values!r} (type=str): expected float, int or any")
        if not (0 <= self.rel < 1) or self.abs < 0:
            raise PrecisionModelError(f"rel={self.rel!r}, abs={self.abs!r}: expected 0 <= rel < 1 and abs >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionModel:
    """What a target computes at lower precision. Empty: it computes like the CPU, and nothing changes."""

    name: str
    ops: tuple[OpPrecision, ...] = ()
    source: str = ""  # where the model comes from (a profile, a file, CUDA's switches)

    def __bool__(self) -> bool:
        return bool(self.ops)

    def for_op(self, op_name: str, floating: bool = True) -> OpPrecision | None:
        """The entry for an op whose tensors are floating (or integer, ``floating=False``); an in-place
        variant (``aten::silu_``) has its op's entry."""
        functional = op_name[:-1] if op_name.endswith("_") and not op_name.endswith("__") else op_name
        for entry in self.ops:
            if (fnmatch.fnmatchcase(op_name, entry.pattern) or fnmatch.fnmatchcase(functional, entry.pattern)) and (
                    entry.values == "any" or (entry.values == "float") == floating):
                return entry
        return None

    @property
    def summary(self) -> str:
        """``bf16 matmul operands, activation tables``: the reasons, for messages."""
        return ", ".join(dict.fromkeys(e.reason or e.pattern for e in self.ops)) or "exact"

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source,
                "ops": [{"pattern": e.pattern, "rel": e.rel, "abs": e.abs, "where": e.where, "reason": e.reason,
                         "values": e.values, "noise": e.noise} for e in self.ops]}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "") -> "PrecisionModel":
        if not isinstance(data, dict) or not isinstance(data.get("ops", []), list):
            raise PrecisionModelError(f"{source or 'precision model'}: expected an object with a list 'ops'")
        try:
            ops = tuple(OpPrecision(**entry) for entry in data.get("ops", []))
        except TypeError as exc:
            raise PrecisionModelError(f"{source or 'precision model'}: {exc}") from None
        return cls(name=str(data.get("name", Path(source).stem if source else "custom")), ops=ops,
                   source=source or str(data.get("source", "")))


EXACT = PrecisionModel(name="exact", source="the target computes like the CPU")


def load_model(path: str | Path) -> PrecisionModel:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PrecisionModelError(f"precision model file not found: {path}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PrecisionModelError(f"precision model file {path} is not valid JSON: {exc}") from None
    return PrecisionModel.from_dict(data, source=str(path))


def _cast_unit(cast_type: str) -> float:
    return {"bf16": BF16_U, "fp16": FP16_U, "tf32": TF32_U, "fp8_e4m3": FP8_E4M3_U}.get(cast_type, BF16_U)


def model_from_profile(profile) -> PrecisionModel:
    """The precision model of a Neuron numerics profile (emulator.profiles.NumericsProfile)."""
    ops: list[OpPrecision] = []
    u = _cast_unit(profile.auto_cast_type)
    if profile.auto_cast == "all":
        ops.append(OpPrecision(pattern="aten::*", rel=u, where="outputs",
                               reason=f"{profile.auto_cast_type} everywhere (--auto-cast all)"))
    elif profile.auto_cast == "matmult":
        ops += [OpPrecision(pattern=p, rel=u, where="inputs", reason=f"{profile.auto_cast_type} matmul operands")
                for p in MATMUL_OPS]
    if profile.approximate_activations:
        knots = max(1, int(profile.activation_knots_per_unit))
        rel = max(TABLE_U, 1.0 / (4.0 * knots * knots))
        ops += [OpPrecision(pattern=name, rel=rel, abs=rel, where="outputs", reason="activation tables",
                            noise="smooth") for name, _, _ in profile.activation_ranges]
    if profile.integer_matmul_fp32:
        ops += [OpPrecision(pattern=p, rel=FP32_U, where="outputs", reason="integer matmul in fp32", values="int")
                for p in ("aten::mm", "aten::bmm", "aten::addmm", "aten::mv", "aten::dot", "aten::matmul")]
    if profile.collective_dtype and profile.collective_dtype != "float32":
        unit = BF16_U if profile.collective_dtype == "bfloat16" else FP16_U
        ops.append(OpPrecision(pattern="c10d::*", rel=unit, where="outputs",
                               reason=f"collectives reduce in {profile.collective_dtype}"))
    if profile.stochastic_rounding and not any(e.pattern == "aten::*" for e in ops):
        ops.append(OpPrecision(pattern="aten::*", rel=u, where="outputs", reason="stochastic rounding"))
    return PrecisionModel(name=f"neuron profile {profile.name}", ops=tuple(ops), source=f"emulator profile {profile.name}")


def cuda_model() -> PrecisionModel:
    import torch

    ops: list[OpPrecision] = []
    if torch.backends.cuda.matmul.allow_tf32:
        ops += [OpPrecision(pattern=p, rel=TF32_U, where="inputs", reason="TF32 matmul")
                for p in MATMUL_OPS if "conv" not in p]
    if torch.backends.cudnn.allow_tf32:
        ops += [OpPrecision(pattern=p, rel=TF32_U, where="inputs", reason="TF32 convolution")
                for p in MATMUL_OPS if "conv" in p]
    if torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction:
        ops.append(OpPrecision(pattern="aten::*mm", rel=BF16_U, where="outputs",
                               reason="reduced-precision bf16 reductions"))
    return PrecisionModel(name="cuda", ops=tuple(ops), source="torch.backends.cuda / cudnn switches")


def model_for(target) -> PrecisionModel:
    """The precision model of a resolved target (conformance.target.Target); the file in
    NEURON_VALIDATE_PRECISION_MODEL replaces it."""
    path = os.environ.get(PRECISION_MODEL_ENV)
    if path:
        return load_model(path)
    kind = getattr(target, "kind", "")
    if kind in ("neuron-emulated", "neuron"):
        from emulator.profiles import resolve_profile

        return model_from_profile(resolve_profile())
    if kind == "cuda":
        return cuda_model()
    return EXACT


# ---------------------------------------------------------------- perturbed reference runs
@dataclass
class PerturbMode:
    """A dispatch mode that perturbs, at random, the inputs or outputs of the ops a model names.

    Each floating value x becomes x * (1 + rel * r) + abs * s, r and s in
    [-1, 1] drawn by :func:`value_noise`: pseudo-random, but a function of x
    and the run's ``seed``, as a device's rounding and tables are functions of
    their input. (Noise drawn independently per element would break the
    symmetry of equal values, which a batch norm over two identical features
    then amplifies a million-fold, as no real device does.) Integer outputs
    of ops computed in floating point are rounded through float32 when they
    exceed 2^24. In-place and ``out=`` ops take the error in the tensors they
    write (timm's activations are in place). Used as a context manager around a reference run (the
    device's own random stream is modelled apart, by diff.draws).
    """

    model: PrecisionModel
    seed: int
    met: dict = field(default_factory=dict)  # reasons of the entries that perturbed something, in order
    _mode: Any = field(default=None, repr=False)
    _unfused: Any = field(default=None, repr=False)

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves, tree_map

        seed = self.seed
        model = self.model
        met = self.met

        def perturb(entry: OpPrecision, bounds: tuple[float, float] | None = None):
            return lambda t: perturb_tensor(t, entry, seed, bounds=bounds)

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                floating = not tensors or any(t.is_floating_point() or t.is_complex() for t in tensors)
                entry = model.for_op(func._schema.name, floating)
                mutable = func._schema.is_mutable
                if entry is None and (inner := python_decomposition(func)) is not None:
                    with self:  # its own ops, as the device computes them, take the model's error
                        return inner(*args, **kwargs)
                rounding = None if mutable else low_precision_rounding(func._schema.name, tensors,
                                                                       unfused.autocast)
                if rounding is not None and (entry is None or (entry.where == "outputs" and entry.rel < rounding.rel)):
                    entry = rounding
                # A view computes nothing, and a fresh tensor in its place would take the writes made through
                # it: `x[1:3] = 1` and DDP's gradient buckets (written through views) were lost, so a DDP
                # script's perturbed runs trained on an uninitialised bucket and their losses went NaN.
                if (entry is None or func.is_view or func._schema.name in ("aten::copy_", "aten::_to_copy")
                        or (mutable and entry.where == "inputs")):
                    return func(*args, **kwargs)
                met[entry.reason or entry.pattern] = None
                if entry.where == "inputs":
                    args, kwargs = tree_map(perturb(entry), (args, kwargs))
                    out = func(*args, **kwargs)
                    if rounding is None:
                        return out
                    met[rounding.reason] = None
                    return tree_map(perturb(rounding), out)
                out = func(*args, **kwargs)
                bounds = OUTPUT_RANGES.get(func._schema.name.removesuffix("_"))
                if not mutable:
                    return tree_map(perturb(entry, bounds), out)
                for t in tree_leaves(out):  # in place (silu_) or out=: the written tensors take the error
                    if isinstance(t, torch.Tensor):
                        t.copy_(perturb(entry, bounds)(t))
                return out

        self._unfused = unfused = _op_by_op_on_the_cpu()
        self._unfused.__enter__()
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._unfused.__exit__(*exc)


def _op_by_op_on_the_cpu():
    """A function mode under which an LSTM on the CPU runs op by op, as a device runs it.

    The CPU runs a whole LSTM layer as one oneDNN kernel (``aten::mkldnn_rnn_layer``), whose sigmoids and
    tanhs no dispatch mode sees, where a device runs a cell at a time and its tables act inside (the emulated
    device's fused cell calls its own sigmoid and tanh). Perturbed runs that cannot reach inside have no
    spread there: a correct device's LSTM classifier was "beyond device precision" at the layer after it.
    PyTorch's op-by-op path (oneDNN off for that call) is what the perturbed runs take.

    It also keeps whether the CPU's autocast is on for each torch call, which the dispatch mode below it cannot
    see (autocast's keys are excluded there): ``autocast``."""
    import torch
    from torch.overrides import TorchFunctionMode

    class OpByOp(TorchFunctionMode):
        autocast = None  # the CPU autocast's dtype while a torch call made under it runs (low_precision_rounding)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            outer = self.autocast
            self.autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            try:
                if func is not torch.lstm or not torch._C._get_mkldnn_enabled():
                    return func(*args, **kwargs)
                # Not torch.backends.mkldnn.enabled: after torch.backends.disable_global_flags() (OpInfo's test
                # utilities call it) setting it raises, and every perturbed run failed in a worker that had them.
                torch._C._set_mkldnn_enabled(False)
                try:
                    return func(*args, **kwargs)
                finally:
                    torch._C._set_mkldnn_enabled(True)
            finally:
                self.autocast = outer

    return OpByOp()


# Ops whose results two correct devices round differently in half precision: a matmul or convolution
# accumulates in its own order (and keeps more or fewer bits before rounding to the half type), and the ops
# PyTorch's autocast computes in float32 on an accelerator (CUDA's list, which PrivateUse1 shares) but in the
# half type on the CPU (whose list leaves them out): softmax, log_softmax, exp, log, norms, sums, losses.
HALF_PRECISION_DIFFERS = (*MATMUL_OPS, "aten::_softmax", "aten::_log_softmax", "aten::exp", "aten::log",
                          "aten::pow", "aten::rsqrt", "aten::sum", "aten::mean", "aten::logsumexp", "aten::cumsum",
                          "aten::native_layer_norm", "aten::native_group_norm", "aten::linalg_vector_norm",
                          "aten::nll_loss*", "aten::mse_loss", "aten::l1_loss", "aten::smooth_l1_loss",
                          "aten::huber_loss", "aten::binary_cross_entropy_with_logits")


@functools.lru_cache(maxsize=None)
def _half_precision_differs(op_name: str) -> bool:
    """Whether ``op_name`` matches :data:`HALF_PRECISION_DIFFERS` (asked once per op: every dispatch asks)."""
    return any(fnmatch.fnmatchcase(op_name, p) for p in HALF_PRECISION_DIFFERS)


def low_precision_rounding(op_name: str, tensors: list, autocast=None) -> OpPrecision | None:
    """The rounding of an op of :data:`HALF_PRECISION_DIFFERS` given bfloat16 or float16 tensors (the script's
    autocast, or its half-precision model): the device's result may lie anywhere within the half type's
    rounding of the reference's. timm's train.py under ``--amp --amp-dtype bfloat16`` on a correct device lost
    0.1% of its loss at the first step (the CPU's autocast computes log_softmax in bfloat16, the device's in
    float32), 0.14% by the fifth, where perturbed runs rounding in float32 alone spread by 0.02%: NOT READY.

    The other way round too: under the CPU's autocast an op of that list given float32 tensors may run in the
    half type on the device. ``F.cross_entropy`` is on the CPU's float32 list whole, while on an accelerator
    it decomposes below autocast and its ``log_softmax`` runs in bfloat16: a correct device's loss differed by
    bfloat16 rounding (0.29%) against a band of 0.14%, NOT READY. ``autocast``: the CPU autocast's dtype where
    it was on for the torch call that dispatched this op (a dispatch mode sees it off). None for another op, or
    full-precision tensors outside autocast."""
    import torch

    if not _half_precision_differs(op_name):
        return None
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    half = torch.bfloat16 if torch.bfloat16 in dtypes else torch.float16 if torch.float16 in dtypes else None
    if half is None and torch.float32 in dtypes:
        half = autocast
    if half not in (torch.bfloat16, torch.float16):
        return None
    unit, name = (BF16_U, "bfloat16") if half == torch.bfloat16 else (FP16_U, "float16")
    return OpPrecision(pattern=op_name, rel=unit, where="outputs", reason=f"{name} rounding (autocast)")


def python_decomposition(func) -> Callable | None:
    """The Python body of a custom op that runs the same on every device (``torch.library.custom_op`` without
    a device type, e.g. ``torch_nn::_linear_cross_entropy_batch_chunked``), or None.

    Such an op is one dispatch to a mode, but every device runs its body op by op: the device's tables and
    casts act on the exp and mm inside. The perturbed runs go inside it too, or the noise floor misses the
    device's designed error there. An op with a kernel per device, or an ATen op, is left whole."""
    if func.namespace in ("aten", "prims", "prim"):
        return None
    try:
        from torch._library.custom_ops import _maybe_get_opdef

        opdef = _maybe_get_opdef(func)
    except (ImportError, AttributeError, TypeError):
        return None
    backend_fns = getattr(opdef, "_backend_fns", None) or {}
    return backend_fns.get(None) if set(backend_fns) == {None} else None


# The range of an op's result, which no device's rounding or table leaves: a sigmoid saturated at 1.0 stays
# at most 1.0 in bf16, in a table, rounded stochastically. Perturbed past it, the reference's own run breaks
# where the device's never would (BCELoss after a saturated sigmoid: "all elements of input should be
# between 0 and 1", pytorch/examples' siamese_network), and the band of the loss curves is lost.
OUTPUT_RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(("aten::sigmoid", "aten::hardsigmoid", "aten::_softmax", "aten::softmax"), (0.0, 1.0)),
    **dict.fromkeys(("aten::tanh", "aten::erf", "aten::sin", "aten::cos"), (-1.0, 1.0)),
    "aten::erfc": (0.0, 2.0),
    **dict.fromkeys(("aten::exp", "aten::exp2", "aten::relu", "aten::softplus", "aten::sqrt", "aten::rsqrt",
                     "aten::abs"), (0.0, math.inf)),
    "aten::_log_softmax": (-math.inf, 0.0),
}


def perturb_tensor(t, entry: OpPrecision, seed: int, *, bounds: tuple[float, float] | None = None):
    """``t`` as the device may compute it under ``entry`` (a fresh tensor; anything else is returned as is):
    floating values x * (1 + rel * r) + abs * s, r and s from the entry's noise, kept within ``bounds`` (the
    op's range, :data:`OUTPUT_RANGES`); integers of ops computed in floating point rounded through float32
    beyond 2^24."""
    import torch

    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.numel() == 0:
        return t
    if t.is_floating_point():
        x = t.detach().double()
        noise = smooth_noise if entry.noise == "smooth" else value_noise
        out = x * (1 + entry.rel * noise(x, seed))
        if entry.abs:
            out = out + entry.abs * noise(x, seed + 1, absolute=True)
        if bounds is not None:
            out = out.clamp(*bounds)
        return out.to(t.dtype)
    if not t.is_complex() and t.dtype != torch.bool and entry.where == "outputs":
        big = t.to(torch.int64).abs() > 2**24
        if bool(big.any()):  # as the device casts its float32 result back (out of range: saturated)
            return torch.where(big, t.to(torch.float32).round().to(t.dtype), t)
    return t


def perturbed_values(value: Any, entry: OpPrecision, *, seed: int = 0, runs: int = RUNS) -> "Runs":
    """``runs`` copies of a computed value as the device may return it under ``entry``: the noise floor of a
    result the dispatch mode cannot see being computed (a collective's, computed by the process group)."""
    from torch.utils._pytree import tree_map

    out = Runs(tree_map(lambda t: perturb_tensor(t, entry, seed * 1_000_003 + k), value) for k in range(runs))
    out.reasons = (entry.reason or entry.pattern,)
    return out


class Runs(list):
    """Perturbed runs, with the model's reasons that applied to them (the ops they met)."""

    reasons: tuple[str, ...] = ()


_MIX1 = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64 (multiplication wraps)
_MIX2 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX3 = -7723592293110705685  # 0x94D049BB133111EB


def value_noise(x, seed: int, absolute: bool = False):
    """Uniform-looking values in [-1, 1), one per element of ``x`` (float64), a function of its value and
    ``seed`` only (splitmix64 of the value's bits)."""
    import torch

    h = x.contiguous().view(torch.int64) ^ ((seed * 0x2545F491) & 0x7FFFFFFFFFFF)
    h = h * _MIX1
    h = (h ^ ((h >> 30) & 0x3FFFFFFFF)) * _MIX2
    h = (h ^ ((h >> 27) & 0x1FFFFFFFFF)) * _MIX3
    h = h ^ ((h >> 31) & 0x1FFFFFFFF)
    return (h & ((1 << 53) - 1)).double() / 2.0**52 - 1.0


SMOOTH_PERIOD = 1.0 / 64  # of the absolute part of smooth noise: a table's knot spacing


def smooth_noise(x, seed: int, absolute: bool = False):
    """Values in [-1, 1], one per element of ``x`` (float64), varying slowly with its value: one period per
    octave of |x| for a relative error (``x * (1 + rel * noise)`` then changes by at most ~9 rel per unit
    of relative change in x), one per ``SMOOTH_PERIOD`` for an absolute one. The seed sets the phase."""
    import torch

    phase = (seed * 0.6180339887498949) % 1.0
    if absolute:
        return torch.sin(2 * math.pi * (x / SMOOTH_PERIOD + phase))
    return torch.sin(2 * math.pi * (torch.log2(x.abs().clamp_min(1e-300)) + phase))


def perturbed_runs(run: Callable[[], Any], model: PrecisionModel, *, runs: int = RUNS, seed: int = 0) -> Runs:
    """``run()`` (a reference run) ``runs`` times under :class:`PerturbMode`; failed runs are left out."""
    out, met = Runs(), {}
    for k in range(runs):
        try:
            with PerturbMode(model=model, seed=seed * 1_000_003 + k) as mode:
                out.append(run())
            met.update(dict.fromkeys(mode.met))
        except Exception:  # noqa: BLE001 - a perturbation that breaks the run tells nothing about the target
            continue
    out.reasons = tuple(met)
    return out


# ---------------------------------------------------------------- the noise-floor verdict
@dataclass(slots=True, kw_only=True)
class NoiseFloor:
    """How the target's deviation from the reference compares with the reference's own spread."""

    within: bool  # every value that could be judged within SPREAD_MULTIPLE x the spread
    inconclusive: bool  # some tensor's spread leaves no significant bit: it cannot be judged
    bits_kept: float  # significant bits of the target against the reference (worst tensor)
    bits_expected: float  # significant bits the perturbed runs keep (worst tensor)
    condition: float  # relative spread / unit roundoff: how much the computation amplifies rounding
    worst: str = ""  # the path of the tensor that decided
    nonfinite: bool = False  # inf or NaN on one side where the other has a number: not a matter of precision
    runs: int = 0
    reasons: str = ""  # the model's reasons that the perturbed runs met (the ops they perturbed)

    def describe(self, model: PrecisionModel) -> str:
        reasons = self.reasons or model.summary
        if self.inconclusive and self.within:
            return (f"inconclusive: the reference itself keeps {max(self.bits_expected, 0):.0f} significant bits "
                    f"under the device's precision ({reasons}); condition estimate {self.condition:.3g} at "
                    f"{self.worst}")
        if self.nonfinite and not self.within:
            return (f"not a matter of precision: inf or NaN at {self.worst} where the other side has a number "
                    f"(an input outside the range the device's {reasons} cover?)")
        word = "within" if self.within else "beyond"
        return (f"{word} device precision ({reasons}): {max(self.bits_kept, 0):.0f} of "
                f"{self.bits_expected:.0f} expected bits agree at {self.worst} ({self.runs} perturbed reference runs)")

    def to_dict(self) -> dict:
        return {"within": self.within, "inconclusive": self.inconclusive, "bits_kept": round(self.bits_kept, 2),
                "bits_expected": round(self.bits_expected, 2), "condition": self.condition, "worst": self.worst,
                "runs": self.runs}


def _bits(relative: float) -> float:
    return 53.0 if relative <= 0 else -math.log2(relative)


def _outlier_allowance(deviations: list) -> tuple[int, float]:
    """How many elements a perturbed run moves beyond the element rule of :func:`noise_floor` when judged
    against the other runs (the most of any run), and how far any run's deviation reaches: a tensor whose
    noise moves a few elements far (a ReLU's mask or a max's choice flipped near the kink) moves other
    elements in every run."""
    import torch

    if len(deviations) < 2:
        return 0, 0.0
    most = 0
    for j, dev in enumerate(deviations):
        others = torch.stack([d for k, d in enumerate(deviations) if k != j]).amax(0)
        allowed = torch.clamp(others, min=SPREAD_FLOOR * float(others.pow(2).mean().sqrt()))
        most = max(most, int((dev > SPREAD_MULTIPLE * allowed + 1e-300).sum()))
    return most, max(float(d.max()) for d in deviations)


def noise_floor(actual: Any, expected: Any, runs: list, model: PrecisionModel, *, path: str = "output",
                only: set[str] | None = None) -> NoiseFloor | None:
    """The noise-floor verdict, or None when it cannot be formed (no runs, or outputs of another structure).

    ``only``: the paths of the tensors to judge (those the plain comparison failed); a tensor within the
    dtype's tolerance is not judged again, however its reference spreads (a gradient that is rounding noise
    by nature, or a well-matched tensor of an ill-conditioned model)."""
    import torch
    from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path

    if not runs:
        return None
    a_leaves, a_spec = tree_flatten(actual)
    keyed, e_spec = tree_flatten_with_path(expected)
    e_leaves = [leaf for _, leaf in keyed]
    names = [path + keystr(key) for key, _ in keyed]
    run_leaves = []
    for r in runs:
        leaves, spec = tree_flatten(r)
        if spec != e_spec or len(leaves) != len(e_leaves):
            return None
        run_leaves.append(leaves)
    if a_spec != e_spec:
        return None
    if only is not None and not only <= set(names):
        return None  # a failing tensor this cannot find is not judged by it (never a silent pass)
    unit = min((e.rel for e in model.ops if e.rel > 0), default=FP32_U)
    result = NoiseFloor(within=True, inconclusive=False, bits_kept=53.0, bits_expected=53.0, condition=1.0,
                        runs=len(runs), reasons=", ".join(getattr(runs, "reasons", ())))
    worst_margin = None
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor) or e.layout != torch.strided:
            continue
        if e.dtype == torch.bool or a.shape != e.shape or e.numel() == 0 or (only is not None and names[i] not in only):
            continue
        ev = e.detach().cpu().resolve_conj().to(torch.complex128 if e.is_complex() else torch.float64)
        av = a.detach().cpu().resolve_conj().to(ev.dtype)
        finite = torch.isfinite(ev) & torch.isfinite(av)
        if not bool((torch.isfinite(ev) == torch.isfinite(av)).all()):
            result.within = False  # infinities or NaN where the other has a number: not a matter of precision
            result.nonfinite = True
            result.worst = names[i]
            continue
        spreads = []
        for leaves in run_leaves:
            r = leaves[i]
            if not isinstance(r, torch.Tensor) or r.shape != e.shape:
                return None
            rv = r.detach().cpu().resolve_conj().to(ev.dtype)
            spreads.append(torch.where(finite & torch.isfinite(rv), (rv - ev).abs(), torch.zeros((), dtype=torch.float64)))
        spread = torch.stack(spreads).amax(0) if spreads else torch.zeros(e.shape, dtype=torch.float64)
        dev = torch.where(finite, (av - ev).abs(), torch.zeros((), dtype=torch.float64))
        scale = float(ev[finite].abs().pow(2).mean().sqrt()) if bool(finite.any()) else 0.0
        spread_rms = float(spread.pow(2).mean().sqrt())
        dev_rms = float(dev.pow(2).mean().sqrt())
        allowed = torch.clamp(spread, min=SPREAD_FLOOR * spread_rms)
        over = dev > SPREAD_MULTIPLE * allowed + 1e-300
        far = dev > OUTLIER_MULTIPLE * allowed + 1e-300
        rel_spread = spread_rms / scale if scale > 0 else 0.0
        rel_dev = dev_rms / scale if scale > 0 else 0.0
        where = names[i]
        if rel_spread >= INCONCLUSIVE_RELATIVE_SPREAD:
            if not result.inconclusive or rel_spread / unit > result.condition:
                result.condition = rel_spread / unit
                if result.within:
                    result.bits_expected, result.worst = _bits(rel_spread), where
            result.inconclusive = True
            continue
        failing = bool(far.any()) or float(over.double().mean()) > OUTLIER_SHARE
        if failing:
            flips, reach = _outlier_allowance(spreads)
            if flips and int(over.sum()) <= 2 * flips and float(dev.max()) <= SPREAD_MULTIPLE * reach:
                # The runs themselves move a few elements far from one another (Faster R-CNN's fc7 weight
                # gradient behind a ReLU, on a correct device, was "beyond device precision" with a smaller
                # deviation than the runs'): as many of the target's may, no farther than theirs reach.
                failing = False
        margin = _bits(rel_dev) - (1000.0 if failing else 0.0)  # the least accurate tensor, a failing one first
        if failing:
            result.within = False
        if result.nonfinite:
            continue  # the non-finite tensor decides the message
        if (worst_margin is None or margin < worst_margin) and (not result.inconclusive or failing):
            worst_margin = margin
            result.bits_kept, result.bits_expected = _bits(rel_dev), _bits(rel_spread)
            result.worst = where
    return result
