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
Python's default behaviour. The state lives in one `SetupInterrupts` object per process
(`INTERRUPTS`, signals being a process's); the module's functions are its methods. Importing
this module changes nothing: `lemur.process_setup` lists what `arm()` changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from lemur.cli_common import EXIT_SIGINT, EXIT_SIGTERM

# The exit code of each signal this module handles: those of every lemur command.
EXIT_CODES = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}
MESSAGES = {
    signal.SIGINT: "interrupted before training started",
    signal.SIGTERM: "terminated (SIGTERM) before training started",
}


class SetupInterrupts:
    """What `arm()` changes and what a signal finds: handlers, wake-up pipe, pending signal.

    Signals belong to a process, so one instance (`INTERRUPTS`) serves it; making one
    changes nothing, `arm()` does.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()  # held by any thread while it writes a file (`critical`)
        self.local = threading.local()  # per thread: nesting of `critical()`
        self.exiting = threading.Lock()  # taken once by whoever ends the process
        self.pending: int | None = None  # a signal that came inside the main thread's `critical()`
        self.armed = False
        self.prefix = ""
        self.messages: dict[int, str] = dict(MESSAGES)  # the line of each signal, armed
        self.previous: dict[int, Any] = {}  # the handlers `arm()` replaced
        self.unpatch: list[Callable[[], None]] = []  # undoes `guard_jax_cache_writes`
        self.wakeup: dict[str, int] = {}  # the pipe the watcher thread reads (made once)

    def arm(self, prefix: str = "lemur-train: ", messages: dict[int, str] | None = None) -> bool:
        """Until `disarm()`, SIGINT/SIGTERM print one line (`messages`' for that signal,
        default MESSAGES') and exit 130/143 (main thread only)."""
        if threading.current_thread() is not threading.main_thread() or self.armed:
            return False
        self.pending = None
        if "read" not in self.wakeup:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)  # the C-level handler must never block
            self.wakeup.update(read=read_fd, write=write_fd)
            threading.Thread(
                target=self._watch, args=(read_fd,), name="lemur-signal-watch", daemon=True
            ).start()
        for sig in EXIT_CODES:
            self.previous[sig] = signal.signal(sig, self._handler)
        self.wakeup["saved"] = signal.set_wakeup_fd(self.wakeup["write"], warn_on_full_buffer=False)
        self.prefix, self.armed = prefix, True
        self.messages = {**MESSAGES, **(messages or {})}
        return True

    def disarm(self) -> None:
        """The training loop owns the signals from now on (call from the main thread)."""
        if not self.armed:
            return
        with self.critical():
            self.armed = False
            signal.set_wakeup_fd(self.wakeup.pop("saved", -1))
        if self.pending is not None:  # arrived during the block above: the new owner handles it
            signum, self.pending = self.pending, None
            signal.raise_signal(signum)

    def restore(self) -> None:
        """Disarm and put back what `arm()` and `guard_jax_cache_writes()` replaced."""
        self.disarm()
        while self.previous:
            sig, handler = self.previous.popitem()
            signal.signal(sig, handler)
        while self.unpatch:
            self.unpatch.pop()()

    def guard_jax_cache_writes(self) -> None:
        """While armed, JAX's persistent compilation-cache writes are `critical` too.

        JAX writes a cache entry in place (no temporary name): an exit in the middle would
        leave a torn entry that every later run trips over. Only the write waits; compiling
        does not. A JAX without this internal function is left alone.
        """
        if not self.armed or self.unpatch:
            return
        try:
            from jax._src import compilation_cache as cache

            put = cache.put_executable_and_time
        except (ImportError, AttributeError):
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self.critical():
                return put(*args, **kwargs)

        cache.put_executable_and_time = guarded
        self.unpatch.append(lambda: setattr(cache, "put_executable_and_time", put))

    def depth(self) -> int:
        """How many `critical()` blocks this thread is in."""
        return getattr(self.local, "depth", 0)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A file write no signal may cut: an exit it asks for waits until the block ends."""
        with self.lock:
            self.local.depth = self.depth() + 1
            try:
                yield
            finally:
                self.local.depth -= 1
        if (
            self.depth() == 0
            and self.pending is not None
            and self.armed
            and threading.current_thread() is threading.main_thread()
        ):
            self._exit(self.pending)

    def _handler(self, signum: int, frame: Any) -> None:
        """Python-level handler (main thread): exit now, after the write in progress, or as
        usual."""
        if not self.armed:
            # Set-up is over but the loop's own handlers are not in place (or were removed):
            # behave as if we had never been installed.
            previous = self.previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if self.depth():
            self.pending = signum  # `critical()` exits when the write is done
        else:
            with self.lock:  # waits for a write in progress on another thread
                self._exit(signum)

    def _watch(self, fd: int) -> None:
        """Watcher thread: woken by the C-level handler even while the main thread is in XLA."""
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            for signum in data:
                if signum in EXIT_CODES:
                    with self.lock:  # waits for a write in progress on any thread
                        if self.armed:
                            self._exit(signum)

    def _exit(self, signum: int) -> None:
        """Print the one line and end the process now (no interpreter teardown)."""
        if not self.exiting.acquire(blocking=False):
            return  # the other thread is already ending the process
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream must not stop the exit
                pass
        os.write(2, f"{self.prefix}{self.messages[signum]}\n".encode())
        os._exit(EXIT_CODES[signum])


INTERRUPTS = SetupInterrupts()
arm = INTERRUPTS.arm
disarm = INTERRUPTS.disarm
restore = INTERRUPTS.restore
guard_jax_cache_writes = INTERRUPTS.guard_jax_cache_writes
critical = INTERRUPTS.critical
