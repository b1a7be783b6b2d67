"""`lemur-eval agent` end to end on a tiny ChatML model exported with `lemur-convert to-hf`:
every turn's prompt ids are transformers' `apply_chat_template` of the transcript so far,
and a rerun with the same settings gives the same transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm
from conftest import real_python_files, write_jsonl
from test_eval_agent import MBPP, needs_network
from test_eval_generate import random_params

from lemur.chatml import CHAT_PIECES
from lemur.convert import cli as convert
from lemur.data.encode.tokenizer import train_tokenizer
from lemur.data.recipe.tokenizer import TokenizerTrainConfig
from lemur.eval import cli as eval_cli
from lemur.eval.agent_tasks import load_agent_tasks
from lemur.model import checkpoint
from lemur.model.config import LlamaConfig

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A random tiny Llama with a ChatML SentencePiece tokenizer, exported to HF."""
    tmp = tmp_path_factory.mktemp("agent-model")
    texts = [p.read_text() for p in real_python_files(30)]
    train_tokenizer(texts, TokenizerTrainConfig(vocab_size=600), tmp / "t.model", CHAT_PIECES)
    vocab = spm.SentencePieceProcessor(model_file=str(tmp / "t.model")).vocab_size()
    config = LlamaConfig(
        vocab_size=vocab,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        dtype="float32",
        init_std=0.1,
        max_seq_len=1024,
    )
    checkpoint.save_params(tmp / "lemur", random_params(config, 11), config, tmp / "t.model")
    assert convert.main(["to-hf", str(tmp / "lemur"), str(tmp / "hf")]) == 0
    return tmp / "hf"


def agent(hf: Path, tasks: Path, out: Path) -> list[dict]:
    argv = ["agent", str(hf), "--tasks", str(tasks), "--turns", "3", "--feedback", "exec"]
    argv += ["--max-new-tokens", "24", "--batch-size", "2", "--observation-role", "tool"]
    argv += ["--record-ids", "--out", str(out)]
    assert eval_cli.main(argv) == 0
    lines = (out / "transcripts.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["task_id"])


@needs_network
def test_agent_prompts_are_the_chat_template_of_the_transcript(hf_model, tmp_path) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", MBPP[:3])  # 3 conversations, 2 rows
    records = agent(hf_model, tasks, tmp_path / "run")
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_model))
    checked = 0
    for r in records:
        assistant = [k for k, m in enumerate(r["messages"]) if m["role"] == "assistant"]
        assert len(assistant) == len(r["turn_records"]) == r["turns"]
        for k, turn in zip(assistant, r["turn_records"], strict=True):
            ids = tok.apply_chat_template(r["messages"][:k], add_generation_prompt=True)
            ids = list(ids if isinstance(ids, list) else ids["input_ids"])
            assert turn["prompt_ids"] == ids, (r["task_id"], turn["turn"])
            checked += 1
        # The previous turn's prompt stays cached: at most the reply (a random model's
        # bytes re-encode otherwise) and the observation are prefilled again.
        turns = r["turn_records"]
        for before, turn in zip(turns, turns[1:], strict=False):
            assert turn["prefilled_tokens"] <= turn["prompt_tokens"] - before["prompt_tokens"]
    assert checked == 9 and {m["role"] for r in records for m in r["messages"]} == {
        "user",
        "assistant",
        "tool",
    }
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tasks"] == 3 and len(summary["success_rate_by_turn"]) == 3
    assert (tmp_path / "run" / "success_by_turn.png").read_bytes()[:4] == b"\x89PNG"
    again = agent(hf_model, tasks, tmp_path / "again")

    def without_times(records: list[dict]) -> list[dict]:
        for r in records:
            for t in r["turn_records"]:
                t.pop("generate_s"), t.pop("exec_s")
        return records

    assert without_times(again) == without_times(records)
    assert [t.task_id for t in load_agent_tasks(str(tasks))] == ["fix", "never", "nocode"]


@needs_network
def test_a_turn_budget_beyond_the_context_is_refused(hf_model, tmp_path, capsys) -> None:
    """`--turns` above the context length (each turn adds a token at least, so the budget
    can never be used): one line, exit 2, nothing written. It ran, then hung building the
    success curve of every budget up to it (`--turns 99999999999999999999`)."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", MBPP[:1])
    argv = ["agent", str(hf_model), "--tasks", str(tasks), "--feedback", "none"]
    argv += ["--max-seq-len", "8", "--turns", "9", "--out", str(tmp_path / "run")]
    assert eval_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "lemur-eval: --turns 9: more than the context holds (8 tokens)", err
    assert not (tmp_path / "run").exists()


@needs_network
def test_tasks_the_model_could_not_reply_to_are_refused(hf_model, tmp_path, capsys) -> None:
    """#44 item 5: a first prompt plus --max-new-tokens beyond the context (the chat demo
    model's 256 with the default 512 new tokens) left every task `context_full` before the
    model said anything, and the run printed `success rate by turn 0.000 ...`, exit 0. Now
    one line naming the task, the lengths and the flags, exit 2, nothing written. The
    context is a setting of the run: a rerun with another `--max-seq-len` does not reuse
    transcripts made under the old one."""
    from lemur.eval.agent import AgentConfig, prompt_ids, start
    from lemur.tokenizer import open_tokenizer

    tasks = write_jsonl(tmp_path / "tasks.jsonl", MBPP[:2])
    first = load_agent_tasks(str(tasks))[0]
    tok = open_tokenizer(hf_model / "tokenizer.model")
    length = len(prompt_ids(tok, start(first, AgentConfig()).messages))
    argv = ["agent", str(hf_model), "--tasks", str(tasks), "--feedback", "none", "--turns", "1"]
    capsys.readouterr()
    assert eval_cli.main([*argv, "--max-new-tokens", "1000", "--out", str(tmp_path / "a")]) == 2
    captured = capsys.readouterr()
    assert "success rate" not in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        f"lemur-eval: {first.task_id}: its first prompt ({length} tokens) and "
        "--max-new-tokens 1000 exceed the context of 1024 tokens (2 of 2 tasks): the model "
        "could not reply; lower --max-new-tokens or raise --max-seq-len"
    )
    assert not (tmp_path / "a").exists()
    run = [*argv, "--max-new-tokens", "4", "--out", str(tmp_path / "b")]
    assert eval_cli.main(run) == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["max_seq_len"] == 1024
    assert eval_cli.main([*run, "--max-seq-len", "2048"]) == 2
    assert "holds a run with other settings (max_seq_len)" in capsys.readouterr().err
