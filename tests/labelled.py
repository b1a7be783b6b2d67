"""Labelled real files found on this machine, for measuring the language taggers.

Labels come from where a file lives, never from a tagger: stdlib `.py` is Python,
`/usr/include/c++` headers are C++, npm's `.js` is JavaScript, Perl modules are Perl,
extension-less `/usr/bin` scripts with a shell shebang are Shell; paragraphs of localized
man pages under `/usr/share/man/<lang>` are in `<lang>`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

# man's locale directory names -> ISO 639-1 (what fastText lid.176 predicts)
MAN_LOCALES = {"pt_BR": "pt", "zh_CN": "zh", "zh_TW": "zh"}
_SHELL_SHEBANG = re.compile(rb"^#!\s*(/usr)?/bin/(env\s+)?(ba|da)?sh\b")


def _spread(paths: list[Path], n: int) -> list[Path]:
    """An evenly spaced, deterministic selection of n paths."""
    paths = sorted(paths)
    step = max(1, len(paths) // n) if n else 1
    return paths[::step][:n]


def _readable(p: Path, max_bytes: int = 200_000) -> str | None:
    try:
        if not p.is_file() or p.is_symlink() or p.stat().st_size > max_bytes:
            return None
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() and "\0" not in text else None


def labelled_code(per_language: int = 200) -> Iterator[tuple[str, str, str]]:
    """(label, file name, content) for up to `per_language` files of each available language."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    groups: dict[str, list[Path]] = {
        "Python": [p for p in stdlib.glob("*.py")] + list(stdlib.glob("[a-z]*/*.py")),
        "C++": [p for p in Path("/usr/include/c++").glob("*/*") if p.is_file()],
        "JavaScript": list(islice(Path("/usr/lib/node_modules").rglob("*.js"), 20000)),
        "Perl": [p for d in ("/usr/share/perl5", "/usr/share/perl") for p in Path(d).rglob("*.pm")],
    }
    shell = []
    if Path("/usr/bin").is_dir():
        for p in sorted(Path("/usr/bin").iterdir()):
            if "." in p.name or p.is_symlink() or not p.is_file():
                continue
            try:
                with open(p, "rb") as fh:
                    if _SHELL_SHEBANG.match(fh.read(64)):
                        shell.append(p)
            except OSError:
                continue
    groups["Shell"] = shell
    for label, paths in groups.items():
        count = 0
        for p in _spread(paths, per_language * 2):
            text = _readable(p)
            if text is None:
                continue
            yield label, p.name, text
            count += 1
            if count == per_language:
                break


def _render(path: Path) -> str:
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    try:
        man = subprocess.run(["man", "-l", str(path)], capture_output=True, env=env, timeout=30)
        col = subprocess.run(["col", "-b"], input=man.stdout, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return col.stdout.decode("utf-8", "replace")


def _words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[^\W\d_]{2,}", text)]


def _paragraphs(text: str, min_chars: int) -> list[str]:
    paras = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return [p for p in paras if len(p) >= min_chars]


def labelled_paragraphs(
    pages_per_language: int = 3, min_chars: int = 150
) -> Iterator[tuple[str, str]]:
    """(ISO 639-1 label, paragraph) from localized man pages, paragraphs >= min_chars.

    Localized pages are often partly untranslated: a paragraph whose words (80% or more)
    all occur in the English page of the same name is left out, since its label would be
    wrong. (Exact matching misses them: the two renderings hyphenate lines differently.)
    """
    root = Path("/usr/share/man")
    if not root.is_dir():
        return
    for loc in sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("man")
    ):
        label = MAN_LOCALES.get(loc, loc.split("_")[0])
        pages = [p for p in (root / loc).glob("man*/*") if p.is_file()]
        for page in _spread(pages, pages_per_language):
            english_page = root / page.parent.name / page.name
            english = set(_words(_render(english_page))) if english_page.is_file() else set()
            for para in _paragraphs(_render(page), min_chars):
                words = _words(para)
                if english and words and sum(w in english for w in words) >= 0.8 * len(words):
                    continue
                yield label, para
