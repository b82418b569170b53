"""The op catalogue (op_tests/catalogue.py): the kept file selects the same cases as OpInfo's database itself,
and a selection made from it does not import the database."""

from __future__ import annotations

import json
import os
import tempfile

from op_tests.catalogue import CACHE_ENV, KEEP, _keep, _read, cache_folders, catalogue_name, load_or_build
from op_tests.sources import OpSelection, all_cases, catalogue, entry_of, get_op, op_db, op_key
from op_tests.strategies import STRATEGIES
from tests.conftest import run_python


def test_the_kept_file_holds_what_op_db_says_of_each_op():
    catalogue()  # read, or built and kept
    on_disk = next(filter(None, (_read(folder / catalogue_name()) for folder in cache_folders())), None)
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
    assert cache_folders() == [tmp_path]
    path = tmp_path / catalogue_name()
    text = json.dumps({"ops": [{"key": "tanh", "name": "tanh"}]})
    for broken in ("", text, text[:20], json.dumps({"ops": 3})):
        path.write_text(broken)
        assert _read(path) is None


def test_keeping_a_catalogue_removes_all_but_the_newest_others(tmp_path):
    older = []
    for n in range(6):
        old = tmp_path / f"op-catalogue-{n:016x}.json"
        old.write_text("{}")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
        older.append(old)
    path = tmp_path / catalogue_name()
    entries = [entry_of(get_op("tanh"))]
    _keep(path, entries)
    assert _read(path) == entries
    assert sorted(tmp_path.glob("op-catalogue-*.json")) == sorted([path, *older[-(KEEP - 1):]])


def test_a_home_that_cannot_be_written_keeps_it_in_the_temporary_folder(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    entries = [entry_of(get_op("tanh")), entry_of(get_op("add"))]
    builds = []

    def build():
        builds.append(1)
        return entries

    assert load_or_build(build) == entries
    assert load_or_build(build) == entries  # read back from the temporary folder, not built again
    assert len(builds) == 1
    assert [p.parent.name for p in (tmp_path / "tmp").glob("*/op-catalogue-*.json")] == [f"neuron-validate-{os.getuid()}"]
