"""Numerics differences that a Neuron target makes by design, and how large each may be.

A difference in the outputs is a finding either way; what changes is its
weight. When the first diverging op is one the target is documented to
compute differently (an activation evaluated from the Scalar Engine's tables;
a matmul whose operands auto-cast rounds to bf16) *and* that op's own error,
with the reference's inputs, stays within what the feature explains, the
model is "ready with warnings". Anything else (a wrong op of ordinary
precision, an activation 1% off) is "not ready". The bounds are relative to
the op output's largest magnitude; they were set from the emulated device
(table activations: 2e-6 to 3e-5; bf16 matmul operands at K=64: 2.7e-3) with
head room, and sit well below a 1% error.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

ACTIVATION_BOUND = 1e-4
AUTOCAST_BOUND = 2e-2

# The Scalar Engine's table-driven activations (shared/NEURON_NOTES.md); the emulator's profile lists its own.
DEFAULT_ACTIVATIONS = ("aten::sigmoid", "aten::tanh", "aten::erf", "aten::gelu", "aten::silu", "aten::mish",
                       "aten::softplus", "aten::exp")
MATMUL_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addbmm",
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::_scaled_dot_product_attention_math",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::einsum", "aten::dot", "aten::mv", "aten::addmv", "aten::tensordot",
})


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    feature: str  # "activation tables" | "auto-cast"
    text: str
    bound: float


def _numerics(manifest: dict | None) -> tuple[tuple[str, ...], str]:
    """(table-driven activations, auto-cast mode) of the target described by ``manifest``."""
    manifest = manifest or {}
    profile = manifest.get("emulator_profile")
    if isinstance(profile, dict):
        acts = tuple(r[0] for r in profile.get("activation_ranges", ())) if profile.get("approximate_activations") else ()
        return acts, profile.get("auto_cast", "none")
    if manifest.get("kind") == "neuron":
        flags = shlex.split(manifest.get("env", {}).get("NEURON_CC_FLAGS", ""))
        mode = "none"
        for i, flag in enumerate(flags):
            if flag.startswith("--auto-cast="):
                mode = flag.split("=", 1)[1]
            elif flag == "--auto-cast" and i + 1 < len(flags):
                mode = flags[i + 1]
        return DEFAULT_ACTIVATIONS, mode
    return (), "none"


def _base(op: str) -> str:
    return op.removesuffix("_backward")


def explain(op: str, scale_error: float | None, manifest: dict | None) -> Explanation | None:
    """Why the target computes ``op`` differently, when a documented feature accounts for ``scale_error``."""
    if scale_error is None:
        return None
    activations, auto_cast = _numerics(manifest)
    if _base(op) in activations or op in activations:
        if scale_error <= ACTIVATION_BOUND:
            return Explanation(
                feature="activation tables", bound=ACTIVATION_BOUND,
                text=(f"{op} is evaluated from the Scalar Engine's piecewise tables on Trainium; its error here "
                      f"({scale_error:.2g} of its largest output) is within what the tables explain ({ACTIVATION_BOUND:g})"),
            )
        return None
    if (auto_cast == "all" or (auto_cast == "matmult" and op in MATMUL_OPS)) and scale_error <= AUTOCAST_BOUND:
        return Explanation(
            feature="auto-cast", bound=AUTOCAST_BOUND,
            text=(f"--auto-cast {auto_cast} rounds the operands of {op} to bf16; its error here "
                  f"({scale_error:.2g} of its largest output) is of bf16 size (within {AUTOCAST_BOUND:g})"),
        )
    return None
