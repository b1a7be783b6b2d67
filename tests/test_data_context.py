"""The build's context (lemur/data/context.py): the prepared tokenizer is opened once in the
build's process, however many stages and checks use it (FIM markers, repository format, the
tokenize writer, the group stage: five opens before the context held it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bytelevel_fixtures import qwen_like_folder
from conftest import real_python_files, real_text_docs, write_jsonl

from lemur.tokenizer.bytelevel import ByteLevelTokenizer
from lemur.tokenizer.fim import MARKER_STYLES
from lemur.tokenizer.sentencepiece import SentencePieceTokenizer


@pytest.fixture(scope="module")
def qwen_coder(tmp_path_factory) -> Path:
    """A Qwen2.5-style folder with Qwen2.5-Coder's FIM and repository tokens (not special)."""
    from tokenizers import AddedToken, Tokenizer

    texts = [p.read_text() for p in real_python_files(20)] + [d["text"] for d in real_text_docs(20)]
    folder = qwen_like_folder(tmp_path_factory.mktemp("qwen"), texts, vocab_size=1500)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    qwen = MARKER_STYLES["qwen2.5-coder"]
    names = [qwen[r] for r in ("prefix", "middle", "suffix", "pad", "repo_name", "file_sep")]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in names])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _count_opens(monkeypatch, under: Path) -> list[str]:
    """The tokenizers this process opens from files under `under`, as they are opened."""
    opened: list[str] = []
    for cls, path_of in (
        (ByteLevelTokenizer, lambda args: args[0].path),
        (SentencePieceTokenizer, lambda args: args[0]),
    ):
        init = cls.__init__

        def counted(self, *args, _init=init, _path_of=path_of, **kw):
            path = Path(_path_of(args)).resolve()
            if path.is_relative_to(under.resolve()):
                opened.append(str(path))
            _init(self, *args, **kw)

        monkeypatch.setattr(cls, "__init__", counted)
    return opened


def test_a_build_opens_its_tokenizer_once_in_its_process(qwen_coder, tmp_path, monkeypatch):
    """A FIM build of repository documents with a tokenizer.json: the prepared copy under
    `.work/` is opened once here (its tasks run in worker processes of their own)."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    rows = [
        {"repo_name": f"o/r{i % 3}", "path": p.name, "text": p.read_text()}
        for i, p in enumerate(real_python_files(12))
    ]
    # Two files, so two tasks on two workers: no task runs in this process.
    tables = [write_jsonl(tmp_path / f"table{i}.jsonl", rows[i::2]) for i in range(2)]
    recipe = recipe_from_dict(
        {
            "output": str(tmp_path / "out"),
            "seq_len": 512,
            "tokenizer": {"hf": str(qwen_coder)},
            "mix": {"ratio": {"code": 1}},
            "executor": {"kind": "local", "tasks": 2, "workers": 2},
            "val_fraction": 0,
            "filters": {"code": {"enabled": False}},
            "fim": {"rate": 0.5},
            "repos": {"format": "markers"},
            "sources": [
                {
                    "name": "t",
                    "domain": "code",
                    "format": "jsonl",
                    "paths": [str(t) for t in tables],
                    "path_key": "path",
                    "metadata_keys": ["repo_name"],
                    "language": "Python",
                }
            ],
        }
    )
    opened = _count_opens(monkeypatch, tmp_path / "out" / ".work")
    manifest = build(recipe)
    assert manifest["counts"]["repositories"]["format"] == "markers" and "fim" in manifest
    assert len(opened) == 1, opened
