"""`lemur-data build` with `repos:`: a files tree of checkouts and a table with a repository
column become repository documents; shards decode back to them, with the files in import
order, split at file boundaries to the budget, the counts exact, the shards reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lemur.data.repos.render import PLAIN_FILE, PLAIN_REPO
from lemur.tokenizer import open_tokenizer
from tests.conftest import write_jsonl

ALPHA = {  # a checkout (.git): Python, a cycle views <-> helpers
    "app/__init__.py": "__version__ = '1.0'\n",
    "app/db.py": "import sqlite3\nCONNECTION = sqlite3.connect(':memory:')\n",
    "app/models.py": "from app import db\n\nclass User:\n    table = 'users'\n",
    "app/views.py": "from .models import User\nfrom . import helpers\n\ndef show():\n    return User\n",
    "app/helpers.py": "from app.views import show\n\ndef render():\n    return show()\n",
    "app/main.py": "from app.models import User\nfrom .views import show\n\nshow()\n",
}
ALPHA_ORDER = [
    "app/__init__.py",
    "app/db.py",
    "app/models.py",
    "app/helpers.py",
    "app/views.py",
    "app/main.py",
]
BETA = {  # a top-level folder: C, a cycle a.h <-> b.h
    "src/main.c": '#include <stdio.h>\n#include "../include/b.h"\nint main(void) { return a(); }\n',
    "src/a.c": '#include "a.h"\nint a(void) { return 1; }\n',
    "include/a.h": '#pragma once\n#include "b.h"\nint a(void);\n',
    "include/b.h": "#pragma once\n#include <a.h>\nint b(void);\n",
}
BETA_ORDER = ["include/a.h", "include/b.h", "src/a.c", "src/main.c"]
GAMMA = {  # a checkout: TypeScript
    "src/index.ts": "import { y } from './util';\nexport const x: number = y + 1;\n",
    "src/util.ts": "export const y: number = 41;\n",
}
GAMMA_ORDER = ["src/util.ts", "src/index.ts"]
LOOSE = {"README.md": "# Tree\n\nThree repositories and this file.\n"}
DELTA = {  # rows of a table with a repository column; copy.py duplicates alpha's db.py
    "lib/parse.py": "from lib import tokens\n\ndef parse(s):\n    return tokens.split(s)\n",
    "lib/tokens.py": "def split(s):\n    return s.split()\n",
    "copy.py": ALPHA["app/db.py"],
}
DELTA_ORDER = ["copy.py", "lib/tokens.py", "lib/parse.py"]
ALONE = "def lonely():\n    return 'a row of the table with no repository'\n"
EXPECTED = {  # repository name -> (files, order)
    "alpha": (ALPHA, ALPHA_ORDER),
    "beta": (BETA, BETA_ORDER),
    "gamma": (GAMMA, GAMMA_ORDER),
    "tree": (LOOSE, ["README.md"]),
    "delta": (DELTA, DELTA_ORDER),
}
BUDGET = 48


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture(scope="module")
def repo_sources(tmp_path_factory) -> Path:
    """The tree (alpha and gamma checkouts, beta a plain folder, a loose README) and the table."""
    root = tmp_path_factory.mktemp("repos")
    tree = root / "tree"
    _write(tree / "alpha", ALPHA)
    (tree / "alpha" / ".git").mkdir()
    _write(tree / "beta", BETA)
    _write(tree / "gamma", GAMMA)
    (tree / "gamma" / ".git").mkdir()
    _write(tree, LOOSE)
    rows = [
        {"id": f"d{i}", "repo_name": "delta", "path": p, "text": t}
        for i, (p, t) in enumerate(DELTA.items())
    ]
    rows.append({"id": "alone", "path": "alone.py", "text": ALONE})
    # A repository whose one file is a copy of gamma's: dedup removes it, and so the repository.
    rows.append({"id": "e0", "repo_name": "epsilon", "path": "u.ts", "text": GAMMA["src/util.ts"]})
    write_jsonl(root / "table.jsonl", rows)
    return root


def _recipe(root: Path, out: Path, tokenizer: Path, tasks: int = 2) -> Path:
    recipe = {
        "output": str(out),
        "work_dir": str(out.parent / f"{out.name}-work"),
        "seed": 11,
        "seq_len": 64,
        "tokenizer": {"model": str(tokenizer)},
        "mix": {"ratio": {"code": 1}},
        "executor": {"kind": "local", "tasks": tasks, "workers": 1},
        "val_fraction": 0,
        "dedup": {"near": False},
        "filters": {"code": {"enabled": False}},
        "sources": [
            {"name": "tree", "domain": "code", "format": "files", "paths": [str(root / "tree")]},
            {
                "name": "table",
                "domain": "code",
                "format": "jsonl",
                "paths": [str(root / "table.jsonl")],
                "path_key": "path",
                "metadata_keys": ["repo_name"],
            },
        ],
        "repos": {"order": "imports", "max_tokens": BUDGET},
    }
    path = out.parent / f"{out.name}.yaml"
    path.write_text(json.dumps(recipe))
    return path


def _build(recipe: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(recipe)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(
        (Path(json.loads(recipe.read_text())["output"]) / "manifest.json").read_text()
    )


def _documents(out: Path, manifest: dict) -> list[np.ndarray]:
    docs = []
    for shard in manifest["shards"]:
        tokens = np.fromfile(out / shard["file"], dtype=manifest["dtype"])
        ends = np.fromfile(out / shard["index"], dtype=np.uint64)
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        docs += [tokens[s:e] for s, e in zip(starts, ends.astype(np.int64), strict=True)]
    return docs


def _parse(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(repository, [(path, content)]) of a plain-format repository document."""
    assert text.startswith(PLAIN_REPO), text[:80]
    name, _, rest = text[len(PLAIN_REPO) :].partition("\n")
    files = []
    for chunk in rest.split(PLAIN_FILE)[1:]:
        path, _, content = chunk.partition("\n")
        files.append((path, content))
    assert rest.startswith(PLAIN_FILE)
    return name, files


@pytest.fixture(scope="module")
def built(repo_sources, llama2_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "out"
    manifest = _build(_recipe(repo_sources, out, llama2_tokenizer))
    return out, manifest


def test_shards_decode_to_repository_documents(built):
    """Every repository's files come back whole, once, in import order, split at file
    boundaries into documents within the budget (BOS and EOS included); the row without a
    repository is a document of its own; the duplicate file is gone from one repository."""
    out, manifest = built
    tok = open_tokenizer(out / manifest["tokenizer"]["file"])
    by_repo: dict[str, list[list[tuple[str, str]]]] = {}
    alone = []
    for ids in _documents(out, manifest):
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        text = tok.decode(ids[1:-1].tolist())
        if not text.startswith(PLAIN_REPO):
            alone.append(text)
            continue
        name, files = _parse(text)
        assert ids[1:-1].tolist() == tok.encode(text)  # one text, encoded as any document
        assert len(ids) <= BUDGET or len(files) == 1, (name, len(ids))
        by_repo.setdefault(name, []).append(files)
    assert alone == [ALONE]
    assert sorted(by_repo) == sorted(EXPECTED)
    dropped = []
    for name, (files, order) in EXPECTED.items():
        # The documents of a repository, put back in order by their first file.
        docs = sorted(by_repo[name], key=lambda d: order.index(d[0][0]))
        got = [f for d in docs for f in d]
        want = [(p, files[p]) for p in order]
        dropped += [(name, f) for f in want if f not in got]
        assert got == [f for f in want if f in got], name
    # Exact dedup removed the table's copy of db.py (the first source's copy is kept), as a
    # file, before grouping; epsilon's only file went the same way, and epsilon with it.
    assert dropped == [("delta", ("copy.py", DELTA["copy.py"]))]
    assert "epsilon" not in by_repo

    assert max(len(v) for v in by_repo.values()) > 1  # the budget split some repository


def test_manifest_counts_repositories_and_files(built):
    """counts.repositories: files in = grouped + duplicates, exactly; repositories,
    documents and the row without a repository counted; dedup's removal in counts.dedup."""
    out, manifest = built
    rc = manifest["counts"]["repositories"]
    n_files = sum(len(files) for files, _ in EXPECTED.values())
    assert rc["files"] == {"in": n_files + 1, "grouped": n_files - 1, "duplicates": 2}
    assert (rc["repositories"], rc["repositories_removed"]) == (5, 1)
    repo_docs = sum(1 for ids in _documents(out, manifest) if ids.size > 3)
    assert rc["documents"] == repo_docs - 1  # every document but the lone row's
    assert rc["files_without_repository"] == 1
    assert rc["by_source"]["tree"]["repositories"] == 4
    assert rc["by_source"]["table"]["repositories"] == 1
    assert rc["by_source"]["tree"]["files_in"] + rc["by_source"]["table"]["files_in"] == n_files + 1
    assert rc["by_source"]["table"]["repositories_removed"] == 1
    assert (rc["order"], rc["format"], rc["max_tokens"]) == ("imports", "plain", BUDGET)
    assert manifest["counts"]["dedup"]["exact"] == 2
    assert manifest["counts"]["read"] == n_files + 2
    shown = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "stats", str(out)], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    keys = ("files_in", "duplicates", "grouped", "repositories", "documents")
    for name in ("tree", "table"):  # `lemur-data stats` shows the manifest's counts per source
        lines = shown.stdout.splitlines()
        after = next(i for i, r in enumerate(lines) if "repository documents" in r)
        row = next(r for r in lines[after:] if r.startswith(f"│ {name} "))
        cells = [c.strip() for c in row.split("│") if c.strip()]
        per = rc["by_source"][name]
        want = [f"{per.get(k, 0):,}" for k in (*keys, "without_repository")]
        assert cells == [name, *want]


def test_same_seed_same_shards_whatever_the_task_count(
    built, repo_sources, llama2_tokenizer, tmp_path
):
    """A second build of the recipe (another work directory, three tasks: other buckets)
    writes byte-identical shards."""
    out, manifest = built
    again = _build(_recipe(repo_sources, tmp_path / "again", llama2_tokenizer, tasks=3))
    assert [s["file"] for s in again["shards"]] != []
    first = [(out / s["file"]).read_bytes() for s in manifest["shards"]]
    second = [(tmp_path / "again" / s["file"]).read_bytes() for s in again["shards"]]
    assert first == second
