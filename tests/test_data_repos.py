"""Repository documents, the parts below the build: checkouts of a files tree, the import
graphs (Python, C/C++, JS/TS) and DeepSeek-Coder's order over them, the recipe's file orders,
and the split at file boundaries to a token budget (lemur/data/repos/)."""

from __future__ import annotations

import numpy as np
import pytest

from lemur.data.read.checkouts import checkout_fields
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.repos import ReposConfig
from lemur.data.repos.imports import dependencies, import_order
from lemur.data.repos.order import RepoFile, order_files
from lemur.data.repos.render import PLAIN_FILE, RepoFormat, join_text, split_repository

# A Python package with a cycle (views <-> helpers), relative and absolute imports, a test
# folder outside the package and a stdlib import that is no edge.
PYTHON_REPO = {
    "app/__init__.py": "",
    "app/db.py": "import sqlite3\n",
    "app/models.py": "from app import db\n\nclass User: ...\n",
    "app/views.py": "from .models import User\nfrom . import helpers\n\ndef show(): ...\n",
    "app/helpers.py": "from app.views import show\n",
    "app/main.py": "from app.models import User\nfrom .views import show\n",
    "tests/test_views.py": "import pytest\nfrom app.views import show\n",
}
PYTHON_DEPS = {
    "app/__init__.py": set(),
    "app/db.py": set(),
    "app/models.py": {"app/db.py"},
    "app/views.py": {"app/models.py", "app/helpers.py"},
    "app/helpers.py": {"app/views.py"},
    "app/main.py": {"app/models.py", "app/views.py"},
    "tests/test_views.py": {"app/views.py"},
}
# db has no imports; models then waits for nothing; views, helpers, main and the test each
# wait for one file: the cycle is broken at the first of them by path (helpers), which frees
# views, which frees main and the test. __init__ is a part of the graph of its own.
PYTHON_ORDER = [
    "app/__init__.py",
    "app/db.py",
    "app/models.py",
    "app/helpers.py",
    "app/views.py",
    "app/main.py",
    "tests/test_views.py",
]

# C: quoted includes beside the file or found by their tail, an angle include of a repository
# header, a system header (no edge) and a cycle between two headers.
C_REPO = {
    "src/main.c": '#include <stdio.h>\n#include "../include/b.h"\nint main(void) { return a(); }\n',
    "src/a.c": '#include "a.h"\nint a(void) { return 1; }\n',
    "include/a.h": '#pragma once\n#include "b.h"\nint a(void);\n',
    "include/b.h": "#pragma once\n#include <a.h>\nint b(void);\n",
    "tools/gen.cpp": '#  include "util/io.hpp"\n',
    "tools/util/io.hpp": "// no includes\n",
}
C_DEPS = {
    "src/main.c": {"include/b.h"},
    "src/a.c": {"include/a.h"},
    "include/a.h": {"include/b.h"},
    "include/b.h": {"include/a.h"},
    "tools/gen.cpp": {"tools/util/io.hpp"},
    "tools/util/io.hpp": set(),
}
# One part holds the headers, main.c and a.c (first path include/a.h), the other the tool.
# a.h and b.h wait for each other: the cycle breaks at a.h (first by path), then b.h, then
# a.c and main.c (each waited for one header, now placed), in path order.
C_ORDER = [
    "include/a.h",
    "include/b.h",
    "src/a.c",
    "src/main.c",
    "tools/util/io.hpp",
    "tools/gen.cpp",
]

# TypeScript / JavaScript: `from`, side-effect `import`, `require`, `import()`, extension and
# index resolution, a package import (no edge) and a cycle (index <-> util).
JS_REPO = {
    "src/index.ts": (
        "import { y } from './util';\nimport './components';\n"
        "const x = require('../lib/x.js');\nimport React from 'react';\n"
    ),
    "src/util.ts": "export { run } from './index';\nexport const y = 1;\n",
    "src/components/index.tsx": "const m = await import('./Button');\n",
    "src/components/Button.jsx": "export default 1;\n",
    "lib/x.js": "module.exports = 1;\n",
}
JS_DEPS = {
    "src/index.ts": {"src/util.ts", "src/components/index.tsx", "lib/x.js"},
    "src/util.ts": {"src/index.ts"},
    "src/components/index.tsx": {"src/components/Button.jsx"},
    "src/components/Button.jsx": set(),
    "lib/x.js": set(),
}
# lib/x.js and Button wait for nothing (x first by path), then components/index; index waits
# for util only, util for index: the cycle breaks at index (first by path), then util.
JS_ORDER = [
    "lib/x.js",
    "src/components/Button.jsx",
    "src/components/index.tsx",
    "src/index.ts",
    "src/util.ts",
]


@pytest.mark.parametrize(
    ("files", "deps", "order"),
    [
        (PYTHON_REPO, PYTHON_DEPS, PYTHON_ORDER),
        (C_REPO, C_DEPS, C_ORDER),
        (JS_REPO, JS_DEPS, JS_ORDER),
    ],
    ids=["python", "c", "typescript"],
)
def test_import_graph_and_order(files, deps, order):
    """The import graph is exactly the known one, and the order DeepSeek-Coder's sort gives
    (a cycle broken at the file with the fewest unplaced imports, ties by path)."""
    assert dependencies(files) == deps
    assert import_order(files, deps) == order
    # A file comes after what it imports, except across the cycle's broken edge.
    place = {p: i for i, p in enumerate(order)}
    late = [(p, d) for p, ds in deps.items() for d in ds if place[d] > place[p]]
    assert len(late) == 1


def test_import_order_is_a_function_of_the_repository():
    """Shuffling the files' arrival changes nothing; an acyclic graph is fully sorted."""
    files = {"c.py": "import b\n", "b.py": "import a\n", "a.py": "", "d.py": "import c\n"}
    deps = dependencies(files)
    assert import_order(list(reversed(list(files))), deps) == ["a.py", "b.py", "c.py", "d.py"]


def test_python_imports_in_src_layout_and_unparsable_files():
    """`src/pkg/x.py` is imported as `pkg.x`; a file ast cannot parse is read by lines."""
    files = {
        "my-repo/src/pkg/__init__.py": "",
        "my-repo/src/pkg/a.py": "from pkg.b import f\n",
        "my-repo/src/pkg/b.py": "print 'python 2'\nimport pkg.a\n",
    }
    assert dependencies(files) == {
        "my-repo/src/pkg/__init__.py": set(),
        "my-repo/src/pkg/a.py": {"my-repo/src/pkg/b.py"},
        "my-repo/src/pkg/b.py": {"my-repo/src/pkg/a.py"},
    }


def _files(paths):
    return [RepoFile(p, f"# {p}\n", "Python", f"s/{p}") for p in paths]


def test_orders_path_random_imports():
    """`path` sorts; `random` is a seeded permutation per repository, not of the arrival
    order; `imports` is the import order."""
    paths = [f"m{i:02d}.py" for i in range(12)]
    files = _files(paths)
    assert [f.path for f in order_files(files[::-1], "path", 1, "r")] == paths
    first = [f.path for f in order_files(files, "random", 1, "r")]
    assert sorted(first) == paths and first != paths
    assert [f.path for f in order_files(files[::-1], "random", 1, "r")] == first
    assert [f.path for f in order_files(files, "random", 2, "r")] != first
    assert [f.path for f in order_files(files, "random", 1, "other")] != first
    repo = [RepoFile(p, t, "Python", p) for p, t in PYTHON_REPO.items()]
    assert [f.path for f in order_files(repo, "imports", 1, "r")] == PYTHON_ORDER


def test_checkouts_of_a_files_tree(tmp_path):
    """A `.git` folder at any depth makes a repository; else the top-level folder; a loose
    file at the top belongs to the source path's own repository."""
    root = tmp_path / "src"
    (root / "org" / "proj" / ".git").mkdir(parents=True)
    (root / "plain" / "deep").mkdir(parents=True)
    cases = {
        "org/proj/pkg/m.py": ("org/proj", "org/proj/pkg/m.py"[len("org/proj/") :]),
        "org/notes.md": ("org", "notes.md"),
        "plain/deep/x.c": ("plain", "deep/x.c"),
        "README.md": ("src", "README.md"),
    }
    for rel, (name, inside) in cases.items():
        full = str(root / rel)
        fields = checkout_fields(full, full, rel)
        assert (fields["repo_name"], fields["repo_path"]) == (name, inside), rel
    assert checkout_fields(
        str(root / "org/proj/a.py"), str(root / "org/proj/a.py"), "org/proj/a.py"
    )["repo_dir"] == str(root / "org" / "proj")
    (root / ".git").mkdir()  # the source path itself is a checkout now
    full = str(root / "plain/deep/x.c")
    assert checkout_fields(full, full, "plain/deep/x.c")["repo_name"] == "src"


def _byte_encoder(penalty: int = 0):
    """Ids = the UTF-8 bytes; with `penalty`, a whole plain document costs `penalty` more
    ids per file separator after the first (its text encodes longer than its parts)."""

    def encode(parts):
        text = "".join(p for p in parts if isinstance(p, str))
        extra = penalty * max(0, text.count(PLAIN_FILE) - 1)
        markers = [p for p in parts if isinstance(p, int)]
        return np.array(list(text.encode()) + [0] * extra + markers, np.int64)

    return encode


@pytest.mark.parametrize("penalty", [0, 7])
def test_split_at_file_boundaries_plain(penalty):
    """Plain text: documents hold consecutive whole files, each file once, each document at
    most the budget unless it is one file over it; a file that tips a document over (even
    when the parts' estimate fits) starts the next."""
    fmt = RepoFormat()
    sizes = [10, 30, 5, 60, 200, 3, 3, 3, 40]
    files = [fmt.file(f"f{i}", ["x" * n + "\n"]) for i, n in enumerate(sizes)]
    header = fmt.header("repo")
    encode = _byte_encoder(penalty)
    budget = 100
    docs = split_repository(header, files, encode, budget, additive=False)
    held = [i for span, _ in docs for i in span]
    assert held == list(range(len(files)))
    for span, ids in docs:
        whole = join_text([p for f in (header, *[files[i] for i in span]) for p in f])
        assert np.array_equal(ids, encode(whole))
        assert len(ids) <= budget or len(span) == 1
        if span.stop < len(files):  # greedy: the next file would not have fitted
            more = join_text([*whole, *files[span.stop]])
            assert len(encode(more)) > budget
    lone = [span for span, ids in docs if len(ids) > budget]
    assert lone == [range(4, 5)]  # the 200-byte file, alone


def test_split_with_markers_is_additive():
    """With marker ids every file starts with its separator id: a document's ids are the
    header's and its files' ids end to end."""
    fmt = RepoFormat(repo_id=1000, file_id=1001)
    files = [fmt.file(f"f{i}.py", ["y" * (7 * i) + "\n"]) for i in range(1, 8)]
    header = fmt.header("r")
    assert header == [1000, "r\n"] and files[0][:2] == [1001, "f1.py\n"]
    encode = _byte_encoder()
    docs = split_repository(header, files, encode, 60, additive=True)
    assert [i for span, _ in docs for i in span] == list(range(7))
    for span, ids in docs:
        assert np.array_equal(
            ids, np.concatenate([encode(header), *[encode(files[i]) for i in span]])
        )
        assert len(ids) <= 60 or len(span) == 1
        assert list(ids).count(1001) == len(span) and ids[-1] != 1000


def test_recipe_section_checks():
    """`repos:` values are checked when the section is made."""
    with pytest.raises(RecipeError, match="repos.order 'deps'"):
        ReposConfig(order="deps")
    with pytest.raises(RecipeError, match="repos.format 'xml'"):
        ReposConfig(format="xml")
    with pytest.raises(RecipeError, match="repos.max_tokens"):
        ReposConfig(max_tokens=2)


def _recipe(**repos_and_more):
    from lemur.data.recipe_loader import recipe_from_dict

    raw = {
        "output": "/tmp/out",
        "tokenizer": {"train": {}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "sources": [
            {"name": "src", "domain": "code", "format": "files", "paths": ["/tmp"]},
            {"name": "rows", "domain": "code", "format": "jsonl", "paths": ["/tmp"]},
            {"name": "web", "domain": "text", "format": "jsonl", "paths": ["/tmp"]},
        ],
        **repos_and_more,
    }
    return recipe_from_dict(raw, False)


def test_recipe_repos_sources_and_conflicts():
    """`repos.sources` picks code sources (every code source by default); a text source, an
    unknown name and `dedup.write_duplicates` are one-line recipe errors."""
    assert _recipe().repo_sources() == []
    assert _recipe(repos={}).repo_sources() == [0, 1]
    assert _recipe(repos={"sources": ["rows"]}).repo_sources() == [1]
    with pytest.raises(RecipeError, match="repos.sources: 'web' is not a code source"):
        _recipe(repos={"sources": ["web"]})
    with pytest.raises(RecipeError, match="repos.sources: no source is named 'nope'"):
        _recipe(repos={"sources": ["nope"]})
    with pytest.raises(RecipeError, match="dedup.write_duplicates"):
        _recipe(repos={}, dedup={"write_duplicates": True})


@pytest.mark.parametrize("sizes", [[1] * 9, [500] * 9], ids=["under", "over"])
def test_split_plain_with_counted_sizes_still_fits(sizes):
    """Plain text with the read stage's counts as estimates: however wrong they are, each
    document is encoded whole and fits the budget (or is one file), files once and in order."""
    fmt = RepoFormat()
    files = [
        fmt.file(f"f{i}", ["x" * n + "\n"]) for i, n in enumerate([10, 30, 5, 60, 200, 3, 3, 3, 40])
    ]
    header, encode = fmt.header("repo"), _byte_encoder(7)
    docs = split_repository(header, files, encode, 100, additive=False, sizes=sizes)
    assert [i for span, _ in docs for i in span] == list(range(len(files)))
    for span, ids in docs:
        whole = join_text([p for f in (header, *[files[i] for i in span]) for p in f])
        assert np.array_equal(ids, encode(whole))
        assert len(ids) <= 100 or len(span) == 1
    if sizes[0] == 500:  # estimates over the budget: one file per document
        assert all(len(span) == 1 for span, _ in docs)


def test_same_named_headers_resolve_in_linear_time():
    """4,000 files in 2,000 folders that each hold a `config.h` and a `.c` including it
    (quoted, by a deeper tail and by angle brackets): every include is resolved to the
    shallowest matching path, looking at each path a bounded number of times; the tail index
    compared every file of that base name per include (#44 item 23: 1,000 files 32 s, 2,000
    unfinished; the time is tools/bench_repos.py's --same-named figure). Work is counted,
    not timed: each path is a str that counts its `endswith` calls."""
    looked = [0]

    class Path(str):
        def endswith(self, *args):  # type: ignore[override]
            looked[0] += 1
            return str.endswith(self, *args)

    n = 2_000
    files = {Path("config.h"): "int top;\n", Path("common/config.h"): "int common;\n"}
    for i in range(n):
        files[Path(f"m{i}/config.h")] = '#include "common/config.h"\n#include <config.h>\n'
        files[Path(f"m{i}/a.c")] = '#include "config.h"\n#include <m0/config.h>\n#include "x/y.h"\n'
    deps = dependencies(files)
    assert deps[f"m{n - 1}/config.h"] == {"common/config.h", "config.h"}
    assert deps[f"m{n - 1}/a.c"] == {f"m{n - 1}/config.h", "m0/config.h"}
    assert deps["m0/a.c"] == {"m0/config.h"}
    assert looked[0] <= 4 * len(files), f"{looked[0]:,} endswith calls for {len(files):,} files"
