"""Input strategies find bugs that OpInfo's samples miss, shrink them to small reproducers, and group them by cause.

The bugs live in a backend module (tests/fixtures/accelerator_bugs.py) that
replaces kernels of the emulated device; the suite runs unchanged and is
never told about them. Each must be caught by the comparison, reproduced
standalone from at most 1 MB of inputs, and reported as one group.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.case import Case
from conformance.outcome import Status
from op_tests.causes import case_cause, sample_facts
from op_tests.strategies import STRATEGIES, strategy_samples
from op_tests.strategies.layouts import relayout
from op_tests.strategies.sizes import LONG_SIZES, TILE_SIZES
from op_tests.samples import inputs_fingerprint
from op_tests.shrink import FailureKind, _content_key, shrink
from op_tests.sources import OpSelection, strategy_cases, get_op
from tests.conftest import REPO, built_once, run_cli

BUGS = "softmax_tiles,exp_strides,add_int32,promotion,inplace_new_tensor,view_copies"
# One group per bug: (op, words of the cause the group is named after)
EXPECTED_GROUPS = {
    "softmax": "longer than 128",
    "exp": "non-contiguous inputs",
    "add": "beyond the int32 range",
    "mul": "float16 and int32",
    "t": "views",
}


def _case(op: str, dtype: str, strategy: str, mode: str = "forward") -> Case:
    return Case(kind="op", name=op, dtype=dtype, mode=mode, config={"source": "family", "inputs": strategy})


def _samples(op: str, dtype: str, strategy: str, mode: str = "forward") -> list:
    return strategy_samples(get_op(op), _case(op, dtype, strategy, mode))


# ---------------------------------------------------------------- the strategies themselves
def test_sizes_cross_every_tile_boundary_and_reach_long_reductions():
    samples = _samples("softmax", "float32", "sizes")
    lengths = {int(m.group(1)) for s in samples if (m := re.match(r"length (\d+) on", s.name))}
    assert set(TILE_SIZES) | set(LONG_SIZES) <= lengths
    longest = max(max(t.shape) for s in samples for t in [s.input])
    assert longest >= 65536


def test_sizes_resize_the_contracted_dimension_of_a_matmul():
    samples = _samples("mm", "float32", "sizes")
    shapes = [(tuple(s.input.shape), tuple(s.args[0].shape)) for s in samples]
    assert any(a[1] == 2049 and b[0] == 2049 for a, b in shapes), shapes[:5]
    for a, b in shapes:
        assert a[1] == b[0]


def test_extremes_hold_integer_limits_values_beyond_int32_and_fp_specials():
    ints = torch.cat([s.input.reshape(-1) for s in _samples("add", "int64", "extremes")])
    assert int(ints.max()) == torch.iinfo(torch.int64).max and int(ints.min()) == torch.iinfo(torch.int64).min
    assert bool(((ints > 2**31) & (ints < 2**62 + 100)).any())
    floats = torch.cat([s.input.reshape(-1) for s in _samples("exp", "float32", "extremes")])
    info = torch.finfo(torch.float32)
    assert bool(torch.isnan(floats).any()) and bool(torch.isinf(floats).any())
    assert bool(((floats == 0) & torch.signbit(floats)).any()), "-0.0"
    assert bool(((floats.abs() > 0) & (floats.abs() < info.smallest_normal)).any()), "denormals"
    assert bool((floats == info.max).any())


def test_mixed_dtypes_pair_every_dtype_with_tensors_0d_tensors_and_python_scalars():
    samples = _samples("mul", "int32", "mixed")
    others = [s.args[0] for s in samples]
    dtypes = {t.dtype for t in others if isinstance(t, torch.Tensor)}
    assert {torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.uint8, torch.bool} <= dtypes
    assert any(isinstance(t, torch.Tensor) and t.dim() == 0 for t in others)
    assert {int, float, bool} <= {type(t) for t in others if not isinstance(t, torch.Tensor)}


def test_layouts_keep_the_values_and_change_the_memory():
    samples = _samples("exp", "float32", "layouts")
    control = samples[0].input
    variants = [s for s in samples[1:] if "sample 0" in s.name and "expanded" not in s.name]
    assert len(variants) >= 3
    for s in variants:
        assert torch.equal(s.input, control), s.name
        assert not s.input.is_contiguous() or s.input.storage_offset() > 0, s.name


def test_variants_cover_in_place_out_and_views():
    names = " ".join(s.name for s in _samples("add", "float32", "variants"))
    assert "in-place" in names and "preallocated" in names and "resize" in names
    assert "view aliasing" in " ".join(s.name for s in _samples("t", "float32", "variants"))


def test_every_strategy_is_deterministic_for_its_seed():
    for strategy in STRATEGIES:
        op = {"variants": "add", "mixed": "mul"}.get(strategy, "softmax")
        first, second = _samples(op, "float32", strategy), _samples(op, "float32", strategy)
        assert inputs_fingerprint(first) == inputs_fingerprint(second), strategy
        assert [s.name for s in first] == [s.name for s in second]


def test_strategy_case_ids_are_stable_and_distinct():
    cases = strategy_cases(OpSelection(patterns=("softmax",), strategies=STRATEGIES))
    again = strategy_cases(OpSelection(patterns=("softmax",), strategies=STRATEGIES))
    assert [c.id for c in cases] == [c.id for c in again]
    assert len({c.id for c in cases}) == len(cases)
    assert {c.config["inputs"] for c in cases} == {"sizes", "extremes", "layouts", "variants", "accumulation"}


# ---------------------------------------------------------------- shrinking and causes
def test_relayout_keeps_transposition_gaps_expansion_and_offset():
    base = torch.arange(24.0).reshape(4, 6)
    transposed = base.t().contiguous().t()
    stepped = torch.zeros(4, 12)[:, ::2]
    expanded = base[:1].expand(4, 6)
    offset = torch.zeros(30)[6:].view(4, 6)
    for like in (transposed, stepped, expanded, offset):
        out = relayout(torch.ones(2, 3), like)
        assert out.shape == (2, 3)
        assert (out.stride(0) < out.stride(1)) == (like.stride(0) < like.stride(1))
        assert (0 in out.stride()) == (0 in like.stride())
        assert (out.storage_offset() > 0) == (like.storage_offset() > 0)
    assert relayout(torch.ones(2, 3), stepped).stride(1) == 2


@pytest.mark.parametrize("small_rows", [Status.MISMATCH, Status.ERROR], ids=["other-cause", "other-status"])
def test_shrinking_keeps_the_failure_and_its_cause_and_runs_no_candidate_twice(small_rows):
    """A tile bug (rows over 128 mismatch) hides next to another bug of rows under 8: a mismatch without the
    tile cause, or an error. Shrinking on "still fails" would slide into the other bug at length 1; kept to
    the failure and its cause, it stops at the smallest length that still crosses the tile."""
    from op_tests.strategies.templates import make_sample

    sample = make_sample((torch.randn(7, 2049), (), {}), "length 2049 on dim -1")
    ran = []

    def fails_how(candidate) -> FailureKind:
        ran.append(_content_key(candidate))
        n = candidate.input.shape[-1]
        status = Status.MISMATCH if n > 128 else small_rows if n < 8 else Status.PASS
        return FailureKind(status, "rows_over_tile" if "rows_over_tile" in sample_facts(candidate) else None)

    failure = fails_how(sample)
    assert failure == FailureKind(Status.MISMATCH, "rows_over_tile")
    result = shrink(sample, failure, fails_how)
    assert tuple(result.sample.input.shape) == (1, 129), result.describe()
    assert "2049" in result.describe() and "129" in result.describe()
    assert "failing the same way (mismatch, rows longer than 128)" in result.describe()
    assert fails_how(result.sample) == failure
    ran.pop()
    assert len(ran) == len(set(ran)) == result.checks + 1, "a candidate ran twice"
    assert result.remembered > 0, "a cut of a shrunk sample that equals a rejected candidate is not rerun"


def test_cause_is_what_the_failing_samples_share():
    from op_tests.strategies.templates import make_sample

    contiguous = make_sample((torch.randn(4, 4), (), {}), "contiguous")
    transposed = make_sample((torch.randn(4, 4).t(), (), {}), "transposed")
    wide = make_sample((torch.randn(2, 300), (), {}), "wide")
    facts = [sample_facts(s) for s in (contiguous, transposed, wide)]
    assert case_cause(facts, [False, True, False]).text == "non-contiguous inputs"
    assert case_cause(facts, [False, False, True]).text == "rows longer than 128"
    assert case_cause(facts, [True, True, True]).text == "every input"


# ---------------------------------------------------------------- hidden bugs, end to end
@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory):
    return built_once(tmp_path_factory, "bugs", _buggy_run)


def _buggy_run(tmp):
    jsonl = tmp / "out.jsonl"
    env = {"PYTHONPATH": REPO, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "ACCEL_BUGS": BUGS}
    result = run_cli("neuron-conformance", "ops", "--ops", "softmax,exp,add,mul,t,sum", "--dtypes",
                     "float32,int32,int64", "--backend-module", "tests.fixtures.accelerator_bugs",
                     "--results", str(tmp / "results"), "--build", "bugs", "--jsonl", str(jsonl), "-j", "2",
                     env=env, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return {"tmp": tmp, "rows": rows, "stdout": result.stdout, "env": env}


def _failing(rows, op):
    return [r for r in rows if r["case"]["name"] == op and r["outcome"]["status"] not in ("pass", "skip")]


def test_every_hidden_bug_is_caught_by_the_comparison(buggy_run):
    rows = buggy_run["rows"]
    for op in EXPECTED_GROUPS:
        assert _failing(rows, op), f"{op}: the bug went unseen"
    assert not _failing(rows, "sum"), [r["outcome"]["message"] for r in _failing(rows, "sum")]
    # OpInfo's own samples miss the tile, int64 and promotion bugs: the strategies find them.
    for op in ("softmax", "mul"):
        assert all(r["case"]["config"].get("source") == "family" for r in _failing(rows, op)), op
    assert any(r["case"]["config"].get("inputs") == "extremes" for r in _failing(rows, "add"))


def test_terminal_summary_shows_one_group_per_bug(buggy_run):
    out = buggy_run["stdout"]
    headlines = [line.strip() for line in out.splitlines() if re.match(r"\s+\S+: (wrong results|errors|failures)", line)]
    for op, words in EXPECTED_GROUPS.items():
        mine = [h for h in headlines if h.startswith(f"{op}:") and words in h]
        assert len(mine) == 1, (op, headlines)
    # add has two bugs (int64 in int32, add_ that returns a new tensor): two groups, and nothing else
    assert len([h for h in headlines if h.startswith("add:")]) == 2, headlines
    assert len(headlines) == len(EXPECTED_GROUPS) + 1, headlines


@pytest.mark.parametrize("op", ["softmax", "exp"])
def test_reproducers_are_small_and_reproduce_standalone(buggy_run, op):
    for row in _failing(buggy_run["rows"], op):
        repro = Path(row["outcome"]["repro"])
        assert (repro.parent / "inputs.pt").stat().st_size <= 2**20
    row = min(_failing(buggy_run["rows"], op),
              key=lambda r: (Path(r["outcome"]["repro"]).parent / "inputs.pt").stat().st_size)
    run = subprocess.run([sys.executable, row["outcome"]["repro"]], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={**os.environ, "ACCEL_BUGS": BUGS})
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Mismatched elements" in run.stdout or "NaN positions differ" in run.stdout, run.stdout
    assert "found by:" in run.stdout
    if op == "softmax":  # the tile bug: found by a length across 128, shrunk to just past it
        assert re.search(r"found by: length \d+ on dim", run.stdout), run.stdout
        assert re.search(r"shrunk from .* to .*129", run.stdout), run.stdout


def test_dashboard_leads_with_the_groups_and_stays_small(buggy_run):
    out = buggy_run["tmp"] / "site"
    result = run_cli("neuron-conformance", "dashboard", "--results", str(buggy_run["tmp"] / "results"),
                     "--build", "bugs", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    html = (out / "index.html").read_text()
    assert html.index('id="groups"') < html.index('id="headline"')
    groups = html[html.index('id="groups"'):html.index('id="headline"')]
    assert groups.count('class="group"') == len(EXPECTED_GROUPS) + 1
    links = re.findall(r'<a href="(repro/[^"]+)">repro.py</a>', groups)
    assert len(links) == len(EXPECTED_GROUPS) + 1 and all((out / link).is_file() for link in links)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size <= 5 * 2**20, size


def test_the_gate_shows_one_group_per_root_cause(tmp_path):
    """Two bugs, each failing several cases across directions and strategies: two groups."""
    results = tmp_path / "results"
    common = ("--ops", "exp,softmax", "--dtypes", "float32", "--strategies", "sizes,layouts", "--backend-module",
              "tests.fixtures.accelerator_bugs", "--results", str(results), "-j", "2")
    env = {"PYTHONPATH": REPO, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}
    base = run_cli("neuron-conformance", "ops", *common, "--build", "base", env=env, timeout=900)
    assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-2000:]
    bugs = run_cli("neuron-conformance", "ops", *common, "--build", "bugs",
                   env={**env, "ACCEL_BUGS": "softmax_tiles,exp_strides"}, timeout=900)
    assert bugs.returncode == 1
    # No reruns (tests/ci/test_gate.py has them): the groups and their reproducers come from the build's run.
    gate = run_cli("neuron-conformance", "gate", "--results", str(results), "--build", "bugs", "--baseline", "base",
                   "--rerun", "0", env={**env, "ACCEL_BUGS": "softmax_tiles,exp_strides"}, timeout=900)
    assert gate.returncode == 1, gate.stdout[-3000:]
    groups = [line for line in gate.stdout.splitlines() if line.startswith("GROUP ")]
    assert len(groups) == 2, gate.stdout[-3000:]
    assert any("exp: wrong results for non-contiguous inputs" in g for g in groups), groups
    assert any("softmax: wrong results for" in g and "longer than 128" in g for g in groups), groups
    assert gate.stdout.count("smallest reproducer (of the group's") == 2, gate.stdout[-3000:]
    regressions = int(re.search(r"(\d+) regressions in 2 groups", gate.stdout).group(1))
    assert regressions > 6, "each bug fails many cases"
