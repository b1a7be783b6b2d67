"""Language tags: Linguist-style names for code from file extension and shebang.

A first, dependency-free tagger; the ingest issue replaces it with go-enry plus an
offline text language-ID model. Taggers only write metadata; filters decide.
"""

from __future__ import annotations

import os

# Linguist language names, as The Stack uses them.
EXTENSIONS: dict[str, str] = {
    ".py": "Python",
    ".pyi": "Python",
    ".pyw": "Python",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".cxx": "C++",
    ".hpp": "C++",
    ".hh": "C++",
    ".hxx": "C++",
    ".tcc": "C++",
    ".ipp": "C++",
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
    ".zsh": "Shell",
    ".pl": "Perl",
    ".pm": "Perl",
    ".lua": "Lua",
    ".r": "R",
    ".scala": "Scala",
    ".kt": "Kotlin",
    ".swift": "Swift",
    ".cs": "C#",
    ".m": "Objective-C",
    ".ipynb": "Jupyter Notebook",
    ".md": "Markdown",
    ".html": "HTML",
    ".css": "CSS",
    ".json": "JSON",
    ".yaml": "YAML",
    ".yml": "YAML",
    ".toml": "TOML",
    ".xml": "XML",
    ".tex": "TeX",
    ".f90": "Fortran",
    ".hs": "Haskell",
    ".ml": "OCaml",
    ".jl": "Julia",
}
SHEBANGS: dict[str, str] = {
    "python": "Python",
    "python3": "Python",
    "sh": "Shell",
    "bash": "Shell",
    "dash": "Shell",
    "zsh": "Shell",
    "perl": "Perl",
    "node": "JavaScript",
    "ruby": "Ruby",
    "php": "PHP",
}


def _shebang_language(text: str) -> str | None:
    if not text.startswith("#!"):
        return None
    words = text[2:].split("\n", 1)[0].split()
    if not words:
        return None
    prog = os.path.basename(words[0])
    if prog == "env" and len(words) > 1:
        prog = os.path.basename(words[1])
    prog = prog.rstrip("0123456789.") or prog
    return SHEBANGS.get(prog)


def code_language(path: str, text: str) -> str:
    """Linguist name of a code file from its extension, shebang or location; 'unknown' else."""
    ext = os.path.splitext(path)[1].lower()
    if ext in EXTENSIONS:
        return EXTENSIONS[ext]
    by_shebang = _shebang_language(text)
    if by_shebang:
        return by_shebang
    # Extension-less C++ standard headers (`vector`, `map`) live under include/c++/.
    if "c++/" in path.replace(os.sep, "/") or path.replace(os.sep, "/").startswith("c++"):
        return "C++"
    return "unknown"
