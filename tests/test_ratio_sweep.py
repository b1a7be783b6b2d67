"""tools/ratio_sweep.py: per-ratio corpora with the requested ratios and one total, built on
one tokenize pass, the same held-out shards for every model, and the report."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
RATIOS = [(0.0, 1.0), (2.0, 1.0), (1.0, 0.0)]


def _tool():
    spec = importlib.util.spec_from_file_location("ratio_sweep", ROOT / "tools" / "ratio_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ratio_sweep"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sweep_tool = _tool()


def test_ratios_parse_and_bad_ones_are_one_line_errors():
    assert sweep_tool.parse_ratios("0:1,1:1,4:1,10:1,1:0") == [
        (0, 1),
        (1, 1),
        (4, 1),
        (10, 1),
        (1, 0),
    ]
    for bad, message in (("4-1", "is not CODE:TEXT"), ("0:0", "not both 0"), ("1:1,1:1", "twice")):
        with pytest.raises(sweep_tool.SweepError, match=message):
            sweep_tool.parse_ratios(bad)


def test_common_total_is_what_the_scarcest_ratio_allows():
    available = {"code": 1000, "text": 100}
    # 0:1 allows all 100 text tokens; 1:1 200; 10:1 1100; 1:0 1000
    assert sweep_tool.common_total(available, [(0, 1), (1, 1), (10, 1), (1, 0)], 1.0) == 100
    assert sweep_tool.common_total(available, [(1, 1), (10, 1), (1, 0)], 1.0) == 200
    assert sweep_tool.common_total(available, [(1, 1)], 3.0) == 600  # repeats allowed


def _doc_tokens(corpus: Path, split: str = "train") -> np.ndarray:
    """Lengths of every document in a corpus's shards of `split`."""
    manifest = json.loads((corpus / "manifest.json").read_text())
    ends = [
        np.fromfile(corpus / s["index"], dtype="<u8")
        for s in manifest["shards"]
        if s["split"] == split
    ]
    return np.concatenate([np.diff(e, prepend=0) for e in ends])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    code = root / "code"
    code.mkdir()
    for p in real_python_files(40):
        (code / p.name).write_bytes(p.read_bytes())
    text = write_jsonl(root / "text.jsonl", real_text_docs(60))
    raw = base_recipe(root, code, [text], filters=NO_FILTERS)
    train = root / "train.yaml"
    train.write_text(
        yaml.safe_dump(
            {
                "seed": 0,
                "model": {
                    "preset": "tiny",
                    "overrides": {"d_model": 32, "d_ff": 64, "max_seq_len": 64},
                },
                "batch": {"size": 4, "seq_len": 32},
                "schedule": {"peak_lr": 1e-2, "warmup_steps": 1},
                "eval": {"every": 100, "batches": 1},
                "log": {"every": 1, "progress": False, "tensorboard": False},
            }
        )
    )
    sweep = sweep_tool.Sweep(
        recipe=raw,
        out=root / "sweep",
        ratios=RATIOS,
        train=str(train),
        steps=2,
        max_windows=4,
        log=lambda m: None,
    )
    return sweep_tool.run_sweep(sweep), root / "sweep"


def test_corpora_have_the_requested_ratios_and_one_total(report):
    rep, out = report
    total = rep["total_tokens"]
    corpora = {r["ratio"]: Path(r["corpus"]) for r in rep["rows"]}
    # the largest document of each domain bounds how close a budget can be met
    largest = {"code": _doc_tokens(corpora["1:0"]).max(), "text": _doc_tokens(corpora["0:1"]).max()}
    for (code_w, text_w), row in zip(RATIOS, rep["rows"], strict=True):
        manifest = json.loads((Path(row["corpus"]) / "manifest.json").read_text())
        tokens = manifest["mix"]["tokens"]
        assert manifest["mix"]["target"] == {"code": code_w, "text": text_w}
        for d, w in (("code", code_w), ("text", text_w)):
            want = total * w / (code_w + text_w)
            assert abs(tokens[d] - want) <= largest[d], (row["ratio"], d, tokens, want)
        assert abs(sum(tokens.values()) - total) <= largest["code"] + largest["text"]
        assert row["train_tokens"] == tokens
    assert (
        rep["rows"][0]["train_tokens"]["code"] == 0 and rep["rows"][2]["train_tokens"]["text"] == 0
    )


def test_all_ratios_share_one_tokenize_pass(report):
    rep, out = report
    work = out / ".work"
    assert len(list(work.glob("tokens-*"))) == 1 and rep["plan_pass"]["work_keys"] == [
        p.name for p in work.glob("tokens-*")
    ]
    assert rep["plan_pass"]["tokenize_tasks_run"] == 2  # executor.tasks of base_recipe
    assert [r["tokenize_tasks_run"] for r in rep["rows"]] == [0, 0, 0]
    assert not any((Path(r["corpus"]) / ".work").exists() for r in rep["rows"])
    assert sorted(p.name for p in out.glob("corpus-*")) == [
        "corpus-0-1",
        "corpus-1-0",
        "corpus-2-1",
    ]


def test_every_model_is_scored_on_the_same_held_out_shards(report):
    rep, out = report
    shas = [r["val_sha256"] for r in rep["rows"]]
    assert shas[0].keys() == {"code", "text"} and all(s == shas[0] for s in shas)
    assert rep["held_out"] == rep["rows"][0]["corpus"]
    for row in rep["rows"]:
        assert row["steps"] == 2
        for d in ("code", "text"):
            assert row["bpb"][d]["tokens"] > 0 and math.isfinite(row["bpb"][d]["bits_per_byte"])
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (out / "sweep.md").read_text().splitlines()[2:]  # after the header and the rule
    assert [r.split(" | ")[0] for r in rows] == ["| 0:1", "| 2:1", "| 1:0"]


@pytest.mark.parametrize(
    "ratios, message",
    [
        ("inf:1", "'inf:1' needs finite weights"),
        ("1:nan", "'1:nan' needs finite weights"),
        ("-1:1", "needs weights >= 0"),
        ("2:2,1:1", "'1:1' is the ratio 2:2 again"),
        ("0:1,4:2,2:1", "'2:1' is the ratio 4:2 again"),
        ("0:1,0:3", "'0:3' is the ratio 0:1 again"),
        ("1:3,0.5:1.5", "'0.5:1.5' is the ratio 1:3 again"),
    ],
)
def test_non_finite_and_repeated_ratios_are_refused(ratios: str, message: str) -> None:
    """A ratio with an infinite or NaN weight, and one that names an earlier ratio in other
    numbers (the same mix built and trained twice), are refused as the ratios are read."""
    with pytest.raises(sweep_tool.SweepError, match=message):
        sweep_tool.parse_ratios(ratios)


def _refused(argv: list[str], capsys, monkeypatch) -> str:
    """The one line of a sweep refused from the command line (exit 2)."""
    monkeypatch.setattr("lemur.process_setup.install", lambda command: None)  # not in pytest
    assert sweep_tool.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ratio-sweep: error: "), err
    return err[0]


def test_a_refused_sweep_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    """Everything is checked before anything is written: the demo's bad ratio renders no
    text source; a recipe's bad ratio, a source path that matches nothing or an unknown
    train config (found after every build, before) leave no output folder."""
    out = tmp_path / "out"
    assert "'inf:1' needs finite weights" in _refused(
        ["--out", str(out), "--ratios", "0:1,inf:1"], capsys, monkeypatch
    )
    assert not out.exists()
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("print(1)\n")
    text = write_jsonl(tmp_path / "text.jsonl", real_text_docs(2))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(base_recipe(tmp_path / "unused", code, [text])))
    for extra, message in (
        (["--ratios", "1:1,inf:1"], "'inf:1' needs finite weights"),
        (["--set", f"sources.0.paths=[{tmp_path / 'nothing'}]"], "matches nothing"),
        (["--train", str(tmp_path / "missing.yaml")], "missing.yaml"),
    ):
        argv = [str(recipe), "--out", str(out), *extra]
        assert message in _refused(argv, capsys, monkeypatch)
        assert not out.exists(), extra
