"""The executors of user scripts, for the runner's workers.

- ``script-side``: one side of a check (validate/run.py makes these cases): the functions
  convention's process, or one side of an unchanged training script. The script's own
  stdout and stderr go to the side's folder; the observations come back as the outcome's
  evidence.
- ``script``: a whole check, as one case of a suite (``neuron-conformance scripts DIR``) or a
  gate's rerun: its sides run in fresh processes of their own, and its outcome is the verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path

from conformance.case import Case
from conformance.outcome import Outcome, Status
from conformance.paths import DISPLAY_ROOT_ENV
from runner.executors import Executor
from runner.worker import CRASH_DIR_ENV

from .common import HARNESS_OUTPUTS_ENV, PRELOAD_ENV, ChildSpec, ScriptProblem, json_ready
from .script import FUNCTIONS, ScriptError, inspect_script


@contextmanager
def _output_to(folder: str):
    """The process's stdout and stderr (file descriptors 1 and 2, so C code's output too) into files."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(Path(folder) / "stdout.txt", "w") as out, open(Path(folder) / "stderr.txt", "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


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
                _write_apart(os.fsdecode(path), entry_only=event != "shutil.rmtree")
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
            truncating = (isinstance(mode, str) and "w" in mode) or (isinstance(flags, int) and bool(flags & os.O_TRUNC))
            _write_apart(os.fsdecode(path), truncating=truncating)
        _writes.add(os.path.realpath(os.fsdecode(path)))


_apart: tuple[Path, str] | None = None  # (the side's mirror, the folder it leaves out), while a side runs
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
    top, skip = _apart
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
def _own_working_directory(folder: str):
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
    _apart = (Path(os.path.abspath(top)), own)  # the side runs inside it: a relative --out would not resolve
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
                                       if not os.path.islink(os.path.join(root, n)))
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


def execute_side(case: Case, ctx) -> Outcome:
    spec = ChildSpec.from_config(case.config)

    def progress(**event) -> None:
        ctx.progress(event)

    warnings.simplefilter("default")  # as `python SCRIPT` shows them
    with _output_to(spec.out):
        if spec.convention == FUNCTIONS:  # one process runs every side: nothing to collide with
            from .functions import observe

            observations = observe(spec, progress)
        elif spec.nproc > 1:
            observations = observe_ranks(spec, progress)
        else:
            from .training import observe

            with _own_working_directory(spec.out) as files:
                observations = observe(spec, progress)
            if isinstance(observations.get(spec.side), dict):
                observations[spec.side]["outputs"] = files
    return Outcome(case_id=case.id, status=Status.PASS, message=f"{spec.side} side observed",
                   evidence={"observations": json_ready(observations)})


def _observe_rank(config: dict) -> dict:
    """One rank of a torchrun-style script's side (in a process of PyTorch's elastic launcher)."""
    from .training import observe

    spec = ChildSpec.from_config(config)
    rank = os.environ.get("RANK", "0")
    with _own_working_directory(os.path.join(spec.out, f"rank{rank}")):
        observations = json_ready(observe(spec, lambda **event: None))
    error = (observations.get(spec.side) or {}).get("error")
    if error and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The others may wait for this rank, in the group's rendezvous or a collective, until the group's
        # timeout (30 min): as under torchrun, a rank whose script failed fails, and the launcher stops the
        # others. What it observed goes to the side's report from its file.
        with open(_failed_rank_file(spec.out, rank), "w") as f:
            json.dump(observations, f)
        raise RuntimeError(f"{error.get('type', 'Error')}: {error.get('message', '')}")
    return observations


def _failed_rank_file(out: str, rank) -> str:
    return os.path.join(out, f"rank{rank}-failed.json")


EMULATOR_DEVICES_ENV = "NEURON_VALIDATE_EMULATOR_DEVICES"  # the emulated device's count (emulator/csrc/runtime.cpp)


def observe_ranks(spec: ChildSpec, progress) -> dict:
    """A side of ``--nproc N``: the script on N ranks (RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous set,
    as torchrun sets them); rank 0's observations, with the loss curve averaged over the ranks (each rank's
    loss is its own batch's)."""
    from distributed.launch import RankFailure, run_ranks

    progress(side=spec.side, phase=f"run on {spec.nproc} ranks")
    for rank in range(spec.nproc):  # a failure an earlier run of this side left (the retry with cuda taken)
        with suppress(FileNotFoundError):
            os.remove(_failed_rank_file(spec.out, rank))
    # A device per rank, as on a Trainium host's NeuronCores: a script takes device LOCAL_RANK
    # (torch.cuda.set_device(local_rank), .to(local_rank)), which one emulated device shared by every rank lacks.
    saved = os.environ.get(EMULATOR_DEVICES_ENV)
    os.environ[EMULATOR_DEVICES_ENV] = str(max(spec.nproc, int(saved or 1)))  # the ranks' fork server reads it
    try:
        ranks = run_ranks(_observe_rank, spec.nproc, spec.to_config(), logs=os.path.join(spec.out, "ranks"),
                          fresh=True)
    except RankFailure as failure:
        return _failed_side(spec, failure)
    finally:
        if saved is None:
            os.environ.pop(EMULATOR_DEVICES_ENV, None)
        else:
            os.environ[EMULATOR_DEVICES_ENV] = saved
    observations = ranks[0]
    curves = [(r.get(spec.side) or {}).get("curve") for r in ranks]
    side = observations.get(spec.side) or {}
    if all(curves) and len({len(c["losses"]) for c in curves}) == 1:
        losses = [sum(c["losses"][k] if c["losses"][k] is not None else float("nan") for c in curves) / len(curves)
                  for k in range(len(curves[0]["losses"]))]
        side["curve"] = {**curves[0], "losses": losses}
    observations.setdefault("notes", []).append(
        f"{spec.nproc} ranks on this side: the loss curve is the mean of the ranks' losses; layers are not compared")
    return observations


def _failed_side(spec: ChildSpec, failure) -> dict:
    """The side's observations where a rank failed: those of the rank whose script failed first (_observe_rank:
    the others may fail after it, in a collective it left; the launcher names the first rank to end, which may
    be one it stopped), else the launcher's message alone (a rank that died)."""
    written = {r: os.stat(_failed_rank_file(spec.out, r)).st_mtime_ns for r in range(spec.nproc)
               if os.path.exists(_failed_rank_file(spec.out, r))}
    failed = min(written, key=written.get) if written else failure.rank
    try:
        with open(_failed_rank_file(spec.out, failed)) as f:
            observations = json.load(f)
    except (OSError, ValueError):
        return {"convention": "training", "notes": [], "side": spec.side,
                spec.side: {"ran": False, "error": {"type": failure.message.split(":")[0], "message": str(failure),
                                                    "source": None, "phase": "run", "import_error": False}}}
    side = observations.get(spec.side) or {}
    if failed:
        side["error"] = {**side["error"], "message": f"rank {failed}: {side['error'].get('message', '')}"}
    observations.setdefault("notes", []).append(
        f"{spec.nproc} ranks on this side: rank {failed}'s script failed, and the others were stopped")
    return observations


def execute_script(case: Case, ctx) -> Outcome:
    """A whole check of the script ``case.name`` against the run's target; its report goes to the artifacts."""
    from diff.curves import CurveTolerance

    from .run import ValidateOptions, problem_outcome, validate_script

    try:
        script = inspect_script(case.name)
    except ScriptError as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"the script cannot be checked: {exc}")
    settings = ctx.settings
    out = (ctx.artifacts or Path("runs") / "artifacts") / "scripts" / case.id
    steps = case.config.get("steps")
    options = ValidateOptions(
        script=script, target=settings.target, reference=settings.reference, mode=case.mode or "eager",
        steps=steps, steps_given=steps is not None, seed=int(case.config.get("seed", 0)), out=out,
        script_args=tuple(case.config.get("args", ())), timeout_s=settings.timeout_s,
        backend_modules=settings.backend_modules, curve_tolerance=CurveTolerance(),
        rss_limit_mb=settings.rss_limit_mb, argv=(case.name,))
    try:
        validation = validate_script(options, target=ctx.target, reference=ctx.reference,
                                     on_progress=lambda side, event: ctx.progress({**event, "side": side}))
    except ScriptProblem as exc:
        return problem_outcome(options, exc)[1]
    outcome = validation.outcome
    if outcome.case_id != case.id:  # the suite's case carries what the check ran: they must agree
        outcome.evidence["case_mismatch"] = validation.case.id
        outcome.case_id = case.id
    return outcome


def _preload_side() -> None:
    """What a side imports at once, loaded before its worker is forked (runner.zygote, which has imported
    torch and ``torch._dynamo``), so that a check pays it once for each side's zygote rather than in each of
    its eight sides: the side's own recording modules, and the model libraries the script imports
    (:data:`PRELOAD_ENV`: transformers alone takes 3 s). One the script would fail to import is left to fail
    there, in the script's own words."""
    import importlib

    from . import functions, training  # noqa: F401

    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the script's import raises it again, as the script's problem
            pass


SIDE_EXECUTOR = Executor(kind="script-side", execute=execute_side, resolves_targets=False, shows_warnings=True,
                         warmup=_preload_side)
EXECUTOR = Executor(kind="script", execute=execute_script, shows_warnings=True)
