"""The kind of corpus (lemur/data/corpus.py): what a chat build does differently from a
pre-training build, answered in one place, and the stages asking it instead of the recipe."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lemur.chatml import CHAT_PIECES
from lemur.data.corpus import ChatCorpus, Corpus, corpus_of
from lemur.data.mix import MixInfeasible
from lemur.data.recipe.recipe import ChatConfig
from lemur.data.recipe_loader import recipe_from_dict

ROOT = Path(__file__).resolve().parents[1]


def pretraining(**mix) -> dict:
    """A recipe of one code and one text source (paths unchecked)."""
    return {
        "output": "out",
        "tokenizer": {"train": {"vocab_size": 1000}},
        "mix": {"ratio": {"code": 3, "text": 1}, **mix},
        "sources": [
            {"name": "py", "format": "jsonl", "domain": "code", "paths": ["a.jsonl"]},
            {"name": "web", "format": "jsonl", "domain": "text", "paths": ["b.jsonl"]},
        ],
    }


def chat(weights: dict[str, float] | None = None, tokenizer: dict | None = None) -> dict:
    """A recipe of two chat sources, weighted or not (paths unchecked)."""
    return {
        "output": "out",
        "seq_len": 512,
        "tokenizer": tokenizer or {"train": {"vocab_size": 1000}},
        "chat": {"long": "drop"},
        **({"mix": {"weights": weights}} if weights else {}),
        "sources": [
            {"name": "orca", "format": "chat", "schema": "openorca", "paths": ["o.jsonl"]},
            {"name": "gpt", "format": "chat", "schema": "sharegpt", "paths": ["s.jsonl"]},
        ],
    }


def test_a_pretraining_corpus_is_judged_mixed_by_ratio_and_framed_as_documents():
    corpus = corpus_of(recipe_from_dict(pretraining(budgeted_reading=True), check_paths=False))
    assert type(corpus) is Corpus and corpus.name == "pretraining"
    assert not corpus.loss_masks and corpus.judged_as_text and corpus.chat_format is None
    assert corpus.tokenizer_pieces() == () and corpus.budgeted_reading()
    assert corpus.mix_groups() == ("code", "text")
    assert corpus.mix_target({"code": 10, "text": 99}) == {"code": 3, "text": 1}
    plan = corpus.plan_mix({("code", "Python"): 300, ("text", "en"): 100})
    assert {u: p.budget for u, p in plan.units.items()} == {
        ("code", "Python"): 300,
        ("text", "en"): 100,
    }
    assert corpus.work_key() == {} and corpus.counts(5) == {} and corpus.manifest_fields() == {}


def test_a_chat_corpus_masks_cuts_and_takes_every_conversation():
    corpus = corpus_of(recipe_from_dict(chat(), check_paths=False))
    assert type(corpus) is ChatCorpus and corpus.name == "chat"
    assert corpus.loss_masks and not corpus.judged_as_text and corpus.chat_format == "chatml"
    assert corpus.tokenizer_pieces() == CHAT_PIECES and not corpus.budgeted_reading()
    assert corpus.mix_groups() == ("chat", "chat")
    assert corpus.mix_target({"chat": 7}) == {"chat": 7.0}
    plan = corpus.plan_mix({("chat", "en"): 40, ("chat", "fr"): 2})
    assert {u: (p.budget, p.rate) for u, p in plan.units.items()} == {
        ("chat", "en"): (40, 1.0),
        ("chat", "fr"): (2, 1.0),
    }
    with pytest.raises(
        MixInfeasible, match=r"no conversation is left .*seq_len 512, chat.long drop"
    ):
        corpus.plan_mix({("chat", "en"): 0})
    assert corpus.work_key() == {"chat": (512, ChatConfig(long="drop"))}
    assert corpus.counts(5) == {"truncated": 5} and corpus.manifest_fields() == {}


def test_a_weighted_chat_corpus_mixes_per_source():
    corpus = corpus_of(recipe_from_dict(chat({"orca": 3, "gpt": 1}), check_paths=False))
    assert corpus.mix_groups() == ("orca", "gpt")
    assert corpus.mix_target({"chat": 7}) == {"chat": 4.0}
    plan = corpus.plan_mix({("orca", "en"): 300, ("gpt", "en"): 300})
    assert {u: p.budget for u, p in plan.units.items()} == {("orca", "en"): 300, ("gpt", "en"): 100}


def test_a_template_chat_corpus_adds_no_pieces_and_says_its_framing(tmp_path):
    raw = chat(tokenizer={"hf": str(tmp_path)})
    corpus = corpus_of(recipe_from_dict(raw, check_paths=False))
    assert corpus.chat_format == "template" and corpus.tokenizer_pieces() == ()
    assert corpus.manifest_fields() == {"framing": "template"}


def test_only_the_recipe_and_the_corpus_ask_whether_a_build_is_chat():
    """Every other module asks the corpus what to do (a mode is a module, not a flag)."""
    askers = []
    for path in sorted((ROOT / "lemur").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "is_chat":
                askers.append(str(path.relative_to(ROOT)))
    assert sorted(set(askers)) == ["lemur/data/corpus.py", "lemur/data/recipe/recipe.py"]


def test_the_corpus_module_imports_first_in_a_fresh_process():
    """lemur/data/corpus.py plans with mix.py, and pack/ plans with the corpus: the
    pack package's __init__ must not import its modules (a cycle Python would hit)."""
    done = subprocess.run(
        [sys.executable, "-c", "import lemur.data.corpus, lemur.data.pack.plan"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
