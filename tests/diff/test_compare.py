"""diff.compare on real tensors: the verdict rules, the paths, and the dtypes without kernels of their own."""

from __future__ import annotations

import pytest
import torch

from diff.compare import compare

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz]


def test_nested_outputs_carry_their_path_to_the_mismatch():
    expected = (torch.zeros(3), {"values": torch.arange(4.0)})
    actual = (torch.zeros(3), {"values": torch.arange(4.0) + torch.tensor([0.0, 0.0, 1.0, 0.0])})
    result = compare(actual, expected)
    assert not result
    assert [m.path for m in result.mismatches] == ["output[1]['values']"]
    assert "Mismatched elements: 1 / 4" in result.mismatches[0].message
    assert "at index (2,)" in result.mismatches[0].message


def test_metadata_is_checked_before_values():
    assert compare(torch.zeros(2, dtype=torch.float64), torch.zeros(2)).mismatches[0].kind == "dtype"
    assert compare(torch.zeros(3), torch.zeros(2)).mismatches[0].kind == "shape"
    assert compare(torch.zeros(2), torch.zeros(2), device="meta").mismatches[0].kind == "device"


def test_nan_positions_must_match_and_integers_compare_exactly():
    nan = float("nan")
    assert compare(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]))
    assert compare(torch.tensor([1.0, 1.0]), torch.tensor([nan, 1.0])).mismatches[0].kind == "nonfinite"
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3])).mismatches[0].kind == "exact"


def test_a_target_closer_to_float64_than_the_cpu_is_not_failed():
    golden = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    expected = torch.tensor([1.0, 2.01, 3.0])  # the CPU is off
    actual = golden.float()  # the target is right
    assert not compare(actual, expected)
    result = compare(actual, expected, golden=golden)
    assert result and result.passed_by == {"golden": 1}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_outputs_are_compared_although_float8_has_no_isnan_kernel(dtype):
    values = torch.tensor([0.0, 0.5, -1.0, 2.0, 448.0 if "e4m3" in str(dtype) else 1024.0])
    expected = values.to(dtype)
    assert compare(expected.clone(), expected)  # equal bits
    # One element a whole format step away: float8's tolerance is loose but not that loose.
    actual = values.clone()
    actual[3] = 3.0
    result = compare(actual.to(dtype), expected)
    assert not result and result.mismatches[0].kind == "values"
    assert "at index (3,)" in result.mismatches[0].message
    assert result.worst["max_ulp"] >= 1  # in units of the float8 format, not float32's
    assert result.worst["max_ulp"] < 2**10
    nan_expected = torch.tensor([float("nan"), 1.0]).to(dtype)
    assert compare(torch.tensor([1.0, 1.0]).to(dtype), nan_expected).mismatches[0].kind == "nonfinite"
