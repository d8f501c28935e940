"""One writer per output directory: an exclusive lock on ``<out>/.lock`` while a run works there (a training
run, an evaluation, a bench, a study's timing run).

Two runs writing one directory would each report success while one result is lost, so the second is
refused. The lock is ``fcntl.flock`` on an open file: the operating system drops it when its process
ends, however it ends (Ctrl-C, SIGKILL, a crash), so a killed run never leaves a stale lock behind.
The file holds the holder's pid and host, only for the message the refused run prints. Where fcntl
does not exist (Windows) or the file system cannot lock, runs are not locked.

A study's output is held ``shared`` by each of its runs that trains or evaluates (several at once, from
``--jobs`` or from two studies writing one folder, are fine) and exclusively by each timing run, which
shares its cores with none of them: a timing waits for nothing and is refused while another run works
there, and a run is refused while a timing holds the output.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..core.errors import TokenReduceError

try:
    import fcntl
except ImportError:  # not a POSIX system
    fcntl = None

#: The lock file's name inside the output directory.
LOCK_NAME = ".lock"


@contextmanager
def hold(out: str | os.PathLike, what: str = "training run", *, shared: bool = False) -> Iterator[None]:
    """Hold ``out``'s lock for the block (the directory is created); a TokenReduceError when another
    process holds it or ``out`` cannot be written. ``what``: the kind of run that holds it (the file says,
    for the message of one refused); ``shared``: other shared holders are let in, an exclusive one is not."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        f = open(out / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the whole block
    except OSError as e:
        raise TokenReduceError(f"cannot write to the output directory {out}: {e.strerror or e}") from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "process"
                raise TokenReduceError(f"{out} is in use by another {holder}; wait for it to end "
                                       "or choose another --out") from None
            except OSError:  # a file system without locks: run unlocked rather than not at all
                pass
        f.seek(0)
        f.truncate()
        try:  # unbuffered: a full disk is met here, and not again when the file is closed
            os.write(f.fileno(), f"{what} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
        except OSError as e:
            raise TokenReduceError(f"cannot write to the output directory {out}: {e.strerror or e}") from None
        yield
    finally:
        f.close()  # releases the lock
