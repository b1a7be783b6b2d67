"""Tagging accuracy on labelled real files found on this machine (skipped where absent)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from labelled import labelled_code, labelled_paragraphs

from lemur.data.filter.tagging import (
    LanguageTagger,
    TextLanguageID,
    code_language,
    normalize_code_language,
)


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
