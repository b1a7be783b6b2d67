"""Long regex pieces: found as the plain regex finds them, merged as the reference merges them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import regex
from bytelevel_fixtures import llama3_folder, reference_ids, tekken_folder

from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.long_pieces import BACK, MAX_PIECE, RunLengthBPE, grouped, long_pieces

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

RUN_CHARS = " \n\t=a7-_#/*.é\u3000中═ё"


def run_texts(seed: int, n: int) -> list[str]:
    """Texts of a few long runs of one character, with short noise around and between."""
    rng = random.Random(seed)
    noise = "ab =\n\t7é.-"
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append("".join(rng.choice(noise) for _ in range(rng.randint(0, 6))))
            parts.append(rng.choice(RUN_CHARS) * rng.randint(MAX_PIECE - 3, 3 * MAX_PIECE))
        parts.append("".join(rng.choice(noise) for _ in range(rng.randint(0, 6))))
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module", params=["llama3", "tekken", "qwen2-style"])
def folder(request, tmp_path_factory) -> Path:
    """Real tokenizers that tiktoken encodes; qwen2-style: Llama-3's with Qwen2's settings
    (NFC, `ignore_merges` false: a whole piece is never looked up in the vocabulary)."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "tekken":
        return tekken_folder(tmp)
    folder = llama3_folder(tmp)
    if request.param == "qwen2-style":
        spec = json.loads((folder / "tokenizer.json").read_text())
        spec["model"]["ignore_merges"] = False
        spec["normalizer"] = {"type": "NFC"}
        (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_runs_of_one_character_get_the_reference_ids(folder, monkeypatch):
    tok = open_tokenizer(folder)
    assert tok.engine == "tiktoken"
    merged = []
    real_merge = RunLengthBPE.merge
    monkeypatch.setattr(
        RunLengthBPE, "merge", lambda self, runs: merged.append(1) or real_merge(self, runs)
    )
    for i, text in enumerate(run_texts(seed=11, n=60)):
        want = reference_ids(folder, text)
        assert tok.encode(text) == want, f"text {i} ({text[:20]!r}...)"
        assert tok.encode_array(text).tolist() == want, f"text {i}: array"
    assert len(merged) > 30  # the run-length path did the merging, not the fallback


def test_long_pieces_are_the_long_pieces_of_the_plain_regex():
    """The grouped regex splits where the plain one does, for byte-level patterns we know."""
    patterns = [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
        r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    ]
    rng = random.Random(3)
    texts = run_texts(seed=5, n=20) + ["7" * 100_000, "x" + " " * 9000 + "y"]
    texts += ["".join(rng.choice("ab 7\n=é'") for _ in range(20_000)) for _ in range(5)]
    for pattern in patterns:
        pieces, groups = regex.compile(pattern), regex.compile(grouped(pattern))
        for text in texts:
            every = [m.span() for m in pieces.finditer(text)]
            want = [
                (s, e, tuple(a for a, _ in every[max(0, i - BACK) : i]))
                for i, (s, e) in enumerate(every)
                if e - s > MAX_PIECE
            ]
            got = [(p.start, p.end, p.before) for p in long_pieces(text, groups, pieces)]
            assert got == want
            assert "".join(m.group() for m in groups.finditer(text)) == text


def test_run_length_merges_as_tiktoken_and_gives_up_where_all_at_once_differs():
    """All `a a` merged at once is tiktoken's order unless a pair it makes ranks lower, or
    two different pairs tie (tiktoken takes the leftmost of either)."""
    bpe = RunLengthBPE({b"a": 0, b"b": 1, b"aa": 2, b"aaa": 3})
    # a*7 -> aa aa aa a -> (aa a) at the only aa-a boundary: aa aa aaa
    assert bpe.merge(bpe.runs("aaaaaaa")) == [2, 2, 3]
    assert bpe.merge(bpe.runs("baaab")) == [1, 3, 1]
    # tiktoken: a a a a a -> aa a a a -> aaa a a -> aaa aa; all at once: aa aa a -> aa aaa
    lower_first = RunLengthBPE({b"a": 0, b"aaa": 2, b"aa": 3})
    assert lower_first.merge(lower_first.runs("aaaaa")) is None
    tie = RunLengthBPE({b"a": 0, b"aa": 1, b"aaa": 2})
    assert tie.merge([[b"aa", 1], [b"a", 1], [b"aa", 1]]) is None  # aa+a and a+aa: both aaa


def test_characters_of_several_bytes_merge_first_only_where_tiktoken_would():
    """`é` (c3 a9) repeated: merged into its token first, then run by run; refused where a
    pair across two characters ranks below the merge inside one."""
    ranks = {bytes([b]): b for b in range(256)}
    ranks |= {b"\xc3\xa9": 300, b"\xc3\xa9\xc3\xa9": 301}
    bpe = RunLengthBPE(ranks)
    assert bpe.runs("éééé") == [[b"\xc3\xa9", 4]]
    assert bpe.merge(bpe.runs("ééééé")) == [301, 301, 300]
    across = RunLengthBPE(ranks | {b"\xa9\xc3": 299})  # a9 c3 (across two é) goes first
    assert across.runs("éééé") is None
