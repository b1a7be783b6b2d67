"""`lemur-eval harness` (lemur.model.harness_lm) against lm-eval's own HF backend.

A tiny random lemur model with a real SentencePiece tokenizer is exported with
`lemur-convert to-hf`; the three shipped local tasks of tests/harness_tasks (multiple
choice, rolling perplexity with documents longer than the 128-token context, greedy
generation to stop strings) run through lm-eval's `--model hf` on the export (in process,
float32, its default BOS handling) and through `lemur-eval harness` on the lemur
checkpoint. Every per-sample loglikelihood agrees within max(1e-4, 1e-6 |ll|), the
accuracies are the same, and so are the generations.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import jax  # noqa: E402
import lm_eval  # noqa: E402  (the harness extra, in dev: never skipped)
import pytest  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.eval import cli as eval_cli  # noqa: E402
from lemur.model import checkpoint, llama  # noqa: E402
from lemur.model.config import LlamaConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = ["lemur_code_mc", "lemur_code_ppl", "lemur_code_gen"]
INCLUDE = "tests/harness_tasks"  # data_files in the YAMLs are relative to the repo root
# init_std 0.4: logits far from uniform, so greedy choices are not near-ties.
CONFIG = LlamaConfig(
    vocab_size=800,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=128,
    max_seq_len=128,
    dtype="float32",
    init_std=0.4,
)


@pytest.fixture(scope="module")
def in_repo():
    """The working directory at the repo root (the task YAMLs' data_files are relative)."""
    before = os.getcwd()
    os.chdir(REPO)
    yield REPO
    os.chdir(before)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tokenizer_model: Path) -> tuple[Path, Path]:
    """(lemur checkpoint, its `lemur-convert to-hf` export in float32)."""
    root = tmp_path_factory.mktemp("harness")
    params = llama.init_params(CONFIG, jax.random.key(3))
    checkpoint.save_params(root / "lemur", params, CONFIG, tokenizer_model)
    argv = ["to-hf", str(root / "lemur"), str(root / "hf"), "--dtype", "float32"]
    assert convert.main(argv) == 0
    return root / "lemur", root / "hf"


@pytest.fixture(scope="module")
def hf_results(models: tuple[Path, Path], in_repo: Path) -> dict:
    """lm-eval's HF backend on the export: results with per-sample records."""
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={models[1]},dtype=float32",
        tasks=TASKS,
        batch_size=1,  # one row per call: no padding on the reference side
        device="cpu",
        log_samples=True,
        task_manager=TaskManager(include_path=INCLUDE),
    )


@pytest.fixture(scope="module")
def ours(models: tuple[Path, Path], in_repo: Path, tmp_path_factory) -> tuple[dict, dict]:
    """`lemur-eval harness` on the lemur checkpoint: (results JSON, samples by task)."""
    out = tmp_path_factory.mktemp("ours") / "results.json"
    argv = ["harness", str(models[0]), "--tasks", ",".join(TASKS), "--include-path", INCLUDE]
    argv += ["--output", str(out), "--log-samples", "--batch-size", "4", "--dtype", "float32"]
    assert eval_cli.main(argv) == 0
    samples = {}
    for task in TASKS:
        path = out.with_name(f"results_samples_{task}.jsonl")
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(out.read_text()), samples


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-4, 1e-6 * abs(b))


def test_loglikelihoods_equal_the_hf_backend(hf_results: dict, ours: tuple[dict, dict]) -> None:
    _, samples = ours
    for task in ("lemur_code_mc", "lemur_code_ppl"):
        ref = sorted(hf_results["samples"][task], key=lambda s: s["doc_id"])
        got = sorted(samples[task], key=lambda s: s["doc_id"])
        assert len(ref) == len(got) > 0
        for r, g in zip(ref, got, strict=True):
            # resps: one list per request; a request's first value is the loglikelihood.
            ref_ll = [
                float(resp[0][0] if task == "lemur_code_mc" else resp[0]) for resp in r["resps"]
            ]
            got_ll = [
                float(resp[0][0] if task == "lemur_code_mc" else resp[0]) for resp in g["resps"]
            ]
            assert all(_close(x, y) for x, y in zip(got_ll, ref_ll, strict=True)), (
                task,
                got_ll,
                ref_ll,
            )
            if task == "lemur_code_mc":
                ref_greedy = [str(resp[0][1]) for resp in r["resps"]]
                assert [str(resp[0][1]) for resp in g["resps"]] == ref_greedy


def test_metrics_and_generations_equal_the_hf_backend(
    hf_results: dict, ours: tuple[dict, dict]
) -> None:
    results, samples = ours
    for metric in ("acc,none", "acc_norm,none"):
        assert (
            results["results"]["lemur_code_mc"][metric]
            == hf_results["results"]["lemur_code_mc"][metric]
        )
    assert (
        results["results"]["lemur_code_gen"]["exact_match,none"]
        == (hf_results["results"]["lemur_code_gen"]["exact_match,none"])
    )
    ppl, ref_ppl = results["results"]["lemur_code_ppl"], hf_results["results"]["lemur_code_ppl"]
    assert ppl["bits_per_byte,none"] == pytest.approx(ref_ppl["bits_per_byte,none"], rel=1e-5)
    ref = {s["doc_id"]: s["resps"][0][0] for s in hf_results["samples"]["lemur_code_gen"]}
    got = {s["doc_id"]: s["resps"][0][0] for s in samples["lemur_code_gen"]}
    assert got == ref and any(text.strip() for text in got.values())


def test_results_file_is_lm_evals(ours: tuple[dict, dict]) -> None:
    results, _ = ours
    assert set(results["results"]) == set(TASKS)
    assert set(results["configs"]) == set(TASKS) and results["task_hashes"].keys() == set(TASKS)
    assert results["config"]["model"] == "LemurLM"
    assert {"n-samples", "versions", "higher_is_better", "total_evaluation_time_seconds"} <= (
        results.keys()
    )
    assert results["model_source"] == "CUSTOM"


def test_bad_task_and_include_path_are_one_line(
    models: tuple[Path, Path], in_repo: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["harness", str(models[0]), "--include-path", INCLUDE, "--tasks", "lemur_code_mc,nope_x"]
    assert eval_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown task nope_x" in err[0], err
    argv = ["harness", str(models[0]), "--include-path", "no/such/dir", "--tasks", "lemur_code_mc"]
    assert eval_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lemur-eval: --include-path no/such/dir: no such directory"], err


def test_without_lm_eval_one_line(monkeypatch: pytest.MonkeyPatch, capsys, models) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    assert eval_cli.main(["harness", str(models[0]), "--tasks", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'lemur[harness]'" in err[0], err


def test_longer_than_context_is_cut_from_the_left_as_hf_does(models, tokenizer_model) -> None:
    """A context+continuation beyond max_length + 1 tokens scores its last max_length + 1."""
    from lemur.model.harness_lm import harness_lm
    from lemur.tokenizer import open_tokenizer

    tok = open_tokenizer(tokenizer_model)
    params = llama.init_params(CONFIG, jax.random.key(3))
    lm = harness_lm(CONFIG, params, tok, batch_size=2)
    ids = tok.encode("def f(x):\n    return x + 1\n" * 40)
    assert len(ids) > CONFIG.max_seq_len + 1
    long, cut = (None, ids[:-5], ids[-5:]), (None, ids[-(CONFIG.max_seq_len + 1) : -5], ids[-5:])
    (a, _), (b, _) = lm._loglikelihood_tokens([long, cut])
    assert a == b


def test_config_replace_keeps_hashable() -> None:
    """The scoring jit keys on the config: a replaced one is a new, equal-by-value key."""
    assert hash(dataclasses.replace(CONFIG)) == hash(CONFIG)


def test_tokens_are_lm_evals_hf_tokens(models, tokenizer_model) -> None:
    """tok_encode equals lm-eval's HF backend's on the export, texts that start with
    whitespace included (SentencePiece's own encode adds a dummy-prefix space there)."""
    from lm_eval.models.huggingface import HFLM

    from lemur.model.harness_lm import harness_lm
    from lemur.tokenizer import open_tokenizer

    hf = HFLM(pretrained=str(models[1]), dtype="float32", device="cpu")
    params = llama.init_params(CONFIG, jax.random.key(3))
    lm = harness_lm(CONFIG, params, open_tokenizer(tokenizer_model))
    texts = ["    return x", "\n\ndef f():\n\tpass", " a", "x  y ", "Question: 2+2?", "<s>abc", ""]
    for text in texts:
        assert lm.tok_encode(text) == hf.tok_encode(text), text
        assert lm.tok_encode(text, add_special_tokens=False) == hf.tok_encode(
            text, add_special_tokens=False
        ), text
    ids = lm.tok_encode("    def f(x):\n        return 'héllo' + x\n")
    assert lm.tok_decode(ids) == hf.tok_decode(ids)


def test_the_hf_folder_itself_scores_the_same(models, hf_results, in_repo, tmp_path) -> None:
    """`lemur-eval harness` on the exported HF folder (its own tokenizer.json read, as
    lm-eval's HF backend reads it there) gives the HF backend's loglikelihoods too."""
    out = tmp_path / "hf.json"
    argv = ["harness", str(models[1]), "--tasks", "lemur_code_mc,lemur_code_ppl"]
    argv += ["--include-path", INCLUDE, "--limit", "4", "--log-samples", "--output", str(out)]
    assert eval_cli.main([*argv, "--dtype", "float32"]) == 0
    for task in ("lemur_code_mc", "lemur_code_ppl"):
        path = out.with_name(f"hf_samples_{task}.jsonl")
        got = {s["doc_id"]: s for s in map(json.loads, path.read_text().splitlines())}
        assert len(got) == 4
        for ref in hf_results["samples"][task]:
            if ref["doc_id"] in got:
                mine = got[ref["doc_id"]]["resps"]
                pick = (lambda r: r[0][0]) if task == "lemur_code_mc" else (lambda r: r[0])
                for a, b in zip(mine, ref["resps"], strict=True):
                    assert _close(float(pick(a)), float(pick(b)))
