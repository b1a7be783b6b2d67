"""lemur-eval end to end on a tiny run checkpoint, and lemur.eval.load's model kinds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import real_python_files, real_text_docs
from test_eval_bpb import UNICODE, _write_shards

from lemur.eval import cli
from lemur.eval.load import LoadError, load_model
from lemur.model import checkpoint as model_checkpoint
from lemur.model import pretrained
from lemur.train.checkpoint import Checkpointer
from lemur.train.config import load_train_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, tokenizer_model: Path) -> Path:
    docs = {
        "code": [p.read_text()[:800] for p in real_python_files(3)],
        "text": [UNICODE, real_text_docs(1)[0]["text"][:600]],
    }
    return _write_shards(tmp_path_factory.mktemp("eval") / "shards", tokenizer_model, docs)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> Path:
    """A run directory as lemur-train leaves it: config.yaml and one orbax checkpoint."""
    run = tmp_path_factory.mktemp("run")
    config = load_train_config("tiny", [f"data.dirs=[{shards}]", f"run_dir={run}"])
    vocab = json.loads((shards / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    model = config.model.llama(vocab)
    params = jax.jit(llama_init, static_argnums=0)(model, jax.random.key(0, impl="rbg"))
    state = {
        "step": np.int32(7),
        "params": params,
        "opt_state": {"mu": params},
        "rng": np.zeros(2, np.uint32),
    }
    ckpt = Checkpointer(run / "checkpoints", async_save=False)
    ckpt.save(7, state, {"next": 0}, {"config": config.to_dict(), "vocab_size": vocab})
    ckpt.close()
    (run / "config.yaml").write_text(config.to_yaml())
    return run


def llama_init(config, key):  # noqa: ANN001, ANN201 - jitted with a static config
    from lemur.model import llama

    return llama.init_params(config, key)


def test_run_dir_loads_params_only(run_dir: Path, shards: Path, tmp_path: Path) -> None:
    loaded = load_model(run_dir)
    assert loaded.kind == "run" and loaded.config.d_model == 64
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab_size == loaded.config.vocab_size
    step = load_model(run_dir / "checkpoints" / "7")
    np.testing.assert_array_equal(
        np.asarray(step.params["embed"]), np.asarray(loaded.params["embed"])
    )
    # The same weights as a lemur model checkpoint (what lemur-convert writes).
    model_checkpoint.save_params(tmp_path / "ckpt", jax.device_get(loaded.params), loaded.config)
    assert pretrained.folder_kind(tmp_path / "ckpt") == "lemur"
    again = load_model(tmp_path / "ckpt", tokenizer=loaded.tokenizer.path)
    np.testing.assert_array_equal(
        np.asarray(again.params["final_norm"]), np.asarray(loaded.params["final_norm"])
    )
    with pytest.raises(LoadError, match="not a lemur run"):
        load_model(shards)


def test_a_relative_run_path_loads(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lemur-eval generate out/demo-train`: a path relative to the working directory."""
    monkeypatch.chdir(run_dir.parent)
    loaded = load_model(run_dir.name)
    assert loaded.kind == "run" and loaded.config.d_model == 64


def test_bpb_command(
    run_dir: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bpb.json"
    assert cli.main(["bpb", str(run_dir), str(shards), "--seq-len", "32", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["results"][0]
    assert set(result["domains"]) == {"code", "text"}
    for score in result["domains"].values():
        assert 0 < score["bits_per_byte"] < 20 and score["tokens"] > 0
    assert "bits per byte" in capsys.readouterr().out


def test_generate_command(run_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "out.jsonl"
    argv = [
        "generate",
        str(run_dir),
        "--prompts",
        str(prompts),
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["Hello", "def add(a, b):"]
    assert rows[1]["id"] == "a" and all(0 < r["new_tokens"] <= 6 for r in rows)
    assert cli.main(["generate", str(run_dir), "--prompt", "x", "--chat"]) == 2  # no ChatML


@pytest.mark.parametrize("max_new", ["1000000000", "99999999999999999999"])
def test_a_kv_cache_beyond_the_device_is_one_line(
    run_dir: Path, max_new: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--max-new-tokens` whose KV cache cannot fit (a RESOURCE_EXHAUSTED traceback asking
    for 512 GB; past int64, a JAX TypeError): one line naming the flags, exit 2, before
    anything is allocated."""
    capsys.readouterr()
    argv = ["generate", str(run_dir), "--prompt", "x", "--max-new-tokens", max_new]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("lemur-eval: run model from"), err  # the model line, then:
    assert len(err) == 2 and "lower --max-new-tokens or --batch-size" in err[1], err


def test_chat_prompt_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A "messages" row needs --chat and well-formed messages: else one line, exit 2."""
    rows = tmp_path / "rows.jsonl"
    good = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for row, chat, message in [
        ({"messages": good}, False, 'rows.jsonl:1: needs a string "prompt"'),
        ({"messages": [{"role": "user"}]}, True, 'rows.jsonl:1: "messages" must be'),
        ({"messages": []}, True, 'rows.jsonl:1: "messages" must be'),
        ({"messages": good, "prompt": "x"}, True, 'rows.jsonl:1: "messages" must be'),
    ]:
        rows.write_text(json.dumps(row) + "\n")
        argv = ["generate", str(tmp_path / "none"), "--prompts", str(rows)]
        assert cli.main(argv + ["--chat"] * chat) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_humaneval_command(run_dir: Path, tmp_path: Path) -> None:
    argv = [
        "humaneval",
        str(run_dir),
        "--limit",
        "2",
        "--n",
        "2",
        "--k",
        "1",
        "--k",
        "2",
        "--temperature",
        "1.0",
        "--max-new-tokens",
        "8",
        "--timeout",
        "5",
        "--out",
        str(tmp_path / "he"),
    ]
    assert cli.main(argv) == 0
    summary = json.loads((tmp_path / "he" / "summary.json").read_text())
    assert summary["samples"] == 4 and "pass@2" in summary and summary["sandbox"]
    assert len((tmp_path / "he" / "samples.jsonl").read_text().splitlines()) == 4


def test_bpb_of_a_directory_without_val_shards_is_one_line(
    run_dir: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard directory with no val split (a build with val_fraction 0): one line naming
    it, exit 2 (it printed an empty table, exit 0)."""
    train_only = tmp_path / "train-only"
    shutil.copytree(shards, train_only)
    manifest = json.loads((train_only / "manifest.json").read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["split"] != "val"]
    (train_only / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["bpb", str(run_dir), str(train_only)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1] == f"lemur-eval: {train_only}: no val shards to score (built with val_fraction 0?)"
    )


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bpb", str(tmp_path / "missing"), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such directory" in err[0]
    assert cli.main(["humaneval"]) == 2


def test_humaneval_bad_task_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tasks` with a broken line: one line naming the file and the line (exit 2)."""
    good = {"prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(good) + "\n\n" + '{"prompt": "def g():\\n",}\n')
    assert cli.main(["humaneval", "--canonical", "--tasks", str(tasks)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = "not JSON (Expecting property name enclosed in double quotes)"
    assert err == [f"lemur-eval: {tasks}:3: {expected}"]


def _exit_code(argv: list[str]) -> int:
    """lemur-eval's exit code in this process (a usage mistake exits from argparse)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["humaneval", "--canonical", "--timeout", "0"], "--timeout"),
        (["humaneval", "--canonical", "--timeout", "-1"], "--timeout"),
        (["agent", "CKPT", "--timeout", "0"], "--timeout"),
        (["humaneval", "--canonical", "--workers", "0"], "--workers"),
        (["agent", "CKPT", "--workers", "0"], "--workers"),
        (["humaneval", "--canonical", "--limit", "0"], "--limit"),
        (["agent", "CKPT", "--limit", "0"], "--limit"),
        (["agent", "CKPT", "--max-seq-len", "0"], "--max-seq-len"),
        (["generate", "CKPT", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["bpb", "CKPT", "DIR", "--seq-len", "0"], "--seq-len"),
    ],
)
def test_counts_and_times_below_one_are_refused_when_parsed(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 0 or negative count, size or time is one line naming the option, exit 2, before
    anything runs: 0 means neither "all" nor "the default" (leaving the option out does).
    A missing task file / checkpoint stands behind each, so a value let through fails on it
    instead."""
    argv = [a.replace("CKPT", str(tmp_path / "none")) for a in argv]
    argv += ["--tasks", str(tmp_path / "none.jsonl")] if argv[0] in ("humaneval", "agent") else []
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"lemur-eval {argv[0]}: "), err
    assert f"argument {flag}: must be" in err[0], err


@pytest.mark.parametrize(
    "argv, flag, says",
    [
        (["humaneval", "--canonical", "--timeout", "1e300"], "--timeout", "must be at most"),
        (["agent", "CKPT", "--timeout", "1e300"], "--timeout", "must be at most"),
        (["generate", "CKPT", "--prompt", "x", "--seed", str(2**64)], "--seed", "64-bit"),
        (["humaneval", "CKPT", "--seed", str(-(2**63) - 1)], "--seed", "64-bit"),
    ],
)
def test_values_out_of_range_are_refused_when_parsed(
    argv: list[str], flag: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finite timeout too large for the sandbox (every run failed inside with an
    OverflowError, pass@1 0.0 for correct code, exit 0) and a seed JAX cannot make a key of
    (an OverflowError traceback): one line naming the option, exit 2, as it is parsed."""
    argv = [a.replace("CKPT", str(tmp_path / "none")) for a in argv]
    argv += ["--tasks", str(tmp_path / "none.jsonl")] if argv[0] in ("humaneval", "agent") else []
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}: " in err[0] and says in err[0], err


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--canonical", "--k", "2"],
            "--k 2: more than the samples per task (--canonical checks one)",
        ),
        (
            ["CKPT", "--n", "2", "--k", "1", "--k", "3"],
            "--k 3: more than the samples per task (--n 2)",
        ),
    ],
)
def test_pass_at_k_beyond_the_samples_is_refused(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--k` above the samples per task: one line, exit 2, before anything runs (it printed
    an empty score line after every check, exit 0)."""
    argv = ["humaneval", *(a.replace("CKPT", str(tmp_path / "none")) for a in argv)]
    assert cli.main([*argv, "--tasks", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"lemur-eval: {says}"]


def test_deeply_nested_json_lines_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task or prompt line nested deeper than Python's parser goes: one line naming the
    file and the line (not a RecursionError), for each command that reads such a file; an
    agent run's summary so nested, given to `plot`, is one line too."""
    good = {"prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps(good) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    missing = str(tmp_path / "none")
    for argv in (
        ["humaneval", "--canonical", "--tasks", str(deep)],
        ["agent", missing, "--tasks", str(deep)],
        ["generate", missing, "--prompts", str(deep)],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"lemur-eval: {deep}:2: JSON nested too deeply"], argv
    summary = tmp_path / "summary.json"  # what `plot` reads: one JSON document
    summary.write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["plot", str(summary), "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"lemur-eval: {summary}: not an agent run"), err
    assert not (tmp_path / "p.png").exists()


def test_bpb_of_val_shards_without_a_window_is_one_line(
    run_dir: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Val shards shorter than one window of `--seq-len` (#44 item 7): one line naming the
    domain, the flag and the build's val_fraction, exit 2 (it printed a table whose column
    wrapped the error word by word, exit 0)."""
    manifest = json.loads((shards / "manifest.json").read_text())
    longest = max(s["tokens"] for s in manifest["shards"] if s["split"] == "val")
    capsys.readouterr()
    assert cli.main(["bpb", str(run_dir), str(shards), "--seq-len", str(longest)]) == 2
    captured = capsys.readouterr()
    assert "bits per byte" not in captured.out
    code_tokens = max(
        s["tokens"] for s in manifest["shards"] if s["split"] == "val" and s["domain"] == "code"
    )
    assert captured.err.strip().splitlines()[-1] == (
        f"lemur-eval: {shards}: val shards of domain 'code' hold no window of --seq-len "
        f"{longest} (a window takes seq_len + 1 tokens; the longest shard has {code_tokens:,}): "
        f"lower --seq-len to {code_tokens - 1} or less, or build with a larger val_fraction"
    )


def test_humaneval_prompts_beyond_the_context(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#44 item 6: a task prompt longer than the model's context (256 here) is one line
    naming the task, its length and the flags, exit 2 (it named neither, and humaneval had
    no --max-seq-len); `--long-prompts skip` leaves it out and `truncate` cuts it, each
    counted in summary.json and on the console; `--max-seq-len` raises the context."""
    from lemur.eval.load import load_model

    tok = load_model(run_dir).tokenizer
    check = "def check(f):\n    assert f() == 1\n"
    long_prompt = "def f():\n    " + "# " + "padding words " * 200 + "\n"
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"task_id": "short/0", "prompt": "def f():\n", "test": check, "entry_point": "f"},
        {"task_id": "long/1", "prompt": long_prompt, "test": check, "entry_point": "f"},
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    length = 1 + len(tok.encode(long_prompt))
    assert length > 256
    base = ["humaneval", str(run_dir), "--tasks", str(tasks), "--max-new-tokens", "2"]
    capsys.readouterr()
    assert cli.main([*base, "--out", str(tmp_path / "refused")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lemur-eval: long/1: a prompt of {length} tokens exceeds the context of 256 tokens "
        "(1 of 2 tasks): raise --max-seq-len, or pass --long-prompts skip or truncate (left "
        "out, cut to the BOS and the prompt's last tokens, counted in the report)"
    )
    assert not (tmp_path / "refused").exists()
    for policy, tasks_scored in (("skip", 1), ("truncate", 2)):
        out = tmp_path / policy
        assert cli.main([*base, "--long-prompts", policy, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        done = "skipped" if policy == "skip" else "truncated"
        assert summary["tasks"] == tasks_scored
        assert summary["long_prompts"][f"{done}_tasks"] == ["long/1"]
        assert summary["long_prompts"]["context_tokens"] == 256
        assert f"; 1 task {done} (prompt over 256 tokens)" in capsys.readouterr().out
    out = tmp_path / "longer"
    assert cli.main([*base, "--max-seq-len", str(length), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 2 and summary["long_prompts"]["skipped"] == 0


def test_bpb_prints_plain_progress_lines_without_a_terminal(
    run_dir: Path,
    shards: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#44 item 9: without a terminal (a log file, nohup, Slurm), `bpb` prints a plain line
    per domain at a steady interval (windows done / total, elapsed, ETA) and its wall time
    at its end; it printed nothing until the table (20 s on the demo)."""
    import re
    import time

    from lemur.eval import bpb

    real = bpb.token_nll

    def slow(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a batch that takes a while
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(bpb, "token_nll", slow)
    monkeypatch.setenv("LEMUR_PROGRESS_INTERVAL", "0.05")
    capsys.readouterr()
    argv = ["bpb", str(run_dir), str(shards), "--seq-len", "16", "--batch-size", "1"]
    assert cli.main([*argv, "--max-windows", "3", "--no-languages"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    for domain in ("code", "text"):
        stage = f"lemur-eval: bpb {shards} {domain}"
        assert any(
            re.fullmatch(rf"{re.escape(stage)}: [0-3]/3 windows, \ds elapsed(, ETA \ds)?", line)
            for line in err
        ), err
        assert any(re.fullmatch(rf"{re.escape(stage)}: 3/3 windows done in \ds", x) for x in err)
    assert "bits per byte" in captured.out
