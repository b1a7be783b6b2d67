"""The package's layout rules, read from the source with `ast` (nothing is imported).

Layers import only downward (DESIGN.md, Layout; README, Layout), lowest first:

    lemur/*.py basics (typed_yaml, process_guard, chatml, ...)
    -> shards -> tokenizer -> chat_template
    -> model | data          (neither imports the other)
    -> train | eval          (neither imports the other; both may import model and data)
    -> commands: each package's cli.py, eval's agent_cli.py, model/convert.py

A module may import its own package (except a command), any lower layer, and nothing
beside or above it, at module level or inside a function alike. What two packages share
moves below both. And every module stays small: at most 400 lines, every function at
most 60.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lemur"

# Rank of each sub-package; packages of the same rank may not import each other.
RANKS = {
    "shards": 1,
    "tokenizer": 2,
    "chat_template": 3,
    "model": 4,
    "data": 4,
    "train": 5,
    "eval": 5,
}
BASICS_RANK = 0  # the modules directly in lemur/
COMMANDS = {
    "lemur.data.cli",
    "lemur.train.cli",
    "lemur.eval.cli",
    "lemur.eval.agent_cli",
    "lemur.model.convert",
}
COMMAND_RANK = 6
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    """The dotted name of a source file of the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether `name` is a module or package of lemur (a file or a folder)."""
    base = ROOT.joinpath(*name.split("."))
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


def imported(tree: ast.Module, importer: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every lemur module `tree` imports, anywhere in the file."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "lemur"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                anchor = importer.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "lemur":
                continue
            for alias in node.names:
                # `from lemur.train import step` imports the module lemur.train.step.
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else base))
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


def test_modules_and_functions_stay_small() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            problems.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})")
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
    assert violation("lemur.model.convert", "lemur.eval.load") is None
    assert violation("lemur.shards.check", "lemur.tokenizer") == "upward"
    assert violation("lemur.eval.generate", "lemur.eval.cli") == "a command"
