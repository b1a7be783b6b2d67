"""The import graph of a repository's files and DeepSeek-Coder's order over it.

Edges come from what each file names of the others: Python `import` / `from ... import`
(absolute names matched to the repository's modules, `src/`-style layouts included, and
relative imports), C and C++ `#include` (quoted names beside the file or anywhere in the
repository, angle-bracket names only where a repository file ends with them), and
JavaScript / TypeScript `import ... from`, `export ... from`, `import()` and `require()` of
relative specifiers ('./x', '../y', with the usual extensions and `index` files). Imports of
anything outside the repository are not edges.

The order is DeepSeek-Coder's (arXiv:2401.14196, Algorithm 1): an edge from each file to the
files that import it; in each weakly connected part of the graph, repeatedly take the file
with the fewest dependencies not yet placed (in-degree), so that a cycle is broken at the
file with the fewest unmet imports instead of stopping the sort. DeepSeek takes one of the
files tied on in-degree at random; we take the first by path, so the order is a function of
the repository alone. Parts are placed in the order of their first file by path.
"""

from __future__ import annotations

import ast
import heapq
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping

PYTHON = (".py", ".pyi")
C_FAMILY = (".c", ".h", ".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".inl")
JS_FAMILY = (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts")
# What a relative JS/TS specifier may leave out, tried in this order.
JS_RESOLVE = (
    "",
    ".ts",
    ".tsx",
    ".d.ts",
    ".js",
    ".jsx",
    ".mjs",
    ".cjs",
    ".mts",
    ".cts",
    "/index.ts",
    "/index.tsx",
    "/index.js",
    "/index.jsx",
    "/index.mjs",
)

_PY_IMPORT = re.compile(r"^\s*import\s+([\w.]+(?:\s*,\s*[\w.]+)*)", re.M)
_PY_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\(?\s*([\w\s,*]+)", re.M)
_C_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"\n]+)[>"]', re.M)
_JS_SPEC = re.compile(
    r"""(?:\bfrom\s*|\bimport\s*\(?\s*|\brequire\s*\(\s*)(['"])(\.{1,2}/[^'"\n]*)\1""",
    re.M,
)


def _python_module(path: str) -> str | None:
    """The dotted module a Python file defines ('a/b/__init__.py' -> 'a.b'), None if not one."""
    stem, ext = posixpath.splitext(path)
    if ext not in PYTHON:
        return None
    parts = stem.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not parts[-1].isidentifier():
        return None
    # Folders above the last one that is no identifier ('my-repo/', 'src-2/') are no package.
    while not all(p.isidentifier() for p in parts):
        parts = parts[1:]
    return ".".join(parts)


def _python_names(text: str) -> list[tuple[int, str, list[str]]]:
    """(relative level, module, imported names) of each import statement of a Python file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _python_names_by_pattern(text)
    out: list[tuple[int, str, list[str]]] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            out.extend((0, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", [a.name for a in node.names]))
    return out


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of a body and of the bodies inside it (an import is a statement:
    skipping the expressions makes this several times faster than `ast.walk`)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, name, None)
            if isinstance(inner, list):
                stack.extend(reversed([n for n in inner if isinstance(n, ast.AST)]))


def _python_names_by_pattern(text: str) -> list[tuple[int, str, list[str]]]:
    """`_python_names` of a file `ast` cannot parse (Python 2, a syntax error): by lines."""
    out: list[tuple[int, str, list[str]]] = []
    for m in _PY_IMPORT.finditer(text):
        out.extend((0, name.strip(), []) for name in m.group(1).split(","))
    for m in _PY_FROM.finditer(text):
        names = [n.strip() for n in m.group(3).replace("\n", ",").split(",") if n.strip()]
        out.append((len(m.group(1)), m.group(2), [n.split()[0] for n in names]))
    return out


class _PythonModules:
    """The repository's Python modules by dotted name, and by every dotted suffix of it (a
    `src/pkg/mod.py` is imported as `pkg.mod`)."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.exact: dict[str, str] = {}
        self.suffix: dict[str, str] = {}
        for path in sorted(paths, key=lambda p: (p.count("/"), p)):  # shallowest wins
            module = _python_module(path)
            if module is None:
                continue
            self.exact.setdefault(module, path)
            parts = module.split(".")
            for i in range(1, len(parts)):
                self.suffix.setdefault(".".join(parts[i:]), path)

    def find(self, dotted: str) -> str | None:
        """The file of module `dotted`, or None."""
        return self.exact.get(dotted) or self.suffix.get(dotted)

    def targets(self, path: str, level: int, module: str, names: list[str]) -> set[str]:
        """Files one import statement of `path` names: the module, or its named submodules."""
        if level:
            package = _python_module(path) or ""
            base = package.split(".") if package else []
            # A module's package is its parent; an __init__'s is itself.
            keep = len(base) - level + (1 if path.endswith(("__init__.py", "__init__.pyi")) else 0)
            if keep < 0:
                return set()
            prefix = ".".join(base[:keep])
            module = ".".join(p for p in (prefix, module) if p)
            lookup = self.exact.get
        else:
            lookup = self.find
        found = set()
        for name in names:
            sub = lookup(f"{module}.{name}" if module else name)
            if sub is not None:
                found.add(sub)
        if module and (not found or len(found) < len(names)):
            whole = lookup(module)
            if whole is not None:
                found.add(whole)
        return found


def _c_tails(paths: Iterable[str]) -> dict[str, str]:
    """Each trailing run of path components of the repository's C/C++ files ('b.h', 'a/b.h'
    of 'src/a/b.h') -> the shallowest file ending so (then the first by path): what an
    include of that name finds. One lookup per include, however many files share a name
    (scanning them per include was quadratic: 1,000 same-named headers took 32 s)."""
    tails: dict[str, str] = {}
    for p in sorted((p for p in paths if p.endswith(C_FAMILY)), key=lambda p: (p.count("/"), p)):
        parts = p.split("/")
        for i in range(len(parts)):
            tails.setdefault("/".join(parts[i:]), p)
    return tails


def _c_targets(path: str, text: str, paths: set[str], tails: Mapping[str, str]) -> set[str]:
    """Repository files a C/C++ file `#include`s (`tails`: `_c_tails` of the repository)."""
    found = set()
    for m in _C_INCLUDE.finditer(text):
        quoted, name = m.group(1) == '"', m.group(2).strip()
        if quoted:
            beside = posixpath.normpath(posixpath.join(posixpath.dirname(path), name))
            if beside in paths:
                found.add(beside)
                continue
        match = tails.get(posixpath.normpath(name))
        if match is not None:
            found.add(match)
    return found


def _js_targets(path: str, text: str, paths: set[str]) -> set[str]:
    """Repository files a JavaScript/TypeScript file imports by relative specifier."""
    found = set()
    for m in _JS_SPEC.finditer(text):
        base = posixpath.normpath(posixpath.join(posixpath.dirname(path), m.group(2)))
        for ending in JS_RESOLVE:
            if base + ending in paths:
                found.add(base + ending)
                break
    return found


def dependencies(files: Mapping[str, str]) -> dict[str, set[str]]:
    """For each file (path -> text) of one repository, the files of it that it imports."""
    paths = set(files)
    modules = _PythonModules(paths)
    tails = _c_tails(paths)
    deps: dict[str, set[str]] = {}
    for path, text in files.items():
        found: set[str] = set()
        if path.endswith(PYTHON):
            for level, module, names in _python_names(text):
                found |= modules.targets(path, level, module, names)
        elif path.endswith(C_FAMILY):
            found = _c_targets(path, text, paths, tails)
        elif path.endswith(JS_FAMILY):
            found = _js_targets(path, text, paths)
        found.discard(path)
        deps[path] = found
    return deps


def _components(nodes: list[str], deps: Mapping[str, set[str]]) -> list[list[str]]:
    """Weakly connected parts of the graph, each in path order, by their first path."""
    parent = {n: n for n in nodes}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        for d in deps.get(n, ()):
            a, b = root(n), root(d)
            if a != b:
                parent[max(a, b)] = min(a, b)
    parts: dict[str, list[str]] = {}
    for n in sorted(nodes):
        parts.setdefault(root(n), []).append(n)
    return sorted(parts.values(), key=lambda part: part[0])


def import_order(paths: Iterable[str], deps: Mapping[str, set[str]]) -> list[str]:
    """`paths` ordered so that a file comes after the files it imports where the graph allows;
    in a cycle, the file with the fewest unplaced imports first (DeepSeek-Coder's sort)."""
    nodes = sorted(set(paths))
    known = set(nodes)
    deps = {n: {d for d in deps.get(n, ()) if d in known and d != n} for n in nodes}
    dependents: dict[str, list[str]] = {n: [] for n in nodes}
    for n in nodes:
        for d in deps[n]:
            dependents[d].append(n)
    order: list[str] = []
    for part in _components(nodes, deps):
        rank = {n: i for i, n in enumerate(part)}
        indegree = {n: len(deps[n]) for n in part}
        heap = [(indegree[n], rank[n], n) for n in part]
        heapq.heapify(heap)
        placed: set[str] = set()
        while heap:
            deg, _, n = heapq.heappop(heap)
            if n in placed or deg != indegree[n]:
                continue  # placed already, or an entry from before a decrement
            placed.add(n)
            order.append(n)
            for m in dependents[n]:
                if m not in placed:
                    indegree[m] -= 1
                    heapq.heappush(heap, (indegree[m], rank[m], m))
    return order
