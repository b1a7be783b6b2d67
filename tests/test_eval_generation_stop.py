"""Generation stops where transformers' `generate` stops: at every `eos_token_id` of the
model folder's generation_config.json (Llama-3-Instruct lists three), not only the EOS."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from bytelevel_fixtures import random_llama3_model  # noqa: E402
from conftest import write_jsonl  # noqa: E402

from lemur.eval import cli as eval_cli  # noqa: E402
from lemur.eval.agent_decode import TurnDecoder  # noqa: E402
from lemur.eval.decoding import GenerationConfig  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.tokenizer import open_tokenizer  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EOS = 128001  # <|end_of_text|>
PROMPT = "def fibonacci(n):\n    "
NEW_TOKENS = 16


def _greedy(folder: Path) -> list[int]:
    """transformers' greedy continuation of PROMPT with the folder's generation_config."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, do_sample=False, max_new_tokens=NEW_TOKENS)
    return out[0, ids["input_ids"].shape[1] :].tolist()


def test_generation_stops_at_every_eos_id_of_generation_config(tmp_path: Path) -> None:
    folder = random_llama3_model(tmp_path / "hf", eos_token_id=EOS)
    free = _greedy(folder)
    assert len(free) == NEW_TOKENS and EOS not in free
    # A token the model emits mid-way, never before: declared an end of turn, it must end
    # the reply there (as <|eot_id|> ends a Llama-3-Instruct reply).
    k = next(k for k in range(3, NEW_TOKENS) if free[k] not in free[:k])
    stop = free[k]
    gen_config = json.loads((folder / "generation_config.json").read_text())
    gen_config["eos_token_id"] = [EOS, stop]
    (folder / "generation_config.json").write_text(json.dumps(gen_config))
    assert _greedy(folder) == free[: k + 1]  # transformers stops there, the stop id kept
    assert open_tokenizer(folder).stop_ids == (EOS, stop)

    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": PROMPT}])
    argv = ["generate", str(folder), "--prompts", str(tmp_path / "prompts.jsonl")]
    argv += ["--max-new-tokens", str(NEW_TOKENS), "--out", str(tmp_path / "gen.jsonl")]
    assert eval_cli.main(argv) == 0
    [row] = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]
    assert (row["completion_ids"], row["finish"]) == (free[:k], "eos")

    # The agent's decoder stops there too (it takes the tokenizer's stop ids).
    loaded = load_model(folder)
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, batch_size=1)
    decoder = TurnDecoder(loaded.params, loaded.config, gen, tokenizer=loaded.tokenizer)
    prompt = [128000, *loaded.tokenizer.encode(PROMPT)]
    [turn] = decoder.reply([("task", prompt)])
    assert (turn.completion.tokens, turn.completion.finish) == (free[:k], "eos")
