"""The per-document FIM transform: where a document is cut, and its FIM ids.

`fim_split(text, settings, key)` decides, from the settings (`FimConfig`: rate, spm_rate,
split, seed) and the document's identity `key` alone, whether a text becomes a FIM
document and where it is cut, so the result is the same on any task and executor: four
numbers in [0, 1) are read from blake2b(seed, key), one for the FIM choice, one for PSM or
SPM, two for the cut points, which are drawn uniformly (Megatron: `randint(0, len + 1)`
twice, sorted) over the characters of the text (`str` indices: never inside a UTF-8
sequence) or over its line starts (`split: line`: 0, the index after each `\\n`, and the end).

`fim_transform(text, settings, key, markers)` gives the document's parts
(lemur/tokenizer/fim.py), the whole text as one `Leading` part when it is not chosen:
what a repository document calls per file (with a key naming the file). The FIM stage
(rewrite.py) encodes a whole document's cut, spliced from its own ids where it can.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lemur.data.recipe.fim import FimConfig
from lemur.tokenizer.fim import CodeMarkers, Leading, Part, fim_parts

_SCALE = float(1 << 64)


@dataclass(frozen=True)
class FimSplit:
    """A document cut in three, and the order it is written in (SPM or PSM)."""

    prefix: str
    middle: str
    suffix: str
    spm: bool


def _uniforms(seed: int, key: str | int) -> tuple[float, float, float, float]:
    """Four numbers in [0, 1) from (seed, key): the same on every machine and process."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=32).digest()
    a, b, c, d = (int.from_bytes(digest[i : i + 8], "little") / _SCALE for i in range(0, 32, 8))
    return a, b, c, d


def _line_starts(text: str) -> list[int]:
    """Where a line-level cut may fall: 0, after each newline, and the end of the text."""
    starts = [0]
    at = text.find("\n")
    while at != -1:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    if starts[-1] != len(text):
        starts.append(len(text))
    return starts


def _seed(settings: FimConfig, seed: int) -> int:
    return seed if settings.seed is None else settings.seed


def fim_chosen(settings: FimConfig, key: str | int, seed: int = 0) -> bool:
    """Whether document `key` becomes a FIM document (`fim_split` is not None): known from
    its identity alone, before its text is read."""
    return _uniforms(_seed(settings, seed), key)[0] < settings.rate


def fim_split(text: str, settings: FimConfig, key: str | int, seed: int = 0) -> FimSplit | None:
    """The FIM cut of `text` (document `key`), None when it stays left to right; `seed` is
    used when `settings.seed` is None (the recipe's seed)."""
    u_fim, u_spm, u_a, u_b = _uniforms(_seed(settings, seed), key)
    if u_fim >= settings.rate:
        return None
    if settings.split == "line":
        starts = _line_starts(text)
        a, b = sorted((starts[int(u_a * len(starts))], starts[int(u_b * len(starts))]))
    else:
        a, b = sorted((int(u_a * (len(text) + 1)), int(u_b * (len(text) + 1))))
    return FimSplit(text[:a], text[a:b], text[b:], spm=u_spm < settings.spm_rate)


def fim_transform(
    text: str, settings: FimConfig, key: str | int, markers: CodeMarkers, seed: int = 0
) -> list[Part]:
    """The parts of document `key`: a FIM document's, or `[Leading(text)]` when not chosen."""
    cut = fim_split(text, settings, key, seed)
    if cut is None:
        return [Leading(text)]
    return fim_parts(cut.prefix, cut.middle, cut.suffix, markers, spm=cut.spm)
