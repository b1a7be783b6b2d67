"""Tagging accuracy on labelled real files found on this machine (skipped where absent)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import NO_FILTERS, write_jsonl
from labelled import labelled_code, labelled_paragraphs

from lemur.data.filter.tagging import (
    MAGIKA_NAMES,
    LanguageTagger,
    TextLanguageID,
    code_language,
    content_language,
    normalize_code_language,
)
from lemur.data.read.listing import list_inputs
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe_loader import recipe_from_dict

# C headers of glibc's development files (pure C, unlike some others in /usr/include).
C_HEADERS = ["stdio.h", "stdlib.h", "string.h", "unistd.h", "signal.h"]


def test_code_tagging_accuracy_on_real_files():
    samples = list(labelled_code(per_language=40))
    labels = {label for label, _, _ in samples}
    if len(labels) < 3:
        pytest.skip(f"only {sorted(labels)} labelled code found on this machine")
    correct = sum(code_language(name, text) == label for label, name, text in samples)
    assert correct / len(samples) >= 0.98, (correct, len(samples))


@pytest.mark.skipif(
    not shutil.which("man") or not Path("/usr/share/man/fr").is_dir(),
    reason="man or localized man pages (/usr/share/man/<lang>) not installed",
)
def test_text_language_accuracy_on_localized_man_pages():
    samples = list(labelled_paragraphs(pages_per_language=2))
    assert len({label for label, _ in samples}) >= 5
    lid = TextLanguageID()
    correct = sum(lid(p)[0] == label for label, p in samples)
    assert correct / len(samples) >= 0.95, (correct, len(samples))


def test_tagger_metadata_and_disagreements():
    tagger = LanguageTagger()
    meta = {"domain": "code", "path": "tool.sh", "source": "s"}
    tagger.tag(meta, "#!/bin/bash\necho hi\n")
    assert meta["language"] == "Shell"
    meta = {"domain": "code", "path": "a.py", "source": "s", "language": "c++"}
    tagger.tag(meta, "import os\nprint(os.getcwd())\n")
    assert meta["language"] == "C++"  # the source's label is kept...
    assert tagger.stats["language_disagreement:s"].total == 1  # ...and the disagreement counted
    meta = {"domain": "text", "source": "s"}
    tagger.tag(meta, "Ceci est une phrase en français, assez longue pour être reconnue sans doute.")
    assert meta["language"] == "fr" and meta["language_score"] > 0.9
    meta = {"domain": "code", "path": "nb.ipynb"}
    tagger.tag(meta, "{}")
    assert meta["language"] == "Jupyter Notebook"
    assert normalize_code_language("c-sharp") == "C#"


def real_code() -> list[tuple[str, str, str]]:
    """(label, file name, content) of real Python, C and shell files on this machine."""
    python_and_shell = [s for s in labelled_code(per_language=4) if s[0] in ("Python", "Shell")]
    headers = [Path("/usr/include") / h for h in C_HEADERS]
    c = [("C", h.name, h.read_text()) for h in headers if h.is_file()]
    samples = python_and_shell + c
    if {label for label, _, _ in samples} != {"Python", "Shell", "C"}:
        pytest.skip("stdlib .py, /usr/include C headers or /usr/bin shell scripts missing")
    return samples


def tagged_rows(tmp_path: Path, samples: list, **source) -> list[dict]:
    """The metadata of `samples` read as rows of one code JSONL (`name` beside `text`) and
    tagged as a build tags them."""
    data = write_jsonl(tmp_path / "code.jsonl", [{"text": t, "name": n} for _, n, t in samples])
    raw = {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 400}},
        "mix": {"ratio": {"code": 1}},
        "filters": NO_FILTERS,
        "sources": [{"name": "c", "domain": "code", "format": "jsonl", "paths": [str(data)]}],
    }
    raw["sources"][0].update(source)
    r = recipe_from_dict(raw)
    files = list_inputs(r).files
    reader = SourcesReader(files, r.sources, errors_dir=str(tmp_path / "errors"))
    docs = list(LanguageTagger().run(d for f in files for d in reader.read(f)))
    return [d.metadata for d in docs]


def test_code_rows_without_a_path_are_tagged_by_content_not_by_their_file(tmp_path):
    """`code.jsonl` is no row's name: without `path_key` each row is tagged by its content
    (Magika, or a shebang); with `path_key` its own name decides, as before."""
    samples = real_code()
    labels = [label for label, _, _ in samples]
    by_content = tagged_rows(tmp_path, samples)
    assert [m["language"] for m in by_content] == labels
    assert {m["language_by"] for m in by_content} == {"content"}
    by_path = tagged_rows(tmp_path, samples, path_key="name")
    assert [m["language"] for m in by_path] == [code_language(n, t) for _, n, t in samples]
    assert [m["language"] for m in by_path] == labels
    assert {m["language_by"] for m in by_path} == {"path"}
    declared = tagged_rows(tmp_path, samples[:1], language="Python")
    assert declared[0]["language_by"] == "source"


def test_a_declared_language_is_checked_against_cheap_clues_only_without_a_path():
    """A row without a file name is checked by its shebang or modeline (a classifier's cost
    is not spent on a check), never by its container's name."""
    tagger = LanguageTagger()
    row = {"domain": "code", "path": "code.jsonl", "path_is_container": True, "source": "s"}
    tagger.tag({**row, "language": "Python"}, "import os\nprint(os.sep)\n" * 20)
    tagger.tag({**row, "language": "Python"}, "#!/bin/sh\necho hi\n")
    assert tagger.stats["language_disagreement:s"].total == 1


def test_magika_labels_map_to_linguist_names():
    """Every name content tagging gives is one enry knows (the mix counts by these)."""
    import enry

    unknown = [n for n in set(MAGIKA_NAMES.values()) if not enry.get_language_extensions(n)]
    assert unknown == []
    assert content_language("") == "unknown"
