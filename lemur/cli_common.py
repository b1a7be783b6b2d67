"""What the four commands share: `--set KEY=VALUE`, `--debug`, one-line errors, exit codes.

Every command (`lemur-data`, `lemur-train`, `lemur-eval`, `lemur-convert`) runs the body
of its `main()` through `run_main`, which turns how it ended into an exit code:

- 0 done; 1 a failure the command reports in one line (`die(message, 1)`), e.g. a full
  disk (`writing`);
- 2 a user mistake (a bad argument, recipe, config, checkpoint or input file): one line
  `PROG: message` on stderr, no traceback; the command names which exception types are
  such mistakes, plus `UserError` (raised by library checks of what the user gave) and
  what `die` raises;
- 130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM): one line, after the code on
  the way out (`finally` blocks, context managers) has run;
- anything else is a bug: Python prints its traceback and the exit code is 1.

`--debug` (or the environment variable `LEMUR_DEBUG=1`) re-raises user mistakes too, so
their traceback shows. This module imports nothing of lemur: every package may use it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_SIGINT = 130  # 128 + the signal number, as a shell reports a process the signal killed
EXIT_SIGTERM = 143
DEBUG_ENV = "LEMUR_DEBUG"


class UserError(ValueError):
    """A mistake in what the user gave (an argument, a file, a setting): a command reports
    it in one line and exits 2. A ValueError, so that library callers catching ValueError
    still catch it."""


class CommandError(Exception):
    """What `die` raises: a one-line message and the exit code (2 a mistake, 1 a failure)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that the code on the way out runs
    (temporary files removed, partial outputs deleted), then the command exits 143. A
    BaseException, so that `except Exception` blocks do not swallow it."""


def die(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """End the command: `run_main` prints `PROG: message` and exits with `code` (with
    `--debug` the traceback shows instead)."""
    raise CommandError(message, code)


def add_set_option(parser: argparse.ArgumentParser, example: str) -> None:
    """The `--set KEY=VALUE` option (repeatable; a dotted key, a YAML value)."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a key (dotted path, value as YAML), e.g. {example}",
    )


def parse_set(item: str) -> tuple[list[str], Any]:
    """The dotted key and the YAML value of one `--set KEY=VALUE` (UserError if malformed);
    a value YAML cannot read is taken as the string it is."""
    import yaml  # here: lemur-train arms its Ctrl-C handling before any slow import

    dotted, sep, text = item.partition("=")
    if not sep or not dotted.strip():
        raise UserError(f"--set {item!r}: expected KEY=VALUE")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    return dotted.strip().split("."), value


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes are one line, `PROG: message`, and exit 2
    (the usage is one `--help` away); its subcommands' parsers are of this class too. An
    unknown option is reported by the subcommand it was given to (`lemur-data build: ...
    (see lemur-data build --help)`), not by the top parser, which argparse would use."""

    def error(self, message: str) -> NoReturn:
        """Report a usage mistake in one line and exit 2."""
        _say(f"{self.prog}: {message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, noting the innermost parser that parsed (a subcommand's parser runs
        first and its namespace is copied into its parent's)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if not hasattr(parsed, _PARSED_BY):
            setattr(parsed, _PARSED_BY, self)
        return parsed, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, with unknown arguments reported by the subcommand given them."""
        parsed, extras = self.parse_known_args(args, namespace)
        chosen = getattr(parsed, _PARSED_BY, self)
        delattr(parsed, _PARSED_BY)
        if extras:
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


_PARSED_BY = "lemur_parsed_by"  # the namespace attribute naming the innermost parser


def positive_int(text: str) -> int:
    """An argparse `type`: an integer >= 1 (an option left out keeps its default instead:
    0 never stands for "all" or "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse `type`: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_debug_option(parser: argparse.ArgumentParser) -> None:
    """`--debug`: show the traceback of an error instead of one line. Add it to the top
    parser and to each subcommand's: it is read from either place."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # a subcommand's default must not reset the top's value
        help=f"show the traceback of an error instead of one line (also {DEBUG_ENV}=1)",
    )


def debug_wanted(args: argparse.Namespace | None = None) -> bool:
    """Whether `--debug` was given or LEMUR_DEBUG is set (to anything but empty or 0)."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def one_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    text = str(error)
    return text.splitlines()[0] if text.strip() else type(error).__name__


def run_main(
    body: Callable[[], int | None],
    prog: str,
    user_errors: Sequence[type[BaseException]] = (),
    *,
    debug: bool = False,
    label: str = "",
    interrupted: str = "interrupted",
    exit_on_error: bool = False,
) -> int:
    """Run a command's body and return its exit code (see the module's docstring).

    `user_errors`: the command's own exception types that are user mistakes (exit 2, one
    line `{prog}: {label}{message}`). `interrupted`: the line on Ctrl-C. `exit_on_error`:
    raise SystemExit(code) for an error instead of returning the code (as argparse does).
    """
    expected = (CommandError, UserError, *user_errors)
    try:
        with _sigterm_raises():
            return int(body() or 0)
    except expected as e:
        if debug:  # the error as raised: a `user_input` one is the cause of its UserError
            if isinstance(e, UserError) and isinstance(e.__cause__, Exception):
                raise e.__cause__ from None
            raise
        # die()'s message is the command's own; another error's first line is its gist.
        code, message = (
            (e.code, str(e)) if isinstance(e, CommandError) else (EXIT_USAGE, one_line(e))
        )
        _say(f"{prog}: {label}{message}")
        if exit_on_error:
            raise SystemExit(code) from None
        return code
    except KeyboardInterrupt:
        _say(f"{prog}: {interrupted}")
        return EXIT_SIGINT
    except Terminated:
        _say(f"{prog}: terminated (SIGTERM)")
        return EXIT_SIGTERM


@contextlib.contextmanager
def user_input(*kinds: type[Exception]) -> Iterator[None]:
    """Errors of `kinds` raised inside are the user's mistakes (a setting taken from the
    arguments, a file they named): one line, exit 2. Only around calls whose errors of
    those kinds mean that, so that a bug elsewhere still shows its traceback."""
    try:
        yield
    except kinds as e:
        raise UserError(one_line(e)) from e


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """An output the user named that cannot be written: one line naming it, exit 2; a full
    disk (or quota) is no mistake of theirs: one line naming the output, exit 1."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            full = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
            die(f"{path}: {full}", 1)
        die(f"{e.filename or path}: {e.strerror or e}")


@contextlib.contextmanager
def exit_at_once_on_signals(prog: str, interrupted: str = "interrupted") -> Iterator[None]:
    """While inside (a command's slow imports: nothing written yet, nothing to clean up),
    SIGTERM or Ctrl-C ends the process at once with run_main's one line and 143 or 130.
    Raising from a signal handler inside an import would not do: a C extension being
    initialised (numpy's) turns the exception into an ImportError, a traceback and exit 1.
    The handlers found are put back afterwards (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        said = "terminated (SIGTERM)" if signum == signal.SIGTERM else interrupted
        _say(f"{prog}: {said}")
        os._exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)

    before = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def _say(line: str) -> None:
    """One line on stderr, flushed (stdout first, so that the order on a terminal holds)."""
    with contextlib.suppress(Exception):  # a closed or broken stream must not hide the code
        sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the body runs, SIGTERM raises `Terminated` in the main thread (where Python
    left SIGTERM at its default; a handler someone else set is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    pid = os.getpid()

    def handler(signum: int, _frame: Any) -> None:
        if os.getpid() != pid:  # a forked worker inherited this handler: die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
