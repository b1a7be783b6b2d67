"""Worker processes that die with the process that started them.

A SIGKILLed `lemur-data build` or `lemur-train` cannot clean up after itself, so its workers
must notice on their own. Python's pools don't: a `ProcessPoolExecutor` worker blocks on its
call queue forever, a forkserver outlives its clients, and Grain's prefetch processes wait on
their queues. Each worker calls `die_with_parent` first thing:

- on Linux, `prctl(PR_SET_PDEATHSIG, SIGKILL)` makes the kernel kill it the moment its parent
  dies, so it writes nothing more (the signal follows the parent *thread* that started the
  worker: start pools from a thread that outlives them);
- everywhere, a daemon thread polls `os.getppid()` and kills the process when the parent is
  gone (a fallback with at most `poll` seconds of delay).

The multiprocessing resource tracker then exits by itself: it ends when every process that
holds its pipe (the parent and these workers) is gone.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_guarded = False


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl (unusual libc): the polling thread still guards the process


def _watch(parent: int, poll: float) -> None:
    while True:
        time.sleep(poll)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # not sys.exit: no cleanup that might write


def die_with_parent(parent: int | None = None, poll: float = 0.5) -> None:
    """Kill this process as soon as `parent` (default: the current parent) is gone."""
    global _guarded
    if _guarded:
        return
    expected = os.getppid() if parent is None else parent
    _set_parent_death_signal()
    if os.getppid() != expected:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(
        target=_watch, args=(expected, poll), daemon=True, name="lemur-parent-watch"
    ).start()
    _guarded = True


def guard_if_child() -> None:
    """`die_with_parent` when this is a multiprocessing child (for code run inside pools)."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        die_with_parent(parent.pid)
