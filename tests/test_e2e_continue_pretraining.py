"""End to end: continued pre-training of a Llama-3-style Hugging Face model, every command.

HF folder (a random `LlamaForCausalLM`, 128,256 ids, rope theta 500000 with Llama-3.1's
rope scaling, untied head, Llama-3's real tokenizer files) -> `lemur-data build` with
`tokenizer: {hf: FOLDER}` on real code and text -> two steps of `lemur-train continue`
with `model.init_from: FOLDER` -> `lemur-convert from-run` -> `lemur-convert to-hf` ->
transformers loads the export, its greedy generation equals `lemur-eval generate` token for
token, and the exported tokenizer files are the folder's, byte for byte.

Then `lemur-eval bpb` on a Llama-3 shard directory (uint32 ids): its byte count is the
UTF-8 length of the decoded val documents.

Each command runs through its `main()` in this process (the console scripts call the same
function). The model is tiny except for its 128,256 embedding rows (hidden size 32, two
layers), and the run is 2 steps of 2 x 64 tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: the model here is random

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from bytelevel_fixtures import random_llama3_model  # noqa: E402
from conftest import STDLIB, real_python_files, real_text_docs, write_jsonl  # noqa: E402
from e2e_steps import build_corpus, train_two_steps  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.eval import cli as eval_cli  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.e2e

BOS, EOS = 128000, 128001  # <|begin_of_text|>, <|end_of_text|>
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\nclass ",
    "The quick brown fox",
    "Grüße aus Zürich — 東京の天気は",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama-3-style model saved by transformers, with Llama-3's tokenizer files."""
    return random_llama3_model(
        tmp_path_factory.mktemp("llama3") / "hf",
        # Llama-3.1's scaling, its context shrunk so that it changes 3 of the 4 frequencies.
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )


def _code_and_text(root: Path) -> list[dict]:
    """Real code (12 stdlib modules) and real text (Python's help topics) as two domains."""
    code = root / "code"
    code.mkdir()
    for p in real_python_files(12):
        (code / p.name).write_bytes(p.read_bytes())
    text = write_jsonl(root / "text.jsonl", real_text_docs(20))
    return [
        {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
        {"name": "docs", "domain": "text", "format": "jsonl", "paths": [str(text)]},
    ]


def _hf_greedy(model, tok, prompt: str) -> tuple[list[int], list[int]]:
    """transformers' prompt ids and greedy continuation (cut before EOS, as lemur cuts it)."""
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, do_sample=False, max_new_tokens=NEW_TOKENS)
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    return ids["input_ids"][0].tolist(), new[: new.index(EOS)] if EOS in new else new


def test_continue_pretraining_llama3_end_to_end(hf_folder: Path, tmp_path: Path) -> None:
    data = build_corpus(
        tmp_path,
        hf_folder,
        _code_and_text(tmp_path),
        mix={"ratio": {"code": 2, "text": 1}},
        val_fraction=0.1,
    )
    manifest = json.loads((data / "manifest.json").read_text())
    tok = manifest["tokenizer"]
    assert (manifest["dtype"], tok["kind"], tok["vocab_size"]) == (
        "uint32",
        "tokenizer.json",
        128256,
    )
    assert (tok["bos_id"], tok["eos_id"]) == (BOS, EOS)

    run = train_two_steps(hf_folder, data, tmp_path / "run")

    lemur_dir, hf_out = tmp_path / "lemur", tmp_path / "out"
    assert convert.main(["from-run", str(run), str(lemur_dir)]) == 0
    assert convert.main(["to-hf", str(lemur_dir), str(hf_out), "--dtype", "float32"]) == 0
    for name in TOKENIZER_FILES:
        assert (hf_out / name).read_bytes() == (hf_folder / name).read_bytes(), name

    rows = [{"prompt": p} for p in PROMPTS]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    argv = ["generate", str(lemur_dir), "--prompts", str(tmp_path / "prompts.jsonl")]
    argv += ["--max-new-tokens", str(NEW_TOKENS), "--out", str(tmp_path / "gen.jsonl")]
    assert eval_cli.main(argv) == 0
    ours = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_out)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    exported = json.loads((hf_out / "config.json").read_text())
    assert (exported["vocab_size"], exported["rope_theta"]) == (128256, 500000.0)
    assert exported["rope_scaling"]["rope_type"] == "llama3"
    # Trained: the export is not the folder it started from.
    start = transformers.AutoModelForCausalLM.from_pretrained(hf_folder)
    assert not torch.equal(start.lm_head.weight, model.lm_head.weight)
    for prompt, row in zip(PROMPTS, ours, strict=True):
        prompt_ids, new = _hf_greedy(model, hf_tok, prompt)
        assert prompt_ids[0] == BOS and row["prompt_tokens"] == len(prompt_ids), prompt
        assert row["completion_ids"] == new, prompt
        assert row["completion"] == hf_tok.decode(new, clean_up_tokenization_spaces=False)
    assert len({tuple(r["completion_ids"]) for r in ours}) > 1  # not one degenerate answer


def _non_ascii_snippets(n: int) -> list[dict]:
    """Real code with multi-byte characters: from each of the first `n` stdlib modules
    holding any, the 200 characters around its widest character (2 to 4 UTF-8 bytes)."""
    rows = []
    for path in sorted(STDLIB.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        at = max(range(len(text)), default=0, key=lambda i: len(text[i].encode("utf-8", "replace")))
        if text and ord(text[at]) > 127:
            rows.append({"text": text[max(0, at - 100) : at + 100]})
        if len(rows) == n:
            return rows
    raise AssertionError(f"fewer than {n} stdlib modules with non-ASCII characters")


def test_bpb_bytes_are_the_decoded_val_documents_utf8_length(
    hf_folder: Path, tmp_path: Path
) -> None:
    rows = _non_ascii_snippets(60)
    source = {"name": "snippets", "domain": "code", "format": "jsonl"}
    source["paths"] = [str(write_jsonl(tmp_path / "snippets.jsonl", rows))]
    data = build_corpus(
        tmp_path,
        hf_folder,
        [source],
        mix={"ratio": {"code": 1}},
        val_fraction=0.1,
    )
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["dtype"] == "uint32"
    (val,) = [s for s in manifest["shards"] if s["split"] == "val"]
    tokens = np.fromfile(data / val["file"], dtype="<u4")
    ends = np.fromfile(data / val["index"], dtype="<u8").tolist()
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_folder)
    texts = [
        hf_tok.decode(
            tokens[s:e].tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        for s, e in zip([0, *ends[:-1]], ends, strict=True)
    ]
    assert all(len(t.encode("utf-8")) > len(t) for t in texts)  # multi-byte characters
    # One window holds the whole val stream: every token after the first is a target, and
    # all but the other documents' <|begin_of_text|> are scored.
    argv = ["bpb", str(hf_folder), str(data), "--seq-len", str(len(tokens) - 1)]
    argv += ["--batch-size", "1", "--no-languages", "--json", str(tmp_path / "bpb.json")]
    assert eval_cli.main(argv) == 0
    (result,) = json.loads((tmp_path / "bpb.json").read_text())["results"]
    score = result["domains"]["code"]
    assert score["windows"] == 1 and score["tokens"] == len(tokens) - len(ends)
    assert score["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
