"""Repository documents in a model's own repository format: a Qwen2.5-style tokenizer.json
with Qwen2.5-Coder's FIM and repository tokens (not special, as Qwen's are). The ids equal
what the model's tokenizer gives for the repository string (its markers split out), with and
without fill-in-the-middle per file; a file that spells a marker keeps the ids of its text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import qwen_like_folder
from conftest import real_python_files, real_text_docs, write_jsonl

from lemur.data.fim.cut import fim_split
from lemur.data.recipe.fim import FimConfig
from lemur.data.repos.group import GroupSettings, RepoEncoder
from lemur.data.repos.order import RepoFile
from lemur.data.repos.render import RepoFormat
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.fim import MARKER_STYLES, find_code_markers

QWEN = MARKER_STYLES["qwen2.5-coder"]
FILES = {
    "pkg/__init__.py": "from .core import run\n",
    "pkg/core.py": "import os\n\n\ndef run(path):\n    return os.listdir(path)\n",
    "pkg/cli.py": "from pkg.core import run\n\nif __name__ == '__main__':\n    print(run('.'))\n",
    "notes.py": "# this file spells <|file_sep|> and <|fim_prefix|> in a comment\nX = 1\n",
}


@pytest.fixture(scope="module")
def qwen_coder(tmp_path_factory) -> Path:
    """A Qwen2.5-style folder (trained byte-level BPE) with Qwen2.5-Coder's code tokens added
    as Qwen's are: not special, so `tokenizers` splits them out of a string."""
    from tokenizers import AddedToken, Tokenizer

    texts = [p.read_text() for p in real_python_files(20)] + [d["text"] for d in real_text_docs(20)]
    folder = qwen_like_folder(tmp_path_factory.mktemp("qwen"), texts, vocab_size=1500)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    names = [QWEN[r] for r in ("prefix", "middle", "suffix", "pad", "repo_name", "file_sep")]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in names])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _reference(folder: Path):
    """The model's own tokenizer, as transformers runs it on a prompt: added tokens split out."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def _settings(fmt, markers, fim, budget=10_000) -> GroupSettings:
    return GroupSettings(
        tok_dir="",
        spill_dir="",
        dedup_dir=None,
        out_dir="",
        tasks=1,
        tokenizer="",
        engine="auto",
        sources=("src",),
        grouped=(0,),
        order="path",
        fmt=fmt,
        budget=budget,
        seed=5,
        fim=fim,
        markers=markers,
    )


def _content(f: RepoFile, fim: FimConfig | None, seed: int = 5) -> str:
    """A file's content as the model's FIM string spells it (PSM), or as it is."""
    cut = fim_split(f.text, fim, f.doc_id, seed) if fim is not None else None
    if cut is None:
        return f.text
    assert not cut.spm
    return f"{QWEN['prefix']}{cut.prefix}{QWEN['suffix']}{cut.suffix}{QWEN['middle']}{cut.middle}"


@pytest.mark.parametrize("fim", [None, FimConfig(rate=0.6, spm_rate=0.0)], ids=["plain", "fim"])
def test_ids_equal_the_tokenizer_on_the_repository_string(qwen_coder, fim):
    """Each document is `<|repo_name|>name\\n<|file_sep|>path\\ncontent...` (contents cut
    PSM where drawn) as the model's tokenizer encodes that string, then `<|endoftext|>`;
    the file spelling markers in a comment gets the ids of the text, not the markers."""
    tok = open_tokenizer(qwen_coder)
    markers = find_code_markers(tok)
    assert markers is not None and markers.style == "qwen2.5-coder"
    fmt = RepoFormat.of(markers)
    assert (fmt.repo_id, fmt.file_id) == (markers.repo_name, markers.file_sep)
    files = [RepoFile(p, t, "Python", f"src/{p}") for p, t in sorted(FILES.items())]
    encoder = RepoEncoder(_settings(fmt, markers, fim, budget=60), tok, [None, tok.eos_id])
    reference = _reference(qwen_coder)
    docs = list(encoder.documents("demo", files))
    assert len(docs) > 1  # the budget split the repository
    cuts = 0
    for ids, held in docs:
        text = f"{QWEN['repo_name']}demo\n"
        for f in held:
            text += f"{QWEN['file_sep']}{f.path}\n{_content(f, fim)}"
            cuts += _content(f, fim) != f.text
        expected = reference.encode(text, add_special_tokens=False).ids
        placed = 1 + len(held) + 3 * sum(_content(f, fim) != f.text for f in held)
        assert sum(1 for i in ids[:-1].tolist() if i in markers.ids) == placed
        assert reference.decode(ids[:-1].tolist(), skip_special_tokens=False) == text
        if not any(f.path == "notes.py" for f in held):
            assert ids[:-1].tolist() == expected
        else:  # the reference takes the comment's spelled markers for markers; we do not
            spelled = sum(text.count(QWEN[r]) for r in ("prefix", "middle", "suffix", "file_sep"))
            spelled += text.count(QWEN["repo_name"]) - placed
            assert spelled > 0 or fim is not None  # with FIM the draw may cut through them
            assert len([i for i in expected if i in markers.ids]) == placed + spelled
        assert ids[-1] == tok.eos_id
        assert len(ids) <= 60 or len(held) == 1
    assert [f for _, held in docs for f in held] == files
    if fim is not None:
        assert 0 < cuts < len(files)  # some files cut, some left whole


def _build(recipe: dict, where: Path) -> dict:
    path = where / "recipe.json"
    path.write_text(json.dumps(recipe))
    proc = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((Path(recipe["output"]) / "manifest.json").read_text())


def _table_recipe(tmp_path: Path, qwen_coder: Path, **keys: object) -> dict:
    """A build of `table.jsonl` (rows with `repo_name` and `path`) with the Qwen-coder tokenizer,
    plus the recipe `keys` given."""
    return {
        "output": str(tmp_path / "out"),
        "seq_len": 512,
        "tokenizer": {"hf": str(qwen_coder)},
        "mix": {"ratio": {"code": 1}},
        "executor": {"kind": "local", "tasks": 1, "workers": 1},
        "val_fraction": 0,
        "filters": {"code": {"enabled": False}},
        "sources": [
            {
                "name": "t",
                "domain": "code",
                "format": "jsonl",
                "paths": [str(tmp_path / "table.jsonl")],
                "path_key": "path",
                "metadata_keys": ["repo_name"],
                "language": "Python",
            }
        ],
        **keys,
    }


def test_build_writes_the_models_repository_format(qwen_coder, llama2_tokenizer, tmp_path):
    """A build with `tokenizer: {hf: ...}` of a model with repository tokens writes them:
    every document decodes to the repository string, which the model's tokenizer encodes to
    the very ids of the shard; `repos.format: markers` on a model without them is refused."""
    rows = [
        {"id": str(i), "repo_name": "acme/tool", "path": p, "text": t}
        for i, (p, t) in enumerate(sorted(FILES.items()))
        if p != "notes.py"
    ]
    write_jsonl(tmp_path / "table.jsonl", rows)
    recipe = _table_recipe(tmp_path, qwen_coder, repos={"order": "imports", "format": "markers"})
    manifest = _build(recipe, tmp_path)
    assert manifest["counts"]["repositories"]["format"] == "markers"
    out = tmp_path / "out"
    tokens = np.fromfile(out / manifest["shards"][0]["file"], dtype=manifest["dtype"])
    ends = np.fromfile(out / manifest["shards"][0]["index"], dtype=np.uint64).astype(int)
    reference = _reference(qwen_coder)
    eos = open_tokenizer(qwen_coder).eos_id
    texts = []
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        ids = tokens[start:end].tolist()
        text = reference.decode(ids[:-1], skip_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False).ids + [eos]
        texts.append(text)
    assert texts == [
        f"{QWEN['repo_name']}acme/tool\n"
        f"{QWEN['file_sep']}pkg/core.py\n{FILES['pkg/core.py']}"
        f"{QWEN['file_sep']}pkg/__init__.py\n{FILES['pkg/__init__.py']}"
        f"{QWEN['file_sep']}pkg/cli.py\n{FILES['pkg/cli.py']}"
    ]
    llama = {**recipe, "output": str(tmp_path / "out2")}
    llama["tokenizer"] = {"model": str(llama2_tokenizer)}
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(llama))
    proc = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "lemur-data: error: recipe: repos.format markers: the tokenizer has no repository markers"
        )
    )
    # Refused before the build makes anything: no OUT/, no listing, no tokenizer copy (#44
    # item 22: an empty OUT/ and OUT/.work/ were left).
    assert not (tmp_path / "out2").exists()
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_build_with_fim_cuts_each_file_inside_its_repository(qwen_coder, tmp_path):
    """With `fim:` the files of a repository document are cut one by one, by the file's own
    draw (its id, the recipe's seed), in Qwen2.5-Coder's PSM layout inside the repository
    format; the document's ids are the model tokenizer's of that string; the row without a
    repository is cut whole by the FIM stage, as any single-file document."""
    rows = [
        {"id": f"r{i}", "repo_name": "acme/tool", "path": p, "text": t}
        for i, (p, t) in enumerate(sorted(FILES.items()))
        if p != "notes.py"
    ]
    rows.append({"id": "alone", "path": "alone.py", "text": "def alone():\n    return 42\n" * 3})
    write_jsonl(tmp_path / "table.jsonl", rows)
    fim = {"rate": 0.5, "spm_rate": 0.0}
    recipe = _table_recipe(tmp_path, qwen_coder, seed=3, repos={"order": "path"}, fim=fim)
    manifest = _build(recipe, tmp_path)
    out = tmp_path / "out"
    tokens = np.fromfile(out / manifest["shards"][0]["file"], dtype=manifest["dtype"])
    ends = np.fromfile(out / manifest["shards"][0]["index"], dtype=np.uint64).astype(int)
    reference = _reference(qwen_coder)
    docs = {}
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        ids = tokens[start:end].tolist()
        text = reference.decode(ids[:-1], skip_special_tokens=False)
        assert ids[:-1] == reference.encode(text, add_special_tokens=False).ids
        docs[text.startswith(QWEN["repo_name"])] = text
    settings = FimConfig(**fim)
    files = [RepoFile(r["path"], r["text"], "Python", f"t/{r['id']}") for r in rows[:-1]]
    want = f"{QWEN['repo_name']}acme/tool\n"
    for f in sorted(files, key=lambda f: f.path):
        want += f"{QWEN['file_sep']}{f.path}\n{_content(f, settings, seed=3)}"
    assert docs[True] == want
    cut = [f.path for f in files if _content(f, settings, seed=3) != f.text]
    assert 0 < len(cut) < len(files)  # the draw cut some files and left others whole
    alone = fim_split(rows[-1]["text"], settings, "t/alone", 3)
    assert docs[False].startswith(QWEN["prefix"]) == (alone is not None)


@pytest.mark.parametrize(
    ("train", "fim", "refused"),
    [("sentencepiece", None, True), ("byte-bpe", None, True), ("byte-bpe", {"rate": 0.5}, False)],
)
def test_trained_tokenizers_repository_markers_are_known_before_training(
    tmp_path, train, fim, refused
):
    """`repos.format: markers` with a tokenizer to train: only a FIM build's byte-level BPE
    gets repository markers; the others are refused before anything is made or trained."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict
    from lemur.data.repos.stage import RepoFormatError, check_repo_format

    write_jsonl(tmp_path / "table.jsonl", [{"repo_name": "a/b", "path": "x.py", "text": "x"}])
    raw = _table_recipe(tmp_path, tmp_path, repos={"format": "markers"})
    raw["tokenizer"] = {"train": {"kind": train, "vocab_size": 600}}
    if fim is not None:
        raw["fim"] = fim
    recipe = recipe_from_dict(raw)
    if not refused:
        check_repo_format(recipe)  # nothing to refuse
        return
    with pytest.raises(RepoFormatError, match="repos.format markers: the tokenizer has no"):
        build(recipe)
    assert not (tmp_path / "out").exists()
