"""What a build's log says when no terminal shows it (nohup, Slurm, CI): progress lines per
stage, resumed work, a taken-over lock, an up-to-date rerun (#44 items 9, 10)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import base_recipe


def _cli(*args: str, interval: str = "0.05") -> subprocess.CompletedProcess:
    """`lemur-data ARGS` with stdout and stderr to pipes (no terminal), as in a log file."""
    env = {**os.environ, "LEMUR_PROGRESS_INTERVAL": interval}
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args], capture_output=True, text=True, env=env
    )


@pytest.fixture
def recipe(tmp_path: Path, corpus_dir: Path, tokenizer_model: Path) -> Path:
    raw = base_recipe(
        tmp_path,
        corpus_dir / "code",
        [corpus_dir / "a.jsonl"],
        tokenizer={"model": str(tokenizer_model)},
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_build_logs_plain_progress_lines(recipe: Path, tmp_path: Path) -> None:
    res = _cli("build", str(recipe))
    assert res.returncode == 0, res.stderr
    # A stage longer than the interval (0.05 s here): a line each interval with its counts
    # and elapsed time, then one with its wall time.
    assert re.search(r"^lemur-data: tokenize: [01]/2 tasks, \d+s elapsed", res.stderr, re.M)
    assert re.search(r"^lemur-data: tokenize: 2/2 tasks done in \d+s$", res.stderr, re.M)
    assert re.search(r"^lemur-data: build done in \d+s$", res.stderr, re.M), res.stderr
    # No bar drawn into the log (rich's final render of bars without a terminal).
    assert "━" not in res.stderr and "list inputs" not in res.stdout
    out = tmp_path / "out"
    shards = len(json.loads((out / "manifest.json").read_text())["shards"])
    assert res.stdout.splitlines()[-1].startswith(f"wrote {shards} shards to {out}: ")


def test_reruns_say_what_they_resume_and_that_nothing_was_written(
    recipe: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert _cli("build", str(recipe)).returncode == 0
    shards = len(json.loads((out / "manifest.json").read_text())["shards"])

    # An up-to-date rerun writes nothing, and says so.
    res = _cli("build", str(recipe))
    assert res.returncode == 0, res.stderr
    assert "wrote" not in res.stdout
    assert res.stdout.splitlines()[-1] == (
        f"nothing written: {out} already holds this build ({shards} shards); --force rebuilds it"
    )

    # A build killed after one of its two tokenize tasks (its completion marker gone, so
    # the task reruns), with the lock file its holder left: both are said.
    (marker,) = sorted(out.glob(".work/tokens-*/logs/completions/00001"))
    marker.unlink()
    (out / "manifest.json").unlink()
    (out / ".lock").write_text(json.dumps({"pid": 999999, "host": "gone", "started": 0}))
    res = _cli("build", str(recipe))
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert "lemur-data: tokenize: 1 of 2 tasks already done, resuming" in lines
    assert "lemur-data: dedup cluster: already done" in lines
    assert (
        f"lemur-data: {out}/.lock: taking over from a build that is gone: pid 999999 on gone "
        f"(since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(0))})"
    ) in lines

    # A new mix over the same read: the read's work is kept, and the log says so.
    res = _cli("build", str(recipe), "--set", "mix.ratio.code=8")
    assert res.returncode == 0, res.stderr
    assert "lemur-data: tokenize: all 2 tasks already done" in res.stderr.splitlines()


def test_a_val_split_too_small_for_one_window_is_warned(
    tmp_path: Path, corpus_dir: Path, tokenizer_model: Path
) -> None:
    """A small text side: its val split cannot hold one window at the recipe's seq_len, and
    the build says so (the trainer would refuse it later) (#44 item 8)."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    raw = base_recipe(
        tmp_path,
        corpus_dir / "code",
        [corpus_dir / "a.jsonl"],
        tokenizer={"model": str(tokenizer_model)},
        seq_len=2048,
    )
    notes: list[str] = []
    manifest = build(recipe_from_dict(raw), note=notes.append)
    val = {
        d: [s for s in manifest["shards"] if s["split"] == "val" and s["domain"] == d]
        for d in ("code", "text")
    }
    assert max(s["tokens"] for s in val["code"]) > 2048  # real modules: a window and more
    text_docs = sum(s["documents"] for s in val["text"])
    text_tokens = sum(s["tokens"] for s in val["text"])
    assert text_tokens <= 2048
    assert [n for n in notes if n.startswith("warning:")] == [
        f"warning: val split of domain 'text' ({text_docs:,} documents, {text_tokens:,} "
        "tokens) holds no window of seq_len + 1 = 2049 tokens: a trainer at batch.seq_len 2048 "
        "cannot evaluate it; raise val_fraction (now 0.05) or add documents"
    ]


def test_fim_counts_and_drops_per_source_are_shown(recipe: Path, tmp_path: Path) -> None:
    """The build summary and `stats` show the FIM stage's counts (documents made FIM of
    those eligible, PSM/SPM, tokens before and after) and drops per source and domain
    (#44 item 12)."""
    raw = yaml.safe_load(recipe.read_text())
    raw["fim"] = {"rate": 0.5, "spm_rate": 0.5}
    recipe.write_text(yaml.safe_dump(raw))
    built = _cli("build", str(recipe))
    assert built.returncode == 0, built.stderr
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    c = manifest["fim"]["counts"]
    assert 0 < c["fim"] < c["documents"] and c["psm"] + c["spm"] == c["fim"]
    line = (
        f"{c['fim']:,} of {c['documents']:,} code documents ({c['fim'] / c['documents']:.1%}; "
        f"PSM {c['psm']:,}, SPM {c['spm']:,}); tokens {c['tokens_before']:,} -> "
        f"{c['tokens_after']:,} ({c['tokens_after'] - c['tokens_before']:+,})"
    )
    # The summary table: a FIM row, and a row per source and per domain under "filtered".
    assert re.search(rf"│ fill-in-the-middle +│ +{c['fim']} │ {c['fim']} of ", built.stdout)
    sources = manifest["counts"]["sources"]
    for name, domain in (("py", "code"), ("docs", "text")):
        dropped = sum(sources[name]["dropped"].values())
        assert re.search(rf"│   {name} \({domain}\) +│ +{dropped} │", built.stdout), built.stdout
    text_drops = sum(sources["docs"]["dropped"].values())
    assert text_drops > 0 and re.search(rf"│   all text +│ +{text_drops} │", built.stdout)

    shown = _cli("stats", str(out))
    assert shown.returncode == 0, shown.stderr
    assert (
        f"fill-in-the-middle (rate 0.5, SPM share 0.5, char cuts): {line}"
        in shown.stdout.splitlines()
    )
    assert re.search(r"│ docs \(text\) +│ +20 │ +4 │ +16 │ too_few_sentences", shown.stdout)
    as_json = json.loads(_cli("stats", str(out), "--json").stdout)
    assert as_json["fim"] == manifest["fim"]
    assert as_json["drops"] == [
        {"source": "py", "domain": "code", "read": 40, "kept": 40, "dropped": {}},
        {
            "source": "docs",
            "domain": "text",
            "read": 20,
            "kept": 4,
            "dropped": sources["docs"]["dropped"],
        },
        {"source": None, "domain": "code", "read": 40, "kept": 40, "dropped": {}},
        {
            "source": None,
            "domain": "text",
            "read": 20,
            "kept": 4,
            "dropped": sources["docs"]["dropped"],
        },
    ]
