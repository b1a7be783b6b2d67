"""Every process-wide change lemur makes, and why; the commands make them, never an import.

Importing `lemur` or any of its modules changes nothing global (loguru's handlers, logging's
filters, `sys.unraisablehook`, signal handlers, third-party functions, warnings filters,
environment variables): tests/test_process_setup.py checks it. A command's `main()` calls
`install(COMMAND)` first, which makes that command's changes (`COMMANDS`):

lemur-data
- `HF_HUB_OFFLINE=1` unless set: a build never reaches a model hub, whatever a tokenizer
  library would look up;
- loguru: one console handler showing warnings and errors as `LEVEL: message`, replacing
  datatrove's verbose stderr handler (installed when datatrove is imported), so that the
  progress display stays readable (`quiet_datatrove`).

lemur-train
- `sys.unraisablehook` and a filter on the `asyncio` logger drop what a failed orbax restore
  leaves behind (`quiet_failed_restores`): orbax closes its event loop with sibling reads
  pending, and their leftovers print dozens of tracebacks around our one line at any later
  moment, the interpreter's exit included, so the filter must outlive the restore.

lemur-convert
- the same filter (`quiet_failed_restores`): a save that fails (a full disk) leaves the same
  leftovers as a failed restore.

lemur-eval: none but the first below.

lemur-train, lemur-eval, lemur-convert
- `JAX_PLATFORMS=cpu` where the environment does not set it, a TPU library (libtpu) is
  installed, and neither a TPU nor a GPU is attached to the host
  (`cpu_where_no_accelerator`): otherwise JAX lets libtpu look for a TPU first, and libtpu
  prints five lines of errors on every CPU host (it looks like a crash). A host with a TPU
  (by PCI vendor id, as JAX itself tells) or a GPU keeps JAX's own choice.

Changes a command's own code makes later, for as long as they are needed, and undoes:
- every command's body (`lemur.cli_common.run_main`): a SIGTERM handler that raises
  `Terminated` in the main thread (where SIGTERM was at its default), so that `finally`
  blocks run and the exit is 143 with one line; put back when the body ends.
- `lemur-train` set-up (`lemur.train.interrupt`, armed by `lemur.train.cli` until training
  starts): SIGINT/SIGTERM handlers, `signal.set_wakeup_fd` and a watcher thread, so that
  Ctrl-C exits at once without a half-written file; JAX's compilation-cache write
  (`jax._src.compilation_cache.put_executable_and_time`) runs as a critical write.
- the training loop (`lemur.train.setup.StopSignal`): SIGINT/SIGTERM handlers that
  checkpoint and stop, put back when the loop ends; a Trainer's start
  (`lemur.train.state.start_processes`): `jax.distributed` for multi-host runs and JAX's
  `jax_compilation_cache_dir` from the config's `compile_cache_dir` (unless already set).
- each data task, in whatever process runs it (`lemur.data.run.logs.task_logs`):
  datatrove's task logger is ours for the task (the task's file at INFO, the console at
  WARNING); datatrove itself sets its `DATATROVE_*` environment variables per task.
- local build workers and the trainer's loader processes (`lemur.process_guard`):
  `PR_SET_PDEATHSIG` and a parent watch, so that they die with the process that started them.
- a dedup bucket task raises its soft limit of open files (`lemur.data.dedup.rows`); a
  sandboxed program's process sets its resource limits and umask (`lemur.eval.sandbox.jail`).
- `lemur.train.checkpoint` and `lemur.model.checkpoint`: absl's log level around orbax
  calls, and a muted `sys.unraisablehook` while collecting a failed restore's leftovers
  (both put back).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

# Step directories (with a trailing separator) whose restore failed: orbax's leftovers that
# name one are dropped (`lemur.train.checkpoint` adds to it).
FAILED_RESTORES: set[str] = set()


def _orbax_noise(text: str) -> bool:
    return "Event loop is closed" in text or any(p in text for p in FAILED_RESTORES)


def _unraisable_hook(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    def hook(unraisable: Any) -> None:
        if not _orbax_noise(str(unraisable.exc_value)):
            previous(unraisable)

    hook.lemur_filter = True  # type: ignore[attr-defined]
    return hook


class _AsyncioFilter(logging.Filter):
    """asyncio's "Future exception was never retrieved" of a failed restore's reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(p in record.getMessage() for p in FAILED_RESTORES)


def quiet_failed_restores() -> None:
    """Keep what a failed orbax restore leaves behind off stderr (see the docstring)."""
    if not getattr(sys.unraisablehook, "lemur_filter", False):
        sys.unraisablehook = _unraisable_hook(sys.unraisablehook)
    asyncio_logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _AsyncioFilter) for f in asyncio_logger.filters):
        asyncio_logger.addFilter(_AsyncioFilter())


def hub_offline() -> None:
    """`HF_HUB_OFFLINE=1` unless the environment says otherwise."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


CONSOLE_FORMAT = "{level}: {message}"


def quiet_console() -> None:
    """loguru's handlers replaced by one: warnings and errors to stderr as `LEVEL: message`."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING", format=CONSOLE_FORMAT, colorize=False)


def quiet_datatrove() -> None:
    """`quiet_console()`, after datatrove's own console handler (see the docstring)."""
    # datatrove installs its verbose stderr handler when its logging module is first
    # imported: import it now, so that a later import cannot undo this.
    import datatrove.utils.logging  # noqa: F401

    quiet_console()


# What marks an attached accelerator: Google's PCI vendor id on a TPU VM (the test JAX's
# `hardware_utils` makes; read here without importing JAX), NVIDIA's device files.
GOOGLE_PCI_VENDOR = "0x1ae0"
NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")


def accelerator_attached(pci_root: str = "/sys/bus/pci/devices") -> bool:
    """Whether a TPU (Google PCI vendor id) or an NVIDIA/AMD GPU is attached to this host."""
    for vendor_file in glob.glob(os.path.join(pci_root, "*", "vendor")):
        try:
            with open(vendor_file) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return any(os.path.exists(p) for p in NVIDIA_DEVICE_FILES) or os.path.exists("/dev/kfd")


def cpu_where_no_accelerator() -> None:
    """`JAX_PLATFORMS=cpu` where libtpu is installed but no accelerator is attached."""
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return
    if accelerator_attached():
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # imported already: its config read the environment then
        sys.modules["jax"].config.update("jax_platforms", "cpu")


COMMANDS: dict[str, tuple[Callable[[], None], ...]] = {
    "lemur-data": (hub_offline, quiet_datatrove),
    "lemur-train": (cpu_where_no_accelerator, quiet_failed_restores),
    "lemur-eval": (cpu_where_no_accelerator,),
    "lemur-convert": (cpu_where_no_accelerator, quiet_failed_restores),
}


def install(command: str) -> None:
    """Make the process-wide changes of `command` (a key of COMMANDS); idempotent."""
    for change in COMMANDS[command]:
        change()
