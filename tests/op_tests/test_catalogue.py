"""The op catalogue (op_tests/catalogue.py): the kept file selects the same cases as OpInfo's database itself,
and a selection made from it does not import the database."""

from __future__ import annotations

import json
import os

from op_tests.catalogue import CACHE_ENV, KEEP, _keep, _read, catalogue_path
from op_tests.sources import OpSelection, all_cases, catalogue, entry_of, get_op, op_db, op_key
from op_tests.strategies import STRATEGIES
from tests.conftest import run_python


def test_the_kept_file_holds_what_op_db_says_of_each_op():
    catalogue()  # read, or built and kept
    on_disk = _read(catalogue_path())
    assert on_disk is not None
    kept = {e.key: e for e in on_disk}
    assert list(kept) == [op_key(op) for op in op_db()]
    # Every 15th op, whatever its kind: dtypes, backward dtypes, element-wise kind and each strategy's dtypes,
    # as read back from the file against the op's OpInfo entry now.
    for op in op_db()[::15]:
        assert kept[op_key(op)] == entry_of(op), op_key(op)


def test_a_selection_reads_the_kept_file_and_leaves_op_db_unimported():
    selection = OpSelection(patterns=("tanh", "add", "softmax", "argmax", "sum"), strategies=STRATEGIES)
    expected = [c.id for c in all_cases(selection)]
    code = (
        "import json, sys\n"
        "from op_tests.sources import OpSelection, all_cases\n"
        "from op_tests.strategies import STRATEGIES\n"
        f"cases = all_cases(OpSelection(patterns={selection.patterns!r}, strategies=STRATEGIES))\n"
        "print(json.dumps([[c.id for c in cases], 'torch.testing._internal.common_methods_invocations' in sys.modules]))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    ids, imported = json.loads(result.stdout.splitlines()[-1])
    assert ids == expected and len(ids) > 30
    assert imported is False


def test_a_catalogue_file_cut_short_or_of_another_shape_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = catalogue_path()
    assert path.parent == tmp_path
    text = json.dumps({"ops": [{"key": "tanh", "name": "tanh"}]})
    for broken in ("", text, text[:20], json.dumps({"ops": 3})):
        path.write_text(broken)
        assert _read(path) is None


def test_keeping_a_catalogue_removes_all_but_the_newest_others(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    older = []
    for n in range(6):
        old = tmp_path / f"op-catalogue-{n:016x}.json"
        old.write_text("{}")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
        older.append(old)
    path = catalogue_path()
    entries = [entry_of(get_op("tanh"))]
    _keep(path, entries)
    assert _read(path) == entries
    assert sorted(tmp_path.glob("op-catalogue-*.json")) == sorted([path, *older[-(KEEP - 1):]])
