"""The package's layout rules, read from the source with `ast` (nothing is imported).

Layers import only downward (README, Layout), lowest first:

    lemur/*.py basics (typed_yaml, process_guard, chatml, machine, ...)
    -> shards -> tokenizer -> chat_template
    -> model | data          (neither imports the other)
    -> train | eval          (neither imports the other; both may import model and data)
    -> commands: each package's cli.py, eval's agent_cli.py; convert/ (lemur-convert) whole

A module may import its own package (except a command), any lower layer, and nothing
beside or above it; inside lemur/data, its parts (sub-packages, top-level modules) are
floors the same way (DATA_FLOORS); at module level or inside a function alike. What two
packages share moves below both. Inside a package, no two modules import each other, however indirectly:
the graph of every import (module level, in a function, under `if TYPE_CHECKING:`) has no
cycle, counting what Python runs: importing `lemur.a.b` runs `lemur/a/__init__.py` too (a
package's lazily loaded names excepted); a cycle means a shared thing lives in the wrong
home. No module uses another's private name (`from x import _y`, `x._y`), in lemur, tools/
and tests/ alike. Functions stay short (at most 60 lines); a module's length is a
guideline, not a rule: a module does one job, however long (README, Layout).

The cycles and private names known when these checks came (issue #35) are listed below,
each with the issue item that removes it. The lists can only shrink: a new cycle or
private use fails, and so does an entry that no longer exists (delete it then).
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lemur"

# Rank of each sub-package; packages of the same rank may not import each other.
RANKS = {
    "shards": 1,
    "tokenizer": 2,
    "chat_template": 3,
    "export": 3,  # other trainers' formats: below data, whose build exports last
    "model": 4,
    "data": 4,
    "train": 5,
    "eval": 5,
    "convert": 6,  # lemur-convert's package: a command, nothing else (COMMAND_RANK)
}
BASICS_RANK = 0  # the modules directly in lemur/
COMMANDS = {
    "lemur.data.cli",
    "lemur.train.cli",
    "lemur.eval.cli",
    "lemur.eval.agent_cli",
    "lemur.convert.cli",
}
COMMAND_RANK = 6
MAX_FUNCTION_LINES = 60
# The files of the private-name rule: the package, its tools and its tests.
CHECKED_FOLDERS = ("lemur", "tools", "tests")

# Import cycles found when the cycle check came (issue #35), each broken by leaving out one
# edge (importer, imported): the one that points the wrong way. Delete an entry once its
# edge is gone or closes no cycle any more (the test says so); never add one.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}

# Private names used across modules when the check came (issue #35), as (file, module._name).
# Each goes when its name becomes public or its user stops needing it; never add one.
KNOWN_PRIVATE_USES: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package (or of tools/, tests/)."""
    parts = (path.relative_to(ROOT) if path.is_absolute() else path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    """Whether `name` is a module or package of lemur (a file or a folder) under `root`."""
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def place(name: str) -> tuple[str, int]:
    """(package, rank) of a lemur module: its sub-package, or `lemur` for the basics."""
    if name in COMMANDS:
        return name.split(".")[1], COMMAND_RANK
    parts = name.split(".")
    if len(parts) == 1 or not (PACKAGE / parts[1]).is_dir():
        return "lemur", BASICS_RANK
    assert parts[1] in RANKS, f"{name}: package lemur.{parts[1]} has no layer in RANKS"
    return parts[1], RANKS[parts[1]]


def lazy_exports(package: str, root: Path = ROOT) -> dict[str, str]:
    """A package's lazily exported names (`_EXPORTS` of its `__init__.py`): name -> submodule."""
    init = root.joinpath(*package.split("."), "__init__.py")
    if not init.is_file():
        return {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return {}


def import_base(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module name a `from ... import` reads from (relative ones resolved)."""
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        anchor = importer.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imported(
    tree: ast.Module, importer: str, is_package: bool, root: Path = ROOT
) -> list[tuple[int, str]]:
    """(line, module) of every lemur module `tree` imports, anywhere in the file (the modules
    looked up under `root`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "lemur"]
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, importer, is_package)
            if base.split(".")[0] != "lemur":
                continue
            for alias in node.names:
                # `from lemur.train import step` imports the module lemur.train.step, and
                # `from lemur.data.run import make_executor` (a lazy export) its home module.
                sub = f"{base}.{alias.name}"
                if not is_module(sub, root) and alias.name in (lazy := lazy_exports(base, root)):
                    sub = f"{base}.{lazy[alias.name]}"
                found.append((node.lineno, sub if is_module(sub, root) else base))
    return found


def violation(importer: str, target: str) -> str | None:
    """Why `importer` may not import `target` (None when it may)."""
    (own, rank), (other, other_rank) = place(importer), place(target)
    if target in COMMANDS and own != other:
        return "a command of another package"
    if target in COMMANDS and importer not in COMMANDS:
        return "a command"
    if own == other or other_rank < rank:
        return None
    return "sideways" if other_rank == rank else "upward"


def test_layers_import_only_downward() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target in imported(tree, name, path.name == "__init__.py"):
            why = violation(name, target)
            if why is not None:
                where = f"{path.relative_to(ROOT)}:{line}"
                problems.append(
                    f"{where}: {name} ({place(name)[0]}) imports {target} "
                    f"({place(target)[0]}): {why}"
                )
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_functions_stay_short() -> None:
    """Every function at most 60 lines (a module's length is a guideline: the docstring)."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{rel}:{node.lineno}: {node.name} has {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    assert not problems, "\n".join(problems)


def test_the_rules_see_an_upward_import() -> None:
    """The checker itself: a function-level import of train from eval is found."""
    tree = ast.parse("def f():\n    from lemur.train import step\n")
    found = imported(tree, "lemur.eval.bpb", False)
    assert found == [(2, "lemur.train.step")]
    assert violation("lemur.eval.bpb", "lemur.train.step") == "sideways"
    assert violation("lemur.convert.cli", "lemur.eval.load") is None
    assert violation("lemur.model.hf", "lemur.eval.load") == "upward"
    assert violation("lemur.shards.check", "lemur.tokenizer") == "upward"
    assert violation("lemur.eval.generate", "lemur.eval.cli") == "a command"


# ------------------------------------------------------------------------------ import cycles

Graph = dict[str, dict[str, str]]  # importer -> imported -> "file:line" of the first import


def import_graph(package: Path = PACKAGE) -> Graph:
    """Every import between the modules under `package` (a module's imports of itself left
    out), as Python runs them: importing `lemur.a.b` runs `lemur/a/__init__.py` too."""
    graph: Graph = {}
    for path in sorted(package.rglob("*.py")):
        name = module_name(path.relative_to(package.parent))
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = graph.setdefault(name, {})
        where = path.relative_to(package.parent)
        for line, target in imported(tree, name, path.name == "__init__.py", package.parent):
            if target != name:
                edges.setdefault(target, f"{where}:{line}")
            for parent in packages_run(name, target):
                edges.setdefault(parent, f"{where}:{line} (for {target})")
    return graph


def packages_run(importer: str, target: str) -> list[str]:
    """The packages whose `__init__.py` importing `target` runs on `importer`'s behalf: each
    parent package of `target`, but those of `importer` itself (they ran before it did)."""
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    own = importer.split(".")
    ran = {".".join(own[:i]) for i in range(1, len(own) + 1)}
    return [p for p in parents if p not in ran]


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The graph's strongly connected components of two modules or more (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def a_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module: [a, b, ..., a]."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, {})):
            if nxt == start:
                return paths[node] + [start]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start} in {component}")


def describe_cycle(graph: Graph, cycle: list[str]) -> str:
    """`a -> b -> a`, then where each edge is imported."""
    lines = [" -> ".join(cycle)]
    lines += [f"    {graph[a][b]}: {a} imports {b}" for a, b in pairwise(cycle)]
    return "\n".join(lines)


def cycle_problems(graph: Graph, known: dict[tuple[str, str], str]) -> list[str]:
    """Cycles left once the known edges are cut, and known edges that close no cycle now."""
    cut = {a: {b: w for b, w in edges.items() if (a, b) not in known} for a, edges in graph.items()}
    problems = [
        "import cycle:\n" + describe_cycle(graph, a_cycle(cut, c)) for c in strongly_connected(cut)
    ]
    together = {m: i for i, c in enumerate(strongly_connected(graph)) for m in c}
    for a, b in sorted(known):
        if b not in graph.get(a, {}):
            problems.append(f"KNOWN_CYCLE_EDGES: {a} no longer imports {b}: delete the entry")
        elif a not in together or together.get(b) != together[a]:
            problems.append(f"KNOWN_CYCLE_EDGES: {a} -> {b} closes no cycle now: delete it")
    return problems


def test_no_import_cycles() -> None:
    """No cycle among lemur's modules but the known ones, which only go (module docstring)."""
    problems = cycle_problems(import_graph(), KNOWN_CYCLE_EDGES)
    assert not problems, "\n".join(problems)


def test_the_cycle_check_sees_a_planted_cycle() -> None:
    """The checker itself: a cycle of three is reported as a path with each edge's place,
    and a known edge that closes no cycle any more is reported too."""
    graph = {
        "lemur.a": {"lemur.b": "lemur/a.py:3"},
        "lemur.b": {"lemur.c": "lemur/b.py:4", "lemur.d": "lemur/b.py:5"},
        "lemur.c": {"lemur.a": "lemur/c.py:9"},
        "lemur.d": {},
    }
    assert cycle_problems(graph, {}) == [
        "import cycle:\nlemur.a -> lemur.b -> lemur.c -> lemur.a\n"
        "    lemur/a.py:3: lemur.a imports lemur.b\n"
        "    lemur/b.py:4: lemur.b imports lemur.c\n"
        "    lemur/c.py:9: lemur.c imports lemur.a"
    ]
    assert cycle_problems(graph, {("lemur.c", "lemur.a"): ""}) == []
    assert cycle_problems(graph, {("lemur.c", "lemur.a"): "", ("lemur.b", "lemur.d"): ""}) == [
        "KNOWN_CYCLE_EDGES: lemur.b -> lemur.d closes no cycle now: delete it"
    ]
    assert cycle_problems(graph, {("lemur.d", "lemur.a"): ""})[1:] == [
        "KNOWN_CYCLE_EDGES: lemur.d no longer imports lemur.a: delete the entry"
    ]


def test_the_cycle_check_sees_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    """The checker itself: importing `lemur.data.pack.mix` runs `lemur/data/pack/__init__.py`,
    so an `__init__` that imports a module which imports the importer closes a cycle (found
    on main: corpus -> pack.mix ran pack/__init__, which imported plan, which imports corpus);
    an `__init__` whose names load lazily, and a module's own packages, close none."""
    files = {
        "lemur/__init__.py": "",
        "lemur/lazy_exports.py": "",
        "lemur/data/__init__.py": "",
        "lemur/data/corpus.py": "from lemur.data.pack.mix import mix_units\n",
        "lemur/data/pack/__init__.py": '"""Packing."""\nfrom lemur.data.pack.plan import plan\n',
        "lemur/data/pack/mix.py": "def mix_units(): pass\n",
        "lemur/data/pack/plan.py": "from lemur.data.corpus import corpus_of\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path / "lemur")
    assert graph["lemur.data.pack.plan"] == {"lemur.data.corpus": "lemur/data/pack/plan.py:1"}
    assert cycle_problems(graph, {}) == [
        "import cycle:\nlemur.data.corpus -> lemur.data.pack -> lemur.data.pack.plan"
        " -> lemur.data.corpus\n"
        "    lemur/data/corpus.py:1 (for lemur.data.pack.mix):"
        " lemur.data.corpus imports lemur.data.pack\n"
        "    lemur/data/pack/__init__.py:2: lemur.data.pack imports lemur.data.pack.plan\n"
        "    lemur/data/pack/plan.py:1: lemur.data.pack.plan imports lemur.data.corpus"
    ]
    (tmp_path / "lemur/data/pack/__init__.py").write_text(
        "from lemur.lazy_exports import lazy_exports\n"
        '_EXPORTS = {"plan": "plan"}\n'
        "__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)\n"
    )
    assert cycle_problems(import_graph(tmp_path / "lemur"), {}) == []


def test_the_graph_sees_every_kind_of_import() -> None:
    """Imports in functions, under TYPE_CHECKING, relative ones and lazy exports are edges."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from lemur.data.recipe import Recipe\n"
        "def f():\n"
        "    from . import stage\n"
        "from lemur.data.run import make_executor\n"
    )
    found = imported(ast.parse(source), "lemur.data.run.lock", False)
    assert found == [
        (6, "lemur.data.run.executors"),
        (3, "lemur.data.recipe"),
        (5, "lemur.data.run.stage"),
    ]


# ------------------------------------------------------------------------------ private names


def private_uses(tree: ast.Module, user: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module._name) of every private name of another lemur module `tree` uses:
    `from lemur.x import _y`, and `x._y` where `x` names an imported lemur module."""
    found: list[tuple[int, str]] = []
    modules: dict[str, str] = {}  # local name -> the lemur module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "lemur":
                    modules[a.asname or "lemur"] = a.name if a.asname else "lemur"
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, user, is_package)
            if base.split(".")[0] != "lemur":
                continue
            for a in node.names:
                if is_module(f"{base}.{a.name}"):
                    modules[a.asname or a.name] = f"{base}.{a.name}"
                elif is_private(a.name) and base != user:
                    found.append((node.lineno, f"{base}.{a.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = dotted(node.value, modules)
            if owner is not None and owner != user and is_module(owner):
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(set(found))


def is_private(name: str) -> bool:
    """`_name`, not `__dunder__`."""
    return name.startswith("_") and not name.startswith("__")


def dotted(node: ast.expr, modules: dict[str, str]) -> str | None:
    """The lemur module an expression such as `cli` or `lemur.eval.cli` names, else None."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute) and (owner := dotted(node.value, modules)):
        return f"{owner}.{node.attr}"
    return None


def private_problems(sources: dict[str, str], known: dict[tuple[str, str], str]) -> list[str]:
    """Private names used across modules but the known ones, and known ones not used now;
    `sources` maps each file (relative to the repository) to its text."""
    problems, seen = [], set()
    for rel, text in sources.items():
        tree = ast.parse(text, filename=rel)
        path = Path(rel)
        for line, name in private_uses(tree, module_name(path), path.name == "__init__.py"):
            seen.add((rel, name))
            if (rel, name) not in known:
                problems.append(f"{rel}:{line}: uses {name}, private to its module")
    problems += [
        f"KNOWN_PRIVATE_USES: {rel} no longer uses {name}: delete the entry"
        for rel, name in sorted(set(known) - seen)
    ]
    return problems


def test_no_private_names_across_modules() -> None:
    """No module of lemur, tools/ or tests/ uses another's private name (but the known ones)."""
    files = sorted(p for folder in CHECKED_FOLDERS for p in (ROOT / folder).rglob("*.py"))
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    problems = private_problems(sources, KNOWN_PRIVATE_USES)
    assert not problems, "\n".join(problems)


def test_the_private_check_sees_a_planted_use() -> None:
    """The checker itself: both spellings of a private use are found, a module's own private
    names and dunders are not, and a known use that went is reported."""
    source = (
        "import lemur.data.run.stage as stage_lib\n"
        "from lemur.data.run import executors\n"
        "from lemur.train.loader import _derived_seed, __doc__\n"
        "executors._run_rank(1)\n"
        "stage_lib._FULL\n"
        "lemur_private = executors.make_executor\n"
    )
    found = private_uses(ast.parse(source), "tests.test_x", False)
    assert found == [
        (3, "lemur.train.loader._derived_seed"),
        (4, "lemur.data.run.executors._run_rank"),
        (5, "lemur.data.run.stage._FULL"),
    ]
    own = "def _f(): pass\nfrom lemur.train.loader import _derived_seed\n"
    assert private_uses(ast.parse(own), "lemur.train.loader", False) == []
    problems = private_problems({"tools/x.py": source}, {("tools/gone.py", "lemur.x._y"): ""})
    assert problems == [
        "tools/x.py:3: uses lemur.train.loader._derived_seed, private to its module",
        "tools/x.py:4: uses lemur.data.run.executors._run_rank, private to its module",
        "tools/x.py:5: uses lemur.data.run.stage._FULL, private to its module",
        "KNOWN_PRIVATE_USES: tools/gone.py no longer uses lemur.x._y: delete the entry",
    ]


# lemur/data's parts (its sub-packages and top-level modules), lowest floor first: a part
# imports its own modules and parts of lower floors only, never one beside or above it.
DATA_FLOORS: tuple[tuple[str, ...], ...] = (
    ("work", "labels"),  # folder names, stat labels
    ("samples",),  # the build's samples: format, per-task collectors, merge
    ("recipe",),  # every section of the recipe, and the Recipe
    ("run",),  # executors and their tasks
    ("runs",),  # the run between stages: token runs, records, removals
    ("dedup", "read", "fim"),
    ("filter",),
    ("mix",),  # the mix planner's arithmetic
    ("corpus",),  # every way a chat build differs, asked by the stages
    ("pack",),
    ("encode",),  # the build's tokenizer, made ready; documents into token runs
    ("context",),  # BuildContext: made once per build, handed to the stages above
    ("repos",),
    ("recipe_loader",),  # a recipe read from YAML: presets, overrides, checks that ask the stages
    ("counts", "budget", "classifier_stage", "sample_stage"),
    ("stages",),  # the build's stages, one module each, over the one context
    ("build", "demo", "chat_demo", "stats"),
    ("inspect",),  # the inspect page: reads a finished build through stats
    ("cli",),
)
# lemur/data's upward imports left when the floors came (issue #45), (importer part,
# imported part) -> why it is still there; never add one, delete one once it is gone.
KNOWN_DATA_UPWARD: dict[tuple[str, str], str] = {}


def data_part(module: str) -> str | None:
    """The part of lemur/data a module belongs to (None outside lemur/data or its init)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["lemur", "data"] and len(parts) > 2 else None


def data_floor_problems(
    graph: Graph, floors: tuple[tuple[str, ...], ...], known: dict[tuple[str, str], str]
) -> list[str]:
    """Each import between lemur/data's parts that does not run down a floor (one line,
    with its place), a part no floor names, and each known entry no import needs."""
    floor = {part: i for i, parts in enumerate(floors) for part in parts}
    problems, seen = [], set()
    for importer, targets in sorted(graph.items()):
        above = data_part(importer)
        if above is None:
            continue
        if above not in floor:
            problems.append(f"DATA_FLOORS: lemur.data.{above} is on no floor: add it")
            floor[above] = len(floors)
        for target, where in sorted(targets.items()):
            below = data_part(target)
            if below is None or below == above:
                continue
            if floor.get(below, len(floors)) < floor[above]:
                continue
            seen.add((above, below))
            if (above, below) not in known:
                problems.append(f"{where}: {importer} imports {target}, not below it in lemur/data")
    problems += [
        f"KNOWN_DATA_UPWARD: {a} no longer imports {b}: delete the entry"
        for a, b in known
        if (a, b) not in seen
    ]
    return list(dict.fromkeys(problems))


def test_lemur_data_parts_import_only_downward() -> None:
    """No import between lemur/data's sub-packages and modules runs back up (DATA_FLOORS)."""
    problems = data_floor_problems(import_graph(), DATA_FLOORS, KNOWN_DATA_UPWARD)
    assert not problems, "\n".join(problems)


def test_the_data_floors_see_a_planted_upward_import() -> None:
    """The checker itself: an import of a higher floor's part, one beside it and a part on
    no floor are reported, a downward one is not, and a known entry that went is too."""
    graph = {
        "lemur.data.read.readers": {
            "lemur.data.repos.layout": "lemur/data/read/readers.py:41",
            "lemur.data.read.listing": "lemur/data/read/readers.py:35",
            "lemur.data.labels": "lemur/data/read/readers.py:28",
        },
        "lemur.data.dedup.stage": {"lemur.data.read": "lemur/data/dedup/stage.py:3"},
        "lemur.data.extra": {},
        "lemur.data": {"lemur.data.cli": "lemur/data/__init__.py:1"},
    }
    floors = (("labels",), ("dedup", "read"), ("repos",))
    assert data_floor_problems(graph, floors, {("pack", "corpus"): ""}) == [
        "lemur/data/dedup/stage.py:3: lemur.data.dedup.stage imports lemur.data.read,"
        " not below it in lemur/data",
        "DATA_FLOORS: lemur.data.extra is on no floor: add it",
        "lemur/data/read/readers.py:41: lemur.data.read.readers imports"
        " lemur.data.repos.layout, not below it in lemur/data",
        "KNOWN_DATA_UPWARD: pack no longer imports corpus: delete the entry",
    ]
