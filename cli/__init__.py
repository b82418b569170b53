"""Command-line entry points: ``neuron-validate`` and ``neuron-conformance``."""
