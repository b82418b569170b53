"""Numerics profiles of the emulated Neuron device.

A profile says what the emulated device computes differently from the CPU,
following Trainium's documented behaviour (see shared/NEURON_NOTES.md):
neuronx-cc's ``--auto-cast`` / ``--auto-cast-type``, FP32 accumulation of
matmuls, integer matmul computed in FP32, 64-bit values narrowed in compiled
graphs, stochastic rounding (``NEURON_RT_STOCHASTIC_ROUNDING_EN`` and its
seed) and the Scalar Engine's piecewise activation tables. It also names the
ops the emulated device treats as not implemented (host fallback) or
unsupported.

Profiles are plain values. They are selected by a spec string::

    NAME                       a built-in profile, e.g. "neuron-2.27"
    NAME:key=value,key=value   a built-in profile with fields changed
    path/to/profile.json       a profile file (a JSON object of fields,
                               optionally with "base": NAME)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path

PROFILE_ENV = "NEURON_VALIDATE_EMULATOR_PROFILE"
DEFAULT_PROFILE = "neuron-2.27"

AUTO_CAST_MODES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")

# Activation functions the Scalar Engine evaluates from tables, with the input
# range inside which the table is valid; outside it the input is clamped.
SCALAR_ENGINE_ACTIVATIONS: tuple[tuple[str, float, float], ...] = (
    ("aten::sigmoid", -16.0, 16.0),
    ("aten::tanh", -16.0, 16.0),
    ("aten::erf", -8.0, 8.0),
    ("aten::gelu", -16.0, 16.0),
    ("aten::silu", -16.0, 16.0),
    ("aten::mish", -16.0, 16.0),
    ("aten::softplus", -16.0, 16.0),
    ("aten::exp", -64.0, 64.0),
)

# Ops the emulated device treats as having no device kernel: they run on the
# host through the tracked CPU fallback. This models a coverage gap of the kind
# torch-neuronx reports; it is the emulator's assumption, not a statement about
# any release of torch-neuronx.
DEFAULT_COVERAGE_GAPS: tuple[str, ...] = (
    "aten::_fft_*",
    "aten::linalg_eig*",
    "aten::_linalg_eig*",
    "aten::_linalg_svd*",
    "aten::linalg_qr*",
    "aten::linalg_lstsq*",
    "aten::histc*",
    "aten::bincount*",
    "aten::_unique2*",
    "aten::unique_consecutive*",
    "aten::unique_dim*",
    "aten::median*",
    "aten::nanmedian*",
    "aten::kthvalue*",
    "aten::mode*",
)


class ProfileError(ValueError):
    """A profile spec that cannot be resolved; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NumericsProfile:
    """What the emulated device computes differently from the CPU."""

    name: str
    description: str = ""
    auto_cast: str = "none"
    auto_cast_type: str = "bf16"
    integer_matmul_fp32: bool = False
    stochastic_rounding: bool = False
    stochastic_rounding_seed: int = 0
    approximate_activations: bool = False
    activation_knots_per_unit: int = 64
    activation_ranges: tuple[tuple[str, float, float], ...] = SCALAR_ENGINE_ACTIVATIONS
    compile_downcast_64bit: bool = False
    independent_rng: bool = False
    # torch_neuronx without TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1: a kernel that fails at
    # execution re-runs on the host without a word (only the fallback tracking knows). Off: it raises, as
    # the strict mode the harness sets for the real backend.
    rerun_failed_kernels_on_host: bool = False
    fallback_ops: tuple[str, ...] = ()
    unsupported_ops: tuple[str, ...] = ()
    # The dtype collectives reduce in ("" : the tensors' own): what a reduction adds and returns is rounded
    # to it (bf16 all-reduce and reduce-scatter under --auto-cast all).
    collective_dtype: str = ""
    # The compiler's latency (torch.compile(backend="neuron")): seconds per graph it compiles, plus seconds
    # per node of the graph, as neuronx-cc takes seconds to minutes a graph. 0: the emulator's own trivial
    # compiler. A graph compiled before in the same build is not compiled again (compile_backend.py).
    compile_seconds_per_graph: float = 0.0
    compile_seconds_per_node: float = 0.0

    def __post_init__(self) -> None:
        if self.auto_cast not in AUTO_CAST_MODES:
            raise ProfileError(
                f"auto_cast={self.auto_cast!r} (type=str): expected one of {', '.join(AUTO_CAST_MODES)}"
            )
        if self.auto_cast_type not in AUTO_CAST_TYPES:
            raise ProfileError(
                f"auto_cast_type={self.auto_cast_type!r} (type=str): expected one of {', '.join(AUTO_CAST_TYPES)}"
            )
        if self.collective_dtype not in ("", "bfloat16", "float16", "float32"):
            raise ProfileError(f"collective_dtype={self.collective_dtype!r} (type=str): expected '', bfloat16, "
                               "float16 or float32")
        if self.compile_seconds_per_graph < 0 or self.compile_seconds_per_node < 0:
            raise ProfileError("compile_seconds_per_graph and compile_seconds_per_node must be >= 0")
        if self.activation_knots_per_unit < 1:
            raise ProfileError(f"activation_knots_per_unit={self.activation_knots_per_unit!r} (type=int): must be >= 1")

    @property
    def is_exact(self) -> bool:
        """True when the device computes bit-identically to the CPU."""
        return (
            self.auto_cast == "none"
            and not self.integer_matmul_fp32
            and not self.stochastic_rounding
            and not self.approximate_activations
            and not self.compile_downcast_64bit
            and not self.fallback_ops
            and not self.unsupported_ops
            and not self.collective_dtype
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["activation_ranges"] = [list(r) for r in self.activation_ranges]
        d["fallback_ops"] = list(self.fallback_ops)
        d["unsupported_ops"] = list(self.unsupported_ops)
        return d

    def replace(self, **changes) -> "NumericsProfile":
        return dataclasses.replace(self, **changes)


def _exact() -> NumericsProfile:
    return NumericsProfile(
        name="exact",
        description="Bit-identical to CPU eager: the control for false-positive tests.",
    )


def _neuron_2_27() -> NumericsProfile:
    return NumericsProfile(
        name="neuron-2.27",
        description=(
            "Neuron 2.27+ compiler and runtime defaults: --auto-cast none, FP32 accumulation, integer "
            "matmul and scatter-add in FP32, 64-bit values narrowed in compiled graphs, round-to-nearest "
            "(stochastic rounding off), Scalar Engine activation tables, a separate random stream, and "
            "a set of ops without device kernels that run through the CPU fallback."
        ),
        integer_matmul_fp32=True,
        approximate_activations=True,
        compile_downcast_64bit=True,
        independent_rng=True,
        fallback_ops=DEFAULT_COVERAGE_GAPS,
    )


def _neuron_2_26() -> NumericsProfile:
    return _neuron_2_27().replace(
        name="neuron-2.26",
        description="Neuron before 2.27: like neuron-2.27, but --auto-cast matmult (FP32 matmuls in BF16).",
        auto_cast="matmult",
    )


def _matmult_bf16() -> NumericsProfile:
    return _exact().replace(
        name="matmult-bf16",
        description="Exact except that matmul-engine operands are rounded to BF16 (accumulation stays FP32).",
        auto_cast="matmult",
    )


def _all_bf16() -> NumericsProfile:
    return _exact().replace(
        name="all-bf16",
        description="--auto-cast all: every FP32 operation's inputs and outputs rounded to BF16, collectives "
                    "reduce in BF16.",
        auto_cast="all",
        collective_dtype="bfloat16",
    )


def _all_bf16_sr() -> NumericsProfile:
    return _all_bf16().replace(
        name="all-bf16-sr",
        description="--auto-cast all with NEURON_RT_STOCHASTIC_ROUNDING_EN=1 (seed 0).",
        stochastic_rounding=True,
    )


BUILTIN_PROFILES = {
    p.name: p for p in (_exact(), _neuron_2_27(), _neuron_2_26(), _matmult_bf16(), _all_bf16(), _all_bf16_sr())
}
ALIASES = {"default": DEFAULT_PROFILE}


def available_profiles() -> list[str]:
    return sorted(BUILTIN_PROFILES)


def _builtin(name: str) -> NumericsProfile:
    name = ALIASES.get(name, name)
    if name in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name]
    close = difflib.get_close_matches(name, list(BUILTIN_PROFILES), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ProfileError(f"unknown emulator profile {name!r}{hint} (available: {', '.join(available_profiles())})")


_FIELDS = {f.name: f for f in dataclasses.fields(NumericsProfile)}


def _coerce(key: str, value, *, source: str):
    if key not in _FIELDS or key == "name":
        close = difflib.get_close_matches(key, [k for k in _FIELDS if k != "name"], n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ProfileError(f"unknown profile field {key!r} in {source}{hint}")
    current = getattr(BUILTIN_PROFILES["exact"], key)
    if isinstance(value, str):
        if isinstance(current, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ProfileError(f"{key}={value!r} (type=str) in {source}: expected a boolean")
        if isinstance(current, int):
            try:
                return int(value)
            except ValueError:
                raise ProfileError(f"{key}={value!r} (type=str) in {source}: expected an integer") from None
        if isinstance(current, float):
            try:
                return float(value)
            except ValueError:
                raise ProfileError(f"{key}={value!r} (type=str) in {source}: expected a number") from None
        if isinstance(current, tuple):
            return tuple(v for v in value.split("|") if v)
        return value
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def resolve_profile(spec: str | NumericsProfile | None = None) -> NumericsProfile:
    """Turns a profile spec (see the module docstring) into a profile.

    ``None`` means the environment variable NEURON_VALIDATE_EMULATOR_PROFILE,
    then the default profile.
    """
    if isinstance(spec, NumericsProfile):
        return spec
    if spec is None or spec == "":
        spec = os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if spec.endswith(".json") or os.sep in spec:
        path = Path(spec)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ProfileError(f"emulator profile file not found: {spec}") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ProfileError(f"emulator profile file {spec} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ProfileError(f"emulator profile file {spec} must hold a JSON object")
        base = _builtin(str(data.pop("base", "exact")))
        name = str(data.pop("name", path.stem))
        changes = {k: _coerce(k, v, source=spec) for k, v in data.items()}
        return base.replace(name=name, **changes)
    name, _, overrides = spec.partition(":")
    profile = _builtin(name.strip())
    if not overrides:
        return profile
    changes = {}
    for item in overrides.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ProfileError(f"profile override {item!r} in {spec!r} must look like key=value")
        changes[key.strip()] = _coerce(key.strip(), value.strip(), source=repr(spec))
    return profile.replace(name=f"{profile.name}:{overrides}", **changes)
