"""One run, one owner: an exclusive `flock` on `<run>/run.lock`, taken by the rlrun process that
runs the run (`rlrun train`, `rlrun resume`) before it reads or writes anything of it, and held
until it ends.

The kernel releases the lock when its owner dies, however it dies (Ctrl-C, a crash, SIGKILL, a
reboot), so a dead launcher never blocks a resume, and no pid written in a file is trusted: a run
is running exactly when its lock is held (`holder`). The lock's descriptor is close-on-exec
(Python's default) and every child is started with `close_fds`, so no child of the run, not even
one that outlives a SIGKILLed launcher, keeps the lock alive. The lock file itself is never
written: a refused command changes nothing in the run directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlrun.errors import RunDirError
from rlrun.rundir import RunDir

# Readers (`holder`) take the lock shared for a few microseconds to look: an owner-to-be retries
# this long before it calls the run busy.
ACQUIRE_PATIENCE_S = 0.5
_RETRY_S = 0.01


@dataclass(frozen=True)
class Holder:
    """The process that holds a run's lock: its pid where the kernel says (/proc/locks), else None."""

    pid: Optional[int]

    def describe(self) -> str:
        return (
            f"rlrun (pid {self.pid})"
            if self.pid is not None
            else "another rlrun process (its pid is not visible from here)"
        )


class RunLock:
    """A held run lock; `release()` (or leaving its `with` block, or the process dying) lets go."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: Optional[int] = fd
        self.path = path

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of the open file releases the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(run_dir: RunDir, *, patience_s: float = ACQUIRE_PATIENCE_S) -> RunLock:
    """Own `run_dir` (it must exist); RunDirError (exit 4) at once, naming the holder, when another
    process owns it. Creates the lock file only in a run made before run locks existed."""
    path = run_dir.lock_file
    fd = _open(path, create=True)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return RunLock(fd, path)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise RunDirError(
                    f"cannot lock the run directory {run_dir.root} ({path.name}: {exc.strerror})."
                ) from None
        if time.monotonic() >= deadline:
            who = Holder(_pid_holding(fd))
            os.close(fd)
            raise RunDirError(
                f"{run_dir.root} is being run right now by {who.describe()}: one run has one owner. Wait for it to "
                f"end, or stop it first (Ctrl-C in its terminal{f', or kill {who.pid}' if who.pid else ''}); nothing was changed."
            )
        time.sleep(_RETRY_S)


def holder(run_dir: RunDir) -> Optional[Holder]:
    """Who runs `run_dir` now, or None when nobody does (finished, stopped, killed, never started)."""
    try:
        fd = _open(run_dir.lock_file, create=False)
    except FileNotFoundError:
        return None
    except RunDirError:
        return None  # unreadable here: nothing to say about it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return Holder(_pid_holding(fd))
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _open(path: Path, *, create: bool) -> int:
    """A close-on-exec descriptor of the lock file, for writing where allowed (NFS locks want it)."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags | os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        raise
    except PermissionError:
        pass  # another user's run, or a read-only directory: reading is enough to lock locally
    except OSError as exc:
        raise RunDirError(f"cannot open {path}: {exc.strerror}.") from None
    try:
        return os.open(path, flags | os.O_RDONLY)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise RunDirError(f"cannot open {path}: {exc.strerror}.") from None


def _pid_holding(fd: int) -> Optional[int]:
    """The pid of the process holding a flock on the file behind `fd`, from /proc/locks (Linux; a
    holder in another pid namespace is not listed there)."""
    st = os.fstat(fd)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" (a waiter's line: "1: -> FLOCK ...")
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit() and fields[5] == wanted:
            return int(fields[4]) or None
    return None
