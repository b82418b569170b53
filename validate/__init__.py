"""``neuron-validate SCRIPT``: migration checks of a user's own script.

Three questions, answered from the script the team already has:

1. Does it run on the target? (``runs``; host fallbacks, CPU tensors in
   forward, parameters left on the CPU, recompilations, 64-bit narrowing)
2. Does it compute the same thing, and if not, where does it first go wrong?
   (``numerics``: outputs and gradients against the CPU with the float64
   golden rule; the first diverging layer and op, with the source line)
3. Does it learn the same way? (``loss-curves``, ``speed``)

Modules: ``script`` reads the script's source (convention, syntax errors);
``run`` checks one script from options to verdict: its sides run as cases
of kind ``script-side`` on the runner's supervisor (``execute`` holds the
executors; ``functions`` is the functions convention's side, ``training``
an unchanged training script's), which make observations with ``probes``
and ``diff.localize``; ``checks`` turns observations into findings,
``explain`` weighs numerics differences the target makes by design,
``verdict`` adds them up; ``report`` writes the terminal summary,
report.json and report.html; ``report_diff`` diffs two reports. A whole check is
a case of kind ``script`` too (``neuron-conformance scripts DIR``).
``zoo_curves`` asks the loss-curve question of a zoo model instead
(``neuron-conformance curves``).
"""

from .verdict import NOT_READY, READY, READY_WITH_WARNINGS, Finding, verdict_of

__all__ = ["Finding", "NOT_READY", "READY", "READY_WITH_WARNINGS", "verdict_of"]
