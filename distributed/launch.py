"""Launching a case's ranks with PyTorch's elastic launcher (what ``torchrun`` runs).

:func:`run_ranks` starts ``world_size`` processes of a module-level function
through ``torch.distributed.launcher.api.elastic_launch`` on a local c10d
rendezvous, with no restarts, and returns each rank's return value. The
ranks' output goes to files under ``logs`` (the case's artifacts), not to
the worker's terminal. A rank that raises or dies raises :class:`RankFailure`
with the first failing rank's error; a rank that hangs hangs the call, and
the runner's supervisor times the case out (the ranks are in the worker's
process group, which the supervisor kills as a whole).

The suites' ranks start from a fork server that has imported PyTorch and the
harness's distributed code once (:data:`PRELOAD`): a rank is then a fork of a
process that never ran an op, not a fresh interpreter importing PyTorch again
(about 4 s of CPU per rank, the bulk of a small case). The server is the
worker's, with the worker's environment, which a worker never changes. A
user's script's ranks (``fresh=True``) start from a server of their side's
own, which imports PyTorch alone (:data:`SCRIPT_PRELOAD`) in that side's
environment: its side's state, the reference side's hidden device included,
must not come from a server that imported the device or the harness's code
for another side or case. The side's process is a fresh one for that side
alone (validate.run), so its server serves nothing else.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class RankFailure(Exception):
    """A rank raised or died: ``rank``, its ``message`` (one line), ``signal`` when it was killed."""

    rank: int
    message: str
    signal: str = ""

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.message}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Imported by the fork server before it forks any rank: what every rank needs, none of it running an op.
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "emulator", "distributed.collectives",
           "distributed.dtensor", "distributed.parity", "model_zoo"]


# A user's script's ranks: PyTorch and what its first optimizer imports (torch._dynamo), nothing of the harness's.
# Once for a side's ranks, where a fresh interpreter per rank imported them once each (4 s of CPU a rank).
SCRIPT_PRELOAD = ["torch", "torch._dynamo", "torch.distributed"]


def _start_method(fresh: bool) -> str:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # read when the server starts, at the process's first launch
    multiprocessing.set_forkserver_preload(SCRIPT_PRELOAD if fresh else PRELOAD)
    _short_socket_folder()
    return "forkserver"


def _short_socket_folder() -> None:
    """The fork server listens on a socket in multiprocessing's folder inside the temporary folder, and a TMPDIR
    of about 75 characters or more makes its path too long for AF_UNIX (107 bytes): every distributed case then
    failed to start ("OSError: AF_UNIX path too long"). That folder is then made under /tmp, and removed at exit
    as multiprocessing removes its own (Python 3.13 does the same)."""
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is not None or len(tempfile.gettempdir()) <= 70 or not os.path.isdir("/tmp"):
        return
    folder = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
    config["tempdir"] = folder


def start_fork_server() -> None:
    """A worker's warm-up: the fork server imports :data:`PRELOAD` now (a no-op rank-less process waits for it),
    so a case's timeout measures the case, not the server's start (several seconds of CPU: on a loaded machine
    the first case of a worker ran out a 25 s timeout on it)."""
    if _start_method(False) == "forkserver":
        process = multiprocessing.get_context("forkserver").Process(target=os.getpid)
        process.start()
        process.join()


def run_ranks(fn: Callable[..., Any], world_size: int, *args, logs: str | None = None,
              fresh: bool = False) -> list[Any]:
    """``fn(*args)`` on ranks 0..world_size-1 (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set); their results.
    ``fresh``: the ranks of a user's script, forked from a server that imported PyTorch alone, not the
    harness's distributed code (:data:`SCRIPT_PRELOAD`)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    scratch = None if logs else tempfile.mkdtemp(prefix="neuron_validate_ranks_")  # no one reads it afterwards
    logs = logs or scratch
    os.makedirs(logs, exist_ok=True)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=uuid.uuid4().hex[:12],
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                          monitor_interval=0.05, start_method=_start_method(fresh),
                          logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.ALL, tee=Std.NONE))
    try:
        results = elastic_launch(config, fn)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", "")
        message = str(message or "").strip()
        signal = failure.signal_name() if failure.exitcode is not None and failure.exitcode < 0 else ""
        if not message or message.startswith("To enable traceback"):
            message = _last_error_line(failure.error_file) or (f"killed by {signal}" if signal else
                                                               f"exited with status {failure.exitcode}")
        raise RankFailure(rank=rank, message=message.splitlines()[-1][:300], signal=signal) from None
    finally:
        if scratch:  # the ranks' output was read above, where a rank failed; a run must not leave it behind
            shutil.rmtree(scratch, ignore_errors=True)
    return [results[rank] for rank in range(world_size)]


def _last_error_line(path: str | None) -> str:
    import json

    if not path or not os.path.exists(path):
        return ""
    try:
        data = json.loads(open(path).read())
        message = data.get("message", {})
        if isinstance(message, dict):
            message = message.get("message", "")
        return str(message).strip()
    except (OSError, ValueError):
        return ""
