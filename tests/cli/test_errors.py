"""Bad input to the suite commands: one clear line, exit code 2, nothing written."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("args, needle", [
    (["--target", "tpu"], "unknown target 'tpu'"),
    (["--target", "nueron"], "did you mean neuron"),
    (["--target", "neuron:jit"], "unknown mode 'jit'"),
    (["--target", "cuda"], "no CUDA device"),
    (["--backend-module", "no_such_backend_module"], "--backend-module no_such_backend_module: import failed"),
    (["--emulator-profile", "exactt"], "unknown emulator profile 'exactt'; did you mean exact?"),
    (["--emulator-profile", "exact:auto_cast=often"], "auto_cast='often'"),
    (["--ops", "no_such_op"], "no op matches 'no_such_op'"),
    (["--ops", "tahn"], "no op matches 'tahn'; did you mean tan, tanh, atan, atanh?"),  # from the catalogue
    (["--dtypes", "float33"], "unknown dtype 'float33'"),
    (["--shard", "3/2"], "--shard '3/2'"),
    (["-j", "0"], "must be at least 1"),
    (["--families", "sizes,tiles"], "unknown input strategy 'tiles'"),
    (["--precision-model", "/no/such/model.json"], "precision model file not found"),
])
def test_one_line_errors(tmp_path, args, needle):
    result = run_cli("neuron-conformance", "ops", "--results", str(tmp_path / "r"), *args, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("neuron-conformance:")]
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r" / "results.sqlite").exists()


def test_corrupt_results_database_is_refused_and_kept(tmp_path):
    db = tmp_path / "results.sqlite"
    db.write_bytes(b"definitely not sqlite")
    result = run_cli("neuron-conformance", "ops", "--ops", "add", "--results", str(tmp_path), timeout=300)
    assert result.returncode == 2
    assert "not a results database" in result.stderr
    assert db.read_bytes() == b"definitely not sqlite"


def test_bad_fault_spec_in_the_environment(tmp_path):
    result = run_cli("neuron-conformance", "ops", "--ops", "add", "--results", str(tmp_path),
                     env={"NEURON_VALIDATE_FAULTS": "explode@aten::add"}, timeout=300)
    assert result.returncode == 2 and "unknown fault kind" in result.stderr
