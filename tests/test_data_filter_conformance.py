"""Conformance: lemur's text filters decide exactly as datatrove's at reference settings.

Both sides split words on whitespace and sentences with `sentence_spans` (datatrove takes a
custom `WordTokenizer` as its `language`), so what is compared is the rules, not spaCy's
tokenization. The fixture is real text found on this machine, built at test time: Python's
help topics and standard-library docstrings (always present), plus man pages, files and
HTML pages (as text) under /usr/share/doc where the machine has them.
"""

from __future__ import annotations

import ast
import gzip
import html.parser
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import STDLIB, real_text_docs
from datatrove.data import Document
from datatrove.pipeline.filters import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from datatrove.utils.word_tokenizers import WordTokenizer

from lemur.data import demo
from lemur.data.filter import text as lf
from lemur.data.recipe.filters import (
    C4Config,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
)

# Sizes keep the test near 10 s: rendering a man page and parsing a module are the costs.
MAN_PAGES = 40
DOC_FILES = 480
HTML_PAGES = 160
STDLIB_MODULES = 400
MAX_FILE_BYTES = 40_000


class WhitespaceTokenizer(WordTokenizer):
    """Words are `str.split()`; sentences are lemur's `sentence_spans`."""

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [text[a:b] for a, b in lf.sentence_spans(text)]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return lf.sentence_spans(text)


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML page, one line per block element, scripts and styles left out."""

    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "pre", "dt", "dd", "table"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.skip += tag in ("script", "style")
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.skip -= tag in ("script", "style") and self.skip > 0

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def html_text(raw: str) -> str:
    """An HTML page as plain text (what a text extractor without boilerplate removal gives)."""
    parser = _HTMLText()
    parser.feed(raw)
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


def _small_files(pattern: str) -> list[Path]:
    """Files under /usr/share/doc matching `pattern`, no links, at most MAX_FILE_BYTES."""
    out = []
    for path in sorted(demo.DOC_DIR.rglob(pattern)):
        try:
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_FILE_BYTES:
                out.append(path)
        except OSError:
            continue
    return out


def html_pages(limit: int) -> list[dict[str, str]]:
    """HTML documentation under /usr/share/doc, converted to text."""
    out = []
    for path in _small_files("*.html"):
        try:
            text = html_text(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            out.append({"id": f"html/{path}", "text": text})
        if len(out) == limit:
            break
    return out


def doc_files(limit: int) -> list[dict[str, str]]:
    """READMEs, .txt and .md files under /usr/share/doc (plain or gzipped), as the demo reads."""
    out = []
    names = re.compile(r"(README.*|.*\.txt|.*\.md)(\.gz)?")
    for path in _small_files("*"):
        if not names.fullmatch(path.name):
            continue
        try:
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
            continue
        if text.strip() and "\0" not in text:
            out.append({"id": f"doc/{path}", "text": text})
        if len(out) == limit:
            break
    return out


def stdlib_docstrings(limit: int) -> list[dict[str, str]]:
    """Every docstring of a standard-library module, joined: one document per module."""
    out = []
    found = sorted([*STDLIB.glob("*.py"), *STDLIB.glob("*/*.py")])
    paths = [
        p for p in found if "site-packages" not in p.parts and p.stat().st_size <= MAX_FILE_BYTES
    ]
    for path in paths[:limit]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = [tree, *ast.walk(tree)]
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docs = [ast.get_docstring(n) for n in nodes if isinstance(n, kinds)]
        text = "\n\n".join(dict.fromkeys(d for d in docs if d))
        if text:
            out.append({"id": f"docstring/{path.name}", "text": text})
    return out


@pytest.fixture(scope="module")
def real_docs() -> list[Document]:
    """About a thousand real documents from this machine (fewer where it has no docs)."""
    rows = real_text_docs(1000) + stdlib_docstrings(STDLIB_MODULES)
    rows += list(demo.man_pages(MAN_PAGES))
    rows += doc_files(DOC_FILES)
    rows += html_pages(HTML_PAGES)
    return [Document(text=r["text"], id=r["id"], metadata={"domain": "text"}) for r in rows]


def decide(f, doc: Document) -> tuple[bool | str, str | None]:
    """(True or the drop reason, the kept text) of a filter on a fresh copy of `doc`."""
    copy = Document(text=doc.text, id=doc.id, metadata=dict(doc.metadata))
    res = f.filter(copy)
    if res is True:
        return True, copy.text
    return (res[1] if isinstance(res, tuple) else "dropped"), None


WS = WhitespaceTokenizer()
# Each case: lemur's filter and datatrove's with the same settings. The first four are both
# tools' defaults (the reference); the others are settings both tools offer.
CASES = {
    "gopher_quality": (
        lf.GopherQualityFilter(GopherQualityConfig()),
        GopherQualityFilter(language=WS),
    ),
    "gopher_repetition": (
        lf.GopherRepetitionFilter(GopherRepetitionConfig()),
        GopherRepetitionFilter(language=WS),
    ),
    "c4": (lf.C4Filter(C4Config()), C4QualityFilter(language=WS)),
    "fineweb": (lf.FineWebFilter(FineWebConfig()), FineWebQualityFilter(language=WS)),
    # the C4 paper's counts (3 sentences, 5 words per line)
    "c4_paper_counts": (
        lf.C4Filter(C4Config(min_sentences=3, min_words_per_line=5)),
        C4QualityFilter(min_num_sentences=3, min_words_per_line=5, language=WS),
    ),
    # C4 as FineWeb ran it: no terminal punctuation line rule
    "c4_no_terminal_punct": (
        lf.C4Filter(C4Config(terminal_punct=False)),
        C4QualityFilter(filter_no_terminal_punct=False, language=WS),
    ),
    "fineweb_exclude_zero": (
        lf.FineWebFilter(FineWebConfig(line_punct_exclude_zero=True)),
        FineWebQualityFilter(line_punct_exclude_zero=True, language=WS),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_decisions_as_datatrove(real_docs, case):
    """Every document: the same keep/drop, the same reason and (C4) the same kept text."""
    ours, theirs = CASES[case]
    assert len(real_docs) >= 300
    mismatches = []
    outcomes: Counter = Counter()
    for doc in real_docs:
        a, b = decide(ours, doc), decide(theirs, doc)
        outcomes[a[0]] += 1
        if a != b:
            mismatches.append(
                (doc.id, a[0], b[0], "same decision, other text" if a[0] == b[0] else "")
            )
    print(f"{case}: {len(real_docs)} documents, {dict(outcomes)}")
    assert not mismatches, mismatches[:10]
    # the fixture exercises the rules: some documents kept, some dropped
    assert True in outcomes and len(outcomes) >= 2, outcomes
