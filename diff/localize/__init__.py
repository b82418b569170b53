"""Divergence localisation: the first module, then the first ATen op, where a target departs.

The package's parts: ``core`` (the entry point and the layer comparison), ``recorder`` (module hooks),
``tracer`` (the ATen dispatch trace), ``drill`` (ops of one module), ``source`` (user source lines),
``results`` (what it finds).

A whole-model comparison says *that* a target computes something else; a
migrating team needs to know *where*. Like Polygraphy marking every tensor as
an output, :func:`localize` runs the model three times, on the reference
(CPU float32), on the target, and as a float64 golden copy on the CPU, and
records every module's output in the forward pass and the gradient flowing
into that output in the backward pass. Module calls are compared in the order
they complete (children before their parent, so the innermost culprit comes
first) by the one judge (:mod:`diff.judge`), which gives
the first diverging module and how the error grows with depth.

It then drills into that module: the module alone is run on every side with
the *reference's* inputs to it, under a TorchDispatchMode that records each
ATen op, its outputs and the user's source line. With identical inputs, the
first op whose output fails the golden rule is the op that went wrong, not
one that inherited an upstream error. Op sequences are paired with difflib,
so a backend that picks another kernel sequence (an SDPA variant, say) is
still compared op by op where the sequences agree.

The same dispatch trace of the target's forward also tells which ops mixed a
CPU tensor into device ops, created tensors on the CPU or copied to the host;
the migration checks read those from :attr:`Localization.trace`.
"""

from .core import localize
from .results import (
    PHASES,
    ROOT,
    LayerError,
    Localization,
    OpDivergence,
    OpError,
    ReferenceFailure,
    TargetFailure,
    TraceEvent,
)
from .source import SourceLine, exception_frames, find_source
from .tracer import OpTracer

__all__ = [
    "LayerError", "Localization", "OpDivergence", "OpError", "OpTracer", "PHASES", "ROOT", "ReferenceFailure",
    "SourceLine", "TargetFailure", "TraceEvent", "exception_frames", "find_source", "localize",
]
