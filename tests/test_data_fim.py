"""The FIM transform (lemur/data/fim/cut.py) and the recipe's `fim:` section."""

from __future__ import annotations

import pytest

from lemur.data.fim.cut import fim_split, fim_transform
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.fim import FimConfig
from lemur.tokenizer.fim import CodeMarkers, Leading

MARKERS = CodeMarkers(style="qwen2.5-coder", prefix=10, middle=11, suffix=12)
TEXT = "def f(x):\n    return x * 2  # é 中 😀\n\nprint(f(3))\n"


def test_rate_and_spm_rate_over_10000_documents():
    settings = FimConfig(rate=0.5, spm_rate=0.3)
    cuts = [fim_split(TEXT, settings, f"source/{i}.py", seed=1) for i in range(10_000)]
    chosen = [c for c in cuts if c is not None]
    assert abs(len(chosen) / 10_000 - 0.5) < 0.02
    assert abs(sum(c.spm for c in chosen) / len(chosen) - 0.3) < 0.02
    for rate in (0.0, 1.0):
        picked = sum(fim_split(TEXT, FimConfig(rate=rate), i) is not None for i in range(500))
        assert picked == 500 * rate


def test_cuts_are_uniform_characters_and_keep_the_text():
    settings = FimConfig(rate=1.0)
    seen = set()
    for i in range(3000):
        cut = fim_split(TEXT, settings, i)
        assert cut.prefix + cut.middle + cut.suffix == TEXT
        seen.add(len(cut.prefix))
    # Every cut point 0..len(TEXT) is drawn (characters, not bytes: 😀 is one place).
    assert seen == set(range(len(TEXT) + 1))


def test_line_cuts_fall_on_line_starts():
    settings = FimConfig(rate=1.0, split="line")
    starts = {0, len(TEXT)} | {i + 1 for i, c in enumerate(TEXT) if c == "\n"}
    seen = set()
    for i in range(500):
        cut = fim_split(TEXT, settings, i)
        assert cut.prefix + cut.middle + cut.suffix == TEXT
        seen |= {len(cut.prefix), len(cut.prefix) + len(cut.middle)}
    assert seen == starts
    no_newline_at_end = "a\nb"
    assert {len(fim_split(no_newline_at_end, settings, i).prefix) for i in range(200)} == {0, 2, 3}


def test_seeded_by_document_identity():
    settings = FimConfig(rate=0.5)
    a = [fim_split(TEXT, settings, f"d{i}", seed=3) for i in range(200)]
    assert a == [fim_split(TEXT, settings, f"d{i}", seed=3) for i in range(200)]
    assert a != [fim_split(TEXT, settings, f"d{i}", seed=4) for i in range(200)]
    pinned = FimConfig(rate=0.5, seed=9)  # fim.seed wins over the recipe's
    assert [fim_split(TEXT, pinned, i, seed=3) for i in range(50)] == [
        fim_split(TEXT, pinned, i, seed=4) for i in range(50)
    ]


def test_transform_gives_parts_or_the_whole_text():
    parts = fim_transform(TEXT, FimConfig(rate=1.0, spm_rate=0.0), "k", MARKERS)
    assert parts[0] == 10 and parts[2] == 12 and parts[4] == 11
    assert isinstance(parts[1], Leading) and parts[1] + parts[5] + parts[3] == TEXT
    assert fim_transform(TEXT, FimConfig(rate=0.0), "k", MARKERS) == [Leading(TEXT)]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rate": 1.5}, "fim.rate must be a number in [0, 1], got 1.5"),
        ({"spm_rate": "half"}, "fim.spm_rate must be a number in [0, 1]"),
        ({"split": "word"}, "fim.split 'word' is not one of char, line"),
        ({"markers": {"prefix": "<p>", "middle": "<m>"}}, "fim.markers needs 'suffix'"),
        ({"markers": {"prefix": "<p>", "midle": "<m>"}}, "fim.markers.midle: not one of"),
        ({"domains": []}, "fim.domains must name at least one domain"),
    ],
)
def test_recipe_section_errors(settings, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        FimConfig(**settings)
