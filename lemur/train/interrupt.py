"""Ctrl-C (or SIGTERM) before training starts: exit at once, cleanly, never mid-write.

Left to Python, SIGINT raises `KeyboardInterrupt` wherever the main thread happens to
be: inside a JAX garbage-collection callback it is swallowed ("Exception ignored in
_xla_gc_callback", and the run trains to the end), and unwinding a half-built set-up
while XLA's threads run can crash the interpreter at exit (a segfault). So `lemur-train`
calls `arm()` first: from then on the signal only wakes a watcher thread (through
`signal.set_wakeup_fd`, so it wakes even while the main thread is inside XLA's
compiler), which prints one line and ends the process with `os._exit` (no interpreter
teardown, no half-run finalizers) as soon as no file write is in progress. Writes that
must not be cut run under `critical()`. Once the training loop owns the signals
(checkpoint, then stop) it calls `disarm()`.

Without `arm()` (library use) `critical()` and `disarm()` only serialize; signals keep
Python's default behaviour.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# Exit codes: 128 + the signal number, as a shell reports a process the signal killed.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
MESSAGES = {
    signal.SIGINT: "interrupted before training started",
    signal.SIGTERM: "terminated (SIGTERM) before training started",
}

_lock = threading.RLock()  # held by any thread while it writes a file (`critical`)
_local = threading.local()  # per thread: nesting of `critical()`
_exiting = threading.Lock()  # taken once by whoever ends the process
_pending: int | None = None  # a signal that arrived inside the main thread's `critical()`
_unpatch: list[Callable[[], None]] = []
_armed = False
_prefix = ""
_previous: dict[int, Any] = {}
_wakeup: dict[str, int] = {}  # the pipe the watcher thread reads (made once per process)


def arm(prefix: str = "lemur-train: ") -> bool:
    """Until `disarm()`, SIGINT/SIGTERM print one line and exit 130/143 (main thread only)."""
    global _armed, _prefix, _pending
    if threading.current_thread() is not threading.main_thread() or _armed:
        return False
    _pending = None
    if not _wakeup:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C-level handler must never block
        _wakeup.update(read=read_fd, write=write_fd)
        threading.Thread(
            target=_watch, args=(read_fd,), name="lemur-signal-watch", daemon=True
        ).start()
    for sig in EXIT_CODES:
        _previous[sig] = signal.signal(sig, _handler)
    _wakeup["saved"] = signal.set_wakeup_fd(_wakeup["write"], warn_on_full_buffer=False)
    _prefix, _armed = prefix, True
    return True


def disarm() -> None:
    """The training loop owns the signals from now on (call from the main thread)."""
    global _armed, _pending
    if not _armed:
        return
    with critical():
        _armed = False
        signal.set_wakeup_fd(_wakeup.pop("saved", -1))
    if _pending is not None:  # arrived during the block above: the new owner handles it
        signum, _pending = _pending, None
        signal.raise_signal(signum)


def restore() -> None:
    """Disarm and put back the handlers `arm()` replaced (the caller is done)."""
    disarm()
    while _previous:
        sig, handler = _previous.popitem()
        signal.signal(sig, handler)
    while _unpatch:
        _unpatch.pop()()


def guard_jax_cache_writes() -> None:
    """While armed, JAX's persistent compilation-cache writes are `critical` too.

    JAX writes a cache entry in place (no temporary name): an exit in the middle would
    leave a torn entry that every later run trips over. Only the write waits; compiling
    does not. A JAX without this internal function is left alone.
    """
    if not _armed or _unpatch:
        return
    try:
        from jax._src import compilation_cache as cache

        put = cache.put_executable_and_time
    except (ImportError, AttributeError):
        return

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with critical():
            return put(*args, **kwargs)

    cache.put_executable_and_time = guarded
    _unpatch.append(lambda: setattr(cache, "put_executable_and_time", put))


def armed() -> bool:
    """Whether a signal now ends the process (set-up under `lemur-train`)."""
    return _armed


def _depth() -> int:
    return getattr(_local, "depth", 0)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """A file write no signal may cut: an exit it asks for waits until the block ends."""
    with _lock:
        _local.depth = _depth() + 1
        try:
            yield
        finally:
            _local.depth -= 1
    if (
        _depth() == 0
        and _pending is not None
        and _armed
        and threading.current_thread() is threading.main_thread()
    ):
        _exit(_pending)


def _handler(signum: int, frame: Any) -> None:
    """Python-level handler (main thread): exit now, after the write in progress, or as usual."""
    global _pending
    if not _armed:
        # Set-up is over but the loop's own handlers are not in place (or were removed):
        # behave as if we had never been installed.
        previous = _previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    if _depth():
        _pending = signum  # `critical()` exits when the write is done
    else:
        with _lock:  # waits for a write in progress on another thread
            _exit(signum)


def _watch(fd: int) -> None:
    """Watcher thread: woken by the C-level handler even while the main thread is in XLA."""
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        for signum in data:
            if signum in EXIT_CODES:
                with _lock:  # waits for a write in progress on any thread
                    if _armed:
                        _exit(signum)


def _exit(signum: int) -> None:
    """Print the one line and end the process now (no interpreter teardown)."""
    if not _exiting.acquire(blocking=False):
        return  # the other thread is already ending the process
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream must not stop the exit
            pass
    os.write(2, f"{_prefix}{MESSAGES[signum]}\n".encode())
    os._exit(EXIT_CODES[signum])
