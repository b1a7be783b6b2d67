"""A given tokenizer (`tokenizer: {hf: ...}` or `{model: ...}`) is checked before the build
writes anything: one that loses text, or cannot be read or frame documents, is a one-line
error naming its file, exit 2, and no output folder is made."""

from __future__ import annotations

import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from bytelevel_fixtures import lossy_folder, reference_ids, with_byte_fallback
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl
from test_data_build_hf_tokenizer import shard_documents

from lemur.data.cli import main
from lemur.tokenizer.round_trip import PROBE


@pytest.fixture
def run(capsys):
    """`lemur-data ARGS` in this process; (exit code, stderr)."""

    def call(*args: str) -> tuple[int, str]:
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err

    return call


def texts() -> list[str]:
    return [p.read_text() for p in real_python_files(8)] + [d["text"] for d in real_text_docs(10)]


@pytest.fixture(scope="module")
def unigram(tmp_path_factory) -> Path:
    """A Unigram tokenizer.json trained with `tokenizers` (lossy: `<unk>` for tabs, ...)."""
    return lossy_folder(tmp_path_factory.mktemp("unigram"), "unigram", texts())


def write_recipe(tmp: Path, tokenizer: dict) -> Path:
    """A small one-domain recipe over real code and text, with the given tokenizer."""
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    for p in real_python_files(3):
        (code / p.name).write_bytes(p.read_bytes())
    text = write_jsonl(tmp / "t.jsonl", real_text_docs(3))
    raw = {
        "output": str(tmp / "out"),
        "tokenizer": tokenizer,
        "seq_len": 128,
        "executor": {"tasks": 1, "workers": 1},
        "filters": NO_FILTERS,
        "dedup": {"exact": False, "near": False},
        "mix": {"ratio": {"code": 1}},
        "sources": [
            {"name": "c", "domain": "code", "format": "files", "paths": [str(code)]},
            {"name": "t", "domain": "code", "format": "jsonl", "paths": [str(text)]},
        ],
    }
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def refused(result: tuple[int, str], tmp: Path) -> str:
    """The one error line of a build refused up front (exit 2, no output folder)."""
    code, err = result
    lines = err.strip().splitlines()
    assert (code, len(lines)) == (2, 1), err
    assert lines[0].startswith("lemur-data: error: recipe: tokenizer.") and "Traceback" not in err
    assert not (tmp / "out").exists()  # nothing written, not even an empty folder
    return lines[0]


# What a byte-level BPE trained without the full byte alphabet saw: real code and text, and
# the probe's strings of CJK, emoji and accented text, but no Cyrillic, Arabic, Devanagari.
SEEN = [t for t in PROBE if "\u0400" not in t]


@pytest.mark.parametrize("kind", ["wordpiece", "whitespace-bpe", "unigram", "seen-bytes-bpe"])
def test_a_tokenizer_that_loses_text_is_refused(run, tmp_path, kind, unigram):
    """Refused, one line: `seen-bytes-bpe` gave every probe string of the time back (exit
    0) while it turned Cyrillic into U+FFFD and `<unk>`."""
    sample = texts() + SEEN * 3 if kind == "seen-bytes-bpe" else texts()
    folder = unigram if kind == "unigram" else lossy_folder(tmp_path / kind, kind, sample)
    line = refused(run("build", str(write_recipe(tmp_path, {"hf": str(folder)}))), tmp_path)
    assert line.startswith(
        f"lemur-data: error: recipe: tokenizer.hf: {folder / 'tokenizer.json'}: loses text, '"
    )
    assert " decodes to '" in line and "set tokenizer.lossy: allow to take it anyway" in line


def test_lossy_allow_builds_a_unigram_with_the_reference_ids(run, tmp_path, unigram):
    folder = unigram
    recipe = write_recipe(tmp_path, {"hf": str(folder), "eos": "</s>", "lossy": "allow"})
    code, err = run("build", str(recipe))
    # Nothing on stderr but the build's closing line (its wall time, #44 item 9).
    assert code == 0 and re.fullmatch(r"lemur-data: build done in \d+s\n", err), err
    manifest, docs = shard_documents(tmp_path / "out")
    assert (manifest["tokenizer"]["engine"], manifest["tokenizer"]["eos_id"]) == ("tokenizers", 1)
    sources = [p.read_text() for p in (tmp_path / "code").iterdir()]
    sources += [d["text"] for d in real_text_docs(3)]
    want = Counter(tuple([*reference_ids(folder, t), 1]) for t in sources)
    assert Counter(tuple(d) for d in docs) == want  # framed `doc </s>`, ids the reference's
    code, err = run("build", str(recipe), "--set", "tokenizer.lossy=maybe")
    assert code == 2 and "tokenizer.lossy 'maybe': the one value is 'allow'" in err


def test_a_sentencepiece_model_without_byte_fallback_is_refused(run, tmp_path):
    import sentencepiece as spm

    lines = [line for t in texts() for line in t.split("\n") if line.strip()]
    model = io.BytesIO()  # SentencePiece's defaults: NFKC, <unk>, no byte fallback
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=800, minloglevel=2
    )
    path = tmp_path / "unk.model"
    path.write_bytes(model.getvalue())
    line = refused(run("build", str(write_recipe(tmp_path, {"model": str(path)}))), tmp_path)
    assert line.startswith(f"lemur-data: error: recipe: tokenizer.model: {path}: loses text, ")


def damaged(folder: Path, damage: str) -> tuple[dict, Path]:
    """A copy of a tokenizer folder with one mistake: (the recipe's tokenizer, the file named)."""
    file = folder / "tokenizer.json"
    if damage == "corrupt tokenizer.json":
        file.write_bytes(file.read_bytes()[:500])
    elif damage == "no model":
        spec = json.loads(file.read_text())
        del spec["model"]
        file.write_text(json.dumps(spec))
    elif damage == "eos it lacks":
        return {"hf": str(folder), "eos": "<|im_end|>"}, file
    elif damage == "corrupt tokenizer_config.json":
        (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>",')
        return {"hf": str(folder)}, folder / "tokenizer_config.json"
    return {"hf": str(folder)}, file


MISTAKES = {
    "corrupt tokenizer.json": "not a readable JSON file (unexpected end of data",
    "no model": "not a tokenizer.json (no 'model')",
    "eos it lacks": "has no token '<|im_end|>'",
    "corrupt tokenizer_config.json": "not a readable JSON file",
}


@pytest.mark.parametrize("damage", MISTAKES)
def test_tokenizer_mistakes_exit_2_naming_the_file_before_writing(run, tmp_path, damage, unigram):
    folder = with_byte_fallback(unigram, tmp_path / "tok")  # one that gives text back
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    tokenizer, file = damaged(folder, damage)
    line = refused(run("build", str(write_recipe(tmp_path, tokenizer))), tmp_path)
    assert line.startswith(f"lemur-data: error: recipe: tokenizer.hf: {file}: {MISTAKES[damage]}")


def test_a_sentencepiece_model_given_as_hf_is_named(run, tmp_path, tokenizer_model):
    wrong = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_model, wrong)
    line = refused(run("build", str(write_recipe(tmp_path, {"hf": str(wrong)}))), tmp_path)
    assert line == (
        f"lemur-data: error: recipe: tokenizer.hf: {wrong}: a SentencePiece model, not a "
        "tokenizer.json (a recipe gives it as tokenizer.model)"
    )


def test_a_recipe_made_in_code_is_checked_when_the_build_starts(tmp_path, unigram):
    from lemur.data.build import build
    from lemur.data.recipe.errors import RecipeError
    from lemur.data.recipe_loader import load_recipe
    from lemur.tokenizer import TokenizerError

    recipe = load_recipe(write_recipe(tmp_path, {"hf": str(unigram)}), check_paths=False)
    with pytest.raises(TokenizerError, match=r"tokenizer.json: loses text, 'int main\(void\)"):
        build(recipe)
    with pytest.raises(RecipeError, match="tokenizer.lossy applies to a given tokenizer"):
        load_recipe(write_recipe(tmp_path, {"train": {}, "lossy": "allow"}), check_paths=False)
