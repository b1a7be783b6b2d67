"""Count the lemur modules whose code runs on a command's path (the README's Layout figures).

Runs a command in this process under a profile hook (all threads) and lists every module
of the `lemur` package with at least one function called (importing it does not count),
in first-call order, with its line count. Libraries
(datatrove, jax, ...) are not counted. The build runs its stages on one in-process worker
(`executor.workers=1`) so that worker code is seen too.

    python tools/path_modules.py build --set output=/tmp/pm-demo     # the demo recipe
    python tools/path_modules.py train --set data.dirs=/tmp/pm-demo  # the demo model, 1 step

The training path is a run of one step (`steps=1`) from the CLI: setup, the optimizer
update, and the end-of-run eval and checkpoint the loop always makes.

A second figure, the spine, leaves out the modules that do one step's own work (a filter,
a reader of one format, a dedup algorithm, chat encoding; `LEAVES`), the lazy exports, and
the demo's data gathering: the modules a reader opens to follow a recipe to the shard
bytes. It is the rule that reproduces issue #27's "29 modules (~5.5k lines)" on the tree
the issue was filed against (4dcc95b: 29 modules, 5,560 lines).

A third figure, the trip (`--trip N`), walks the path as a reader follows it: every function
of the spine once, at its first call, in call order (its module is the room it stands in).
A stay is a run of such steps in one module; a return is a stay in a module the walk had
already left. It prints stays, rooms and returns over the first N steps and the whole walk,
from the command and from the path's driver on (`build()`, `train()`: issue #45 walks the
recipe from `build()`; fewer returns means a reader goes back less often to a module
already read).
Another checkout's figures, by the same rule: `PYTHONPATH=/tmp/before python tools/...`.
`--show` prints the trip from the driver, stay by stay (returns marked, each stay's first
functions), to see where a reader goes back.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import tempfile
import threading
from pathlib import Path

import lemur

ROOT = Path(lemur.__file__).resolve().parent

# Where issue #45's trip starts: the first call of the path's own driver.
START = {"build": ("lemur.data.build", "build"), "train": ("lemur.train.loop", "train")}

# Modules left out of the spine: one step's own work, not the way through the build.
LEAVES = re.compile(
    r"lemur\.data\.filter\..*"
    r"|lemur\.data\.read\.(readers|chat_reader|notebooks|compressed|streams|checkouts|chat)"
    r"|lemur\.data\.dedup\.(sketch|rows|merge|buckets|cluster|runs)"
    r"|lemur\.data\.(tokenize|encode)\.(chat|offsets|template_chat)"
    r"|lemur\.lazy_exports|lemur\.data\.demo"
)


def trace(run) -> tuple[list[str], list[tuple[str, str]]]:
    """Modules of `lemur` (dotted names) with code run by `run()`, in first-call order, and
    (module, function name) of each function of lemur at its first call, in call order (the
    trip).

    Code run while a module is imported does not count (a module body, the class bodies
    in it, the functions it calls at import time): only what the command itself calls.
    """
    seen: dict[str, None] = {}
    steps: dict[object, tuple[str, str]] = {}  # code object -> (file, name) at its first call
    local = threading.local()

    def hook(frame, event, arg) -> None:  # noqa: ANN001 - the profile hook's signature
        code = frame.f_code
        if code.co_name == "<module>":
            depth = getattr(local, "importing", 0)
            if event == "call":
                local.importing = depth + 1
            elif event == "return":
                local.importing = depth - 1
            return
        if event != "call" or getattr(local, "importing", 0):
            return
        if not code.co_flags & inspect.CO_OPTIMIZED:
            return  # a class body run by a `class` statement, not a function call
        path = code.co_filename
        if path.startswith(str(ROOT)):
            seen.setdefault(path, None)
            steps.setdefault(code, (path, code.co_name))

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        run()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return [_dotted(path) for path in seen], [(_dotted(p), name) for p, name in steps.values()]


def _dotted(path: str) -> str:
    """The dotted module name of a file of lemur."""
    rel = Path(path).relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def stays_of(walk: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """A walk's stays: its runs of (module, function) steps in one module."""
    stays: list[list[tuple[str, str]]] = []
    for step in walk:
        if stays and stays[-1][0][0] == step[0]:
            stays[-1].append(step)
        else:
            stays.append([step])
    return stays


def trip(walk: list[tuple[str, str]]) -> tuple[int, int, int]:
    """(stays, rooms, returns) of a walk: runs of steps in one module, the modules, and the
    stays in a module already left."""
    stays = [stay[0][0] for stay in stays_of(walk)]
    return len(stays), len(set(stays)), len(stays) - len(set(stays))


def _lines(name: str) -> int:
    """Lines of a module of lemur, by dotted name."""
    path = ROOT.parent.joinpath(*name.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return len(file.read_text().splitlines())


def main() -> int:
    """Run `build` or `train` traced and print the modules it ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=["build", "train"])
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument(
        "--trip", type=int, default=400, metavar="N", help="steps of the trip's first figure"
    )
    parser.add_argument(
        "--show", action="store_true", help="print the trip from the driver, stay by stay"
    )
    args = parser.parse_args()
    sets = [x for s in args.sets for x in ("--set", s)]
    if args.path == "build":
        from lemur.data.cli import main as cli

        argv = ["build", "--set", "executor.workers=1", *sets]
    else:
        from lemur.train.cli import main as cli

        run_dir = tempfile.mkdtemp(prefix="pm-train-")
        argv = ["demo", "--set", f"run_dir={run_dir}", "--set", "steps=1", *sets]
    names, steps = trace(lambda: cli(argv))
    lines = {n: _lines(n) for n in names}
    print(
        f"{len(names)} lemur modules ({sum(lines.values()):,} lines) run on the {args.path} path:"
    )
    for name in names:
        print(f"  {name} ({lines[name]})")
    spine = [n for n in names if not LEAVES.fullmatch(n)]
    print(f"spine: {len(spine)} modules ({sum(lines[n] for n in spine):,} lines)")
    walk = [(m, f) for m, f in steps if not LEAVES.fullmatch(m)]
    # Issue #45 walks the recipe from `build()`: the same walk without the command's own
    # steps before it (argument parsing, the recipe read and checked).
    start = next((i for i, s in enumerate(walk) if s == START[args.path]), None)
    if start is None:  # the driver was renamed or moved: say so, not the command's figures
        print(f"trip from {START[args.path][1]}(): {'.'.join(START[args.path])} never ran")
    origins = [("the command", walk)]
    origins += [] if start is None else [(START[args.path][1] + "()", walk[start:])]
    for origin, part in origins:
        for label, sub in (
            (f"first {args.trip} steps", part[: args.trip]),
            ("whole", part),
        ):
            stays, rooms, returns = trip(sub)
            print(f"trip from {origin}, {label}: {stays} stays, {rooms} rooms, {returns} returns")
    if args.show and start is not None:
        show(walk[start:], args.trip)
    return 0


def show(walk: list[tuple[str, str]], limit: int) -> None:
    """Print a walk stay by stay: `return` before a stay in a module already left, the
    stay's length in steps and its first functions; a line marks the first `limit` steps."""
    left: set[str] = set()
    taken = 0
    for stay in stays_of(walk):
        module = stay[0][0]
        if taken < limit <= taken + len(stay):
            print(f"  ---- step {limit} ----")
        names = " ".join(name for _, name in stay[:6]) + (" ..." if len(stay) > 6 else "")
        print(f"  {'return' if module in left else '      '} {module} ({len(stay)}): {names}")
        taken += len(stay)
        left.add(module)


if __name__ == "__main__":
    raise SystemExit(main())
