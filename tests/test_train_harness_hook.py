"""`eval.harness` in a training run (lemur.train.harness_hook): lm-eval tasks on the live
params every N steps, their metrics in the run's metrics.jsonl; a bad task list is one
line before the first step."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
from test_train_loop import build_corpus, compile_cache, tiny_config  # noqa: E402

from lemur.eval import cli as eval_cli  # noqa: E402
from lemur.train.config import HarnessEvalConfig  # noqa: E402
from lemur.train.errors import RunError  # noqa: E402
from lemur.train.harness_hook import flatten, metric_key  # noqa: E402
from lemur.train.loop import train  # noqa: E402
from lemur.train.metrics import format_record, read_records  # noqa: E402

pytest.importorskip("lm_eval")
REPO = Path(__file__).resolve().parents[1]
HARNESS = "{tasks: [lemur_code_mc, lemur_code_gen], every: 2, limit: 3, include_path: %s}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("harness_corpus"))


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """At the repo root: the shipped task YAMLs name their data relative to it."""
    monkeypatch.chdir(REPO)
    return REPO


def test_task_metrics_logged_every_n_steps(corpus, tmp_path, tmp_path_factory, in_repo):
    run = tmp_path / "run"
    harness = HARNESS % "tests/harness_tasks"
    config = tiny_config(
        corpus,
        run,
        "steps=5",
        "eval.every=0",
        "checkpoint.every=0",
        f"eval.harness={harness}",
        cache=compile_cache(tmp_path_factory),
    )
    seen: list[dict] = []
    train(config, on_metrics=seen.append)
    records = [r for r in read_records(run / "metrics.jsonl") if "harness_s" in r]
    # every 2 steps, and the last step (5)
    assert [r["step"] for r in records] == [2, 4, 5]
    for r in records:
        assert 0.0 <= r["harness/lemur_code_mc/acc"] <= 1.0
        assert 0.0 <= r["harness/lemur_code_gen/exact_match"] <= 1.0
        assert "harness/lemur_code_mc/acc_stderr" in r
    assert [r for r in seen if "harness_s" in r] == records
    line = format_record(records[0])
    assert line.startswith("step      2  harness  lemur_code_mc/acc ")
    # The live params of step 5 score as its checkpoint does through `lemur-eval harness`.
    out = tmp_path / "step5.json"
    argv = ["harness", str(run), "--tasks", "lemur_code_mc,lemur_code_gen", "--limit", "3"]
    argv += ["--include-path", "tests/harness_tasks", "--output", str(out), "--dtype", "float32"]
    assert eval_cli.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    assert flatten(results) == pytest.approx(
        {k: v for k, v in records[-1].items() if k.startswith("harness/")}
    )


def test_unknown_task_stops_before_the_first_step(corpus, tmp_path, tmp_path_factory, in_repo):
    harness = "{tasks: [lemur_code_mc, no_such_task], include_path: tests/harness_tasks}"
    config = tiny_config(corpus, tmp_path / "run", f"eval.harness={harness}")
    with pytest.raises(RunError, match="eval.harness.tasks: unknown task no_such_task"):
        train(config)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not [
        r for r in read_records(tmp_path / "run" / "metrics.jsonl") if "loss" in r
    ]
    config = tiny_config(corpus, tmp_path / "run2", "eval.harness={tasks: [x], include_path: nope}")
    with pytest.raises(RunError, match="eval.harness.include_path: nope: no such directory"):
        train(config)


def test_config_checks_and_metric_keys() -> None:
    with pytest.raises(ValueError, match="eval.harness.tasks"):
        HarnessEvalConfig(tasks=[])
    with pytest.raises(ValueError, match="eval.harness.limit"):
        HarnessEvalConfig(tasks=["a"], limit=0)
    assert metric_key("t", "acc,none") == "harness/t/acc"
    assert metric_key("t", "exact_match,strict-match") == "harness/t/exact_match/strict-match"
    flat = flatten({"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": "N/A", "n": 3}})
    assert flat == {"harness/t/acc": 0.5}


def test_without_lm_eval_the_run_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from lemur.model.config import PRESETS
    from lemur.train.harness_hook import HarnessHook

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    with pytest.raises(RunError, match=r"eval.harness: .*pip install 'lemur\[harness\]'"):
        HarnessHook(HarnessEvalConfig(tasks=["x"]), PRESETS["tiny"], None, print)  # type: ignore[arg-type]
