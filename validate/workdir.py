"""A side's own working directory: a mirror of yours, made of links, where the side's writes land apart.

Two sides of a check (and its perturbed runs) run the same unchanged script, which reads its inputs relative
to its working directory (``../data``, as pytorch/examples read it) and writes its outputs there (a
checkpoint, a log). Each side runs in a mirror of your working directory and the folders above it, whose
entries link to yours, so that its reads resolve as without the tool and its writes land in its own folder:
neither side reads the other's outputs, no run resumes from another run's checkpoint, and your files are left
as they were. What a side writes into your folders anyway (C code, a process the script starts) is reported.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from conformance.paths import DISPLAY_ROOT_ENV
from runner.worker import CRASH_DIR_ENV

from .common import HARNESS_OUTPUTS_ENV

MIRROR_LIMIT = 2000  # entries of one folder mirrored link by link; a larger folder is linked whole
_writes: set[str] | None = None  # real paths the side opened for writing, while a side runs
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple) -> None:
    """Python's ``open`` audit event (``open()``, ``os.open``): where the script writes, as it happens; and
    ``tempfile``'s events: the scratch files and folders its libraries make (a compiler's, a profiler's), which
    land in the user's folders when those are inside the temporary directory, and are not the script's outputs."""
    if _writes is None:
        return
    if event in ("tempfile.mkstemp", "tempfile.mkdtemp"):
        _temporaries.add(os.path.realpath(os.fsdecode(args[0])))
        return
    if event in _CHANGES_ENTRIES:  # what the call changes is an entry of a folder: that folder is the side's own
        for path in args[:2 if event == "os.rename" else 1]:
            if isinstance(path, (str, bytes, os.PathLike)):
                # A folder removed (whole, or empty) becomes one of links first: rmtree refuses a link, and
                # rmdir a link is "Not a directory" (an empty folder of links is removed, a full one is not).
                _write_apart(os.fsdecode(path), entry_only=event not in ("shutil.rmtree", "os.rmdir"))
        return
    if event != "open":
        return
    path, mode, flags = args
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and bool(flags & _WRITE_FLAGS))
    if writing:
        if not (isinstance(mode, str) and "x" in mode) and not (isinstance(flags, int) and flags & os.O_EXCL):
            truncating = (isinstance(mode, str) and "w" in mode) or (
                isinstance(flags, int) and bool(flags & os.O_TRUNC))
            _write_apart(os.fsdecode(path), truncating=truncating)
        _writes.add(os.path.realpath(os.fsdecode(path)))


# While a side runs: (its mirror's top, the folder the mirror leaves out, your folder the top stands for).
_apart: tuple[Path, str, str] | None = None
_making_apart = False  # _write_apart's own file operations raise audit events too
# Audit events of calls that add, remove or rename a folder's entries (os.replace raises os.rename's): in a
# folder of the side's own they change the mirror's links, never your files.
_CHANGES_ENTRIES = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree"})


def _write_apart(path: str, *, truncating: bool = False, entry_only: bool = False) -> None:
    """Before the side writes ``path``: where the path reaches your folders through the mirror's links, each
    linked folder on the way becomes a real folder of links, and the file a copy of its own (none where the
    write truncates), so the write lands in the side's mirror and your file is left as it was. With
    ``entry_only`` (a removal, a rename, a new folder) only the folders on the way are made the side's own:
    the call then changes the mirror's entry, a link, not what it links to.

    Without it a script that resumes from ``../checkpoints/last.pt`` and saves there again overwrote your
    checkpoint from every run of the check, and each run resumed from the one before it: the reference, the
    target and the perturbed runs trained from different steps (one check took a checkpoint from step 20 to
    step 140). An open that must create the file (``x``, ``O_EXCL``) is left to fail on your file as it would."""
    global _making_apart
    if _apart is None or _making_apart:
        return
    top, skip, _ = _apart
    absolute = Path(os.path.abspath(path))
    if top not in absolute.parents:
        return
    _making_apart = True
    try:
        here = top
        parts = absolute.relative_to(top).parts
        for i, name in enumerate(parts):
            node = here / name
            if not node.is_symlink():
                if not node.is_dir():
                    return  # not there yet (the side makes it), or a file of its own
                here = node
                continue
            linked = os.readlink(node)
            if i == len(parts) - 1 and not os.path.isdir(linked):
                if entry_only:
                    return
                node.unlink()
                if not truncating and os.path.isfile(linked):
                    shutil.copy2(linked, node)  # appended to, or updated in place: a copy of its own
                return
            if not os.path.isdir(linked) or (entry_only and i == len(parts) - 1):
                return
            node.unlink()  # a folder of your folders (to be written in, or removed whole): one of links instead
            node.mkdir()
            _mirror(linked, node, 0, skip, {})
            here = node
    except OSError:
        return  # the write goes where it would have gone; the outputs check still reports it
    finally:
        _making_apart = False


_audit_installed = False
_temporaries: set[str] = set()  # real paths tempfile made while a side runs
# Processes the script starts itself with multiprocessing (its spawn raises no audit event: Process.start is
# counted while a side runs): the harness follows only the script's own process, so training there
# (pytorch/examples' mnist_hogwild) is never seen, and the error should say so.
_processes: list[str] = []
_DATA_LOADER = os.sep + os.path.join("torch", "utils", "data") + os.sep


def _in_data_loader() -> bool:
    """Whether a DataLoader is starting its workers (they load data; they never train)."""
    frame = sys._getframe(1)
    while frame is not None:
        if _DATA_LOADER in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


# The harness's own stores, which other checks running beside this one may write at any time.
HARNESS_FILES = ("results.sqlite", "reference_cache.sqlite")
PARENT_LEVELS = 2  # folders above the working directory mirrored too: ``../data`` resolves as without the tool


def _harness_owned(path: str) -> bool:
    owned = os.environ.get(HARNESS_OUTPUTS_ENV, "")
    if not owned:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return f"{st.st_dev}:{st.st_ino}" in owned.split(",")


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _mirror(source: str, into: Path, depth: int, skip: str, stamps: dict[str, tuple | None]) -> None:
    """``into`` gets a symbolic link to each entry of ``source``; folders (to ``depth``) become real folders of
    links, so that a file the script creates there lands in ``into``. The linked files' stamps go to
    ``stamps``: C code (``torch.save``) writes without Python's ``open``, and a changed stamp shows it."""
    try:
        entries = list(os.scandir(source))
    except OSError:
        return
    for entry in entries:
        target = into / entry.name
        mirror_it = (entry.is_dir(follow_symlinks=False) and depth > 0 and len(entries) <= MIRROR_LIMIT
                     and not (skip == entry.path or skip.startswith(entry.path + os.sep)))  # not our own output
        if mirror_it:
            target.mkdir(exist_ok=True)
            _mirror(entry.path, target, depth - 1, skip, stamps)
            continue
        if not target.exists():
            target.symlink_to(entry.path)
        if entry.is_file() and not entry.name.startswith(HARNESS_FILES) and not _harness_owned(entry.path):
            stamps[entry.path] = _stamp(entry.path)


# Writers that make their file in compiled code, past Python's ``open`` and its audit event, and write through a
# link: (module, name, the index of the path among the arguments, its keyword). safetensors' ``save_file``
# replaces a link with a file of its own, so it needs nothing.
C_WRITERS = (("torch", "save", 1, "f"), ("torch.serialization", "save", 1, "f"))


def _save_apart():
    """Each of :data:`C_WRITERS` that the side has imported gets its path written apart first (:func:`_write_apart`).
    Returns what puts them back."""
    restore = []
    for module_name, name, index, keyword in C_WRITERS:
        module = sys.modules.get(module_name)
        original = getattr(module, name, None)
        if original is None:
            continue

        def apart(*args, _original=original, _index=index, _keyword=keyword, **kwargs):
            path = args[_index] if len(args) > _index else kwargs.get(_keyword)
            if isinstance(path, (str, bytes, os.PathLike)):
                _write_apart(os.fsdecode(path), truncating=True)
            return _original(*args, **kwargs)

        setattr(module, name, apart)
        restore.append((module, name, original))

    def put_back() -> None:
        for module, name, original in restore:
            setattr(module, name, original)

    return put_back


def _ancestors(path: str, levels: int) -> list[str]:
    """``path`` and up to ``levels`` folders above it, the file system's root left out."""
    chain = [path]
    for _ in range(levels):
        parent = os.path.dirname(chain[-1])
        if parent == chain[-1] or os.path.dirname(parent) == parent:
            break
        chain.append(parent)
    return chain


@contextmanager
def own_working_directory(folder: str):
    """The side runs in a working directory of its own, so that the two sides' outputs cannot overwrite each
    other: a mirror of the user's working directory whose entries are links (relative inputs still resolve),
    inside mirrors of the PARENT_LEVELS folders above it, so that ``../data`` resolves as it would without
    the tool (pytorch/examples read their data there). Yields a dict filled at the end: ``created`` (files
    the side wrote in its own folders) and ``shared`` (files it wrote in the user's folders through a link:
    both sides write those). Writes are seen through Python's audit hook for ``open`` and, for the files
    linked directly in the working directory (C code writes without ``open``), through their changed stamps
    (above it anyone may change a file, so there only ``open`` counts); the scratch files of ``tempfile``, files
    the side removed again, the harness's own stores and the files its own process writes (a shell redirection)
    are left out.

    The mirror is built afresh for every run: one left by an earlier run in the same folder (``--out`` given
    again) held the real folders that run's script made where the user's had none yet, and hid the ones the
    user made since (pytorch/examples' mnist_forward_forward, run once before its ``./data/MNIST/raw`` was
    there and again after: "Error downloading" from an empty leftover folder)."""
    global _writes, _audit_installed, _apart
    original = os.getcwd()
    chain = _ancestors(original, PARENT_LEVELS)
    top = Path(folder) / "cwd"
    shutil.rmtree(top, ignore_errors=True)  # links are removed, never followed
    top.mkdir(parents=True, exist_ok=True)
    stamps: dict[str, tuple | None] = {}
    own = os.path.abspath(folder)
    here = top
    for level, child in zip(reversed(chain[1:]), reversed(chain[:-1])):
        (here / os.path.basename(child)).mkdir(exist_ok=True)  # a real folder: not linked by the mirror
        # Files above the working directory count as written only through Python's open: their changed stamps
        # may be anyone's (a log another job appends to, in a busy parent folder such as the temporary one).
        _mirror(level, here, 0, own, {})
        here = here / os.path.basename(child)
    _mirror(original, here, 2, own, stamps)
    files: dict = {"cwd": str(here), "created": [], "shared": [], "processes": 0}
    if not _audit_installed:
        sys.addaudithook(_audit)
        _audit_installed = True
    # Absolute: the side runs inside it, where a relative --out would not resolve.
    _apart = (Path(os.path.abspath(top)), own, os.path.realpath(chain[-1]))
    _run_copies.clear()
    save = _save_apart()
    _writes = set()
    _temporaries.clear()
    _processes.clear()
    import multiprocessing.process

    start = multiprocessing.process.BaseProcess.start

    def counted_start(process):
        if not _in_data_loader():
            _processes.append(type(process).__name__)
        return start(process)

    multiprocessing.process.BaseProcess.start = counted_start
    os.chdir(here)
    os.environ[DISPLAY_ROOT_ENV] = original  # lines are still named relative to the user's directory
    try:
        yield files
    finally:
        scratch = tuple(_temporaries)
        # A file gone when the side ends is its own scratch (tempfile's probe of the temporary folder writes and
        # removes a file of 8 random letters there): nothing of it is left to collide with the other side's.
        written = {p for p in _writes if os.path.lexists(p)
                   and not any(p == t or p.startswith(t + os.sep) for t in scratch)}
        _writes = None
        _apart = None
        save()
        multiprocessing.process.BaseProcess.start = start
        files["processes"] = len(_processes)
        os.chdir(original)
        os.environ.pop(DISPLAY_ROOT_ENV, None)
        for root, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            files["created"] += sorted(os.path.relpath(os.path.join(root, n), here) for n in names
                                       if not os.path.islink(os.path.join(root, n))
                                       and os.path.abspath(os.path.join(root, n)) not in _run_copies)
        files["created"] = files["created"][:50]
        user, ours = os.path.realpath(chain[-1]), (os.path.realpath(folder), os.path.realpath(top))
        if os.environ.get(CRASH_DIR_ENV):  # the supervisor's fault logs: in the user's folders when that is /tmp
            ours += (os.path.realpath(os.environ[CRASH_DIR_ENV]),)
        changed = {os.path.realpath(p) for p, stamp in stamps.items() if _stamp(p) != stamp}
        shared = (os.path.relpath(p, os.path.realpath(original)) for p in written | changed
                  if p.startswith(user + os.sep) and not p.startswith(tuple(o + os.sep for o in ours))
                  and not _harness_owned(p) and not os.path.basename(p).startswith(HARNESS_FILES))
        files["shared"] = sorted(p for p in shared if not any(part.startswith(".") and part != ".."
                                                              for part in Path(p).parts))[:50]


_run_copies: set[str] = set()  # files of the mirror copied for the side to run (as_run_in_mirror): not its outputs


def as_run_in_mirror(script: str) -> str | None:
    """The script's place in the running side's mirror, made a file of its own (a copy, not a link), for the
    script's ``__file__`` and ``sys.argv[0]``. A script that finds its folder from them
    (``Path(__file__).resolve().parent / "checkpoints"``, ``os.path.dirname(os.path.realpath(__file__))``)
    then writes into the mirror; with your path it wrote into your folder past the mirror, and every run of the
    check resumed from the checkpoint the run before it had saved there. None where no side runs, or where the
    script lies outside the mirrored folders (it then runs as it is)."""
    if _apart is None:
        return None
    top, _, root = _apart
    real = os.path.realpath(script)
    if not real.startswith(root + os.sep):
        return None
    mirrored = top / os.path.relpath(real, root)
    _write_apart(str(mirrored))  # the folders on the way made the side's own, the script a copy
    if mirrored.is_symlink() or not mirrored.is_file():
        return None
    _run_copies.add(str(mirrored))
    return str(mirrored)


__all__ = ["as_run_in_mirror", "own_working_directory"]
