"""Comparison: tolerance policy, metrics, nested-output walking with a float64
golden, divergence localisation and loss curves."""

from .compare import Comparison, Mismatch, compare
from .tolerances import Tolerance, TolerancePolicy, default_tolerance

__all__ = ["Comparison", "Mismatch", "Tolerance", "TolerancePolicy", "compare", "default_tolerance"]
