"""`lemur-eval serve` end to end: a tiny model served in a subprocess, asked by lm-eval's
`local-completions` (the same numbers as lm-eval's HF backend on the `lemur-convert to-hf`
export), by 50 clients at once (the answers one client gets, flat memory), by bad requests
(OpenAI's JSON error, the server keeps serving), and stopped by SIGTERM (drained, exit 0)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from test_eval_generate import random_params

from lemur.convert import cli as convert
from lemur.model import checkpoint, scoring
from lemur.model.config import LlamaConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key-0123456789"
CONTEXT = 256


@pytest.fixture(scope="module")
def model_dirs(tokenizer_model: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A random tiny Llama (a lemur checkpoint) and its float32 `lemur-convert to-hf`."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("serve-model")
    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer_model)).vocab_size()
    config = LlamaConfig(
        vocab_size=vocab,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        dtype="float32",
        init_std=0.1,
        max_seq_len=CONTEXT,
    )
    checkpoint.save_params(tmp / "lemur", random_params(config, 11), config, tokenizer_model)
    argv = ["to-hf", str(tmp / "lemur"), str(tmp / "hf"), "--dtype", "float32"]
    assert convert.main(argv) == 0
    return tmp / "lemur", tmp / "hf"


def start_server(model: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`lemur-eval serve MODEL --port 0 ...` and its base URL, read from its log line."""
    argv = [sys.executable, "-m", "lemur.eval.cli", "serve", str(model), "--port", "0"]
    argv += ["--dtype", "float32", "--batch-size", "8", *extra]
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    for line in proc.stderr:
        if m := re.search(r"serving .* on (http://\S+)/v1", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep it drained
            return proc, m.group(1)
        assert time.monotonic() < deadline, "the server did not start"
    raise AssertionError(f"the server exited {proc.wait()} before serving")


@pytest.fixture(scope="module")
def server(model_dirs):
    """The lemur checkpoint served with an API key; stopped by SIGTERM at the end."""
    proc, url = start_server(model_dirs[0], "--api-key", KEY, "--max-queue", "128")
    yield proc, url
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def call(url: str, path: str, body: object | bytes | None = None, key: str | None = KEY):
    """(status, JSON body) of one request."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data)
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def rss_kib(pid: int) -> int:
    """Resident memory of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def _evaluate(model: str, model_args: str, tasks: list[str]) -> dict:
    """lm-eval's simple_evaluate on the shipped local tasks, samples logged."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(REPO / "tests" / "harness_tasks"))
    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=manager,
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )


def test_local_completions_equals_the_hf_backend(server, model_dirs, monkeypatch) -> None:
    """Per-sample loglikelihoods within max(1e-4, 1e-6 |ll|), the same accuracy and the
    same greedy generations: lm-eval through the server vs its HF backend (no BOS: the API
    client sends none) on the export."""
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(REPO)  # the task files name their data relative to the repository
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    _, url = server
    _, hf = model_dirs
    tasks = ["lemur_code_mc", "lemur_code_gen"]
    api_args = (
        f"base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={hf},"
        f"max_length={CONTEXT},batch_size=4,num_concurrent=4,max_retries=1"
    )
    theirs = _evaluate(
        "hf", f"pretrained={hf},dtype=float32,add_bos_token=False,device=cpu,batch_size=4", tasks
    )
    ours = _evaluate("local-completions", api_args, tasks)
    for task in tasks:
        a = sorted(ours["samples"][task], key=lambda s: s["doc_id"])
        b = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] and a
        for x, y in zip(a, b, strict=True):
            if task == "lemur_code_gen":
                assert x["resps"] == y["resps"]  # the greedy generations, text for text
                continue
            for (ll_x, greedy_x), (ll_y, greedy_y) in zip(
                [r[0] for r in x["resps"]], [r[0] for r in y["resps"]], strict=True
            ):
                assert abs(ll_x - ll_y) <= max(1e-4, 1e-6 * abs(ll_y)), (ll_x, ll_y)
                assert greedy_x == greedy_y
        mine, ref = ours["results"][task], theirs["results"][task]
        metrics = [k for k in ref if "," in k and "stderr" not in k]
        assert metrics and all(mine[k] == ref[k] for k in metrics), (mine, ref)


def test_local_completions_rolling_perplexity_equals_the_hf_backend(
    server, model_dirs, monkeypatch
) -> None:
    """The rolling-loglikelihood task (documents longer than the context, in windows):
    lm-eval through the server and its HF backend with the same windows (the API client's
    windows are max_length - 2: a token kept for the one it asks the server to generate,
    and one less for rolling windows; the HF backend's are max_length)."""
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    _, url = server
    _, hf = model_dirs
    api_args = (
        f"base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={hf},"
        f"max_length={CONTEXT},batch_size=4,num_concurrent=4,max_retries=1"
    )
    hf_args = f"pretrained={hf},dtype=float32,add_bos_token=False,device=cpu,batch_size=4"
    theirs = _evaluate("hf", f"{hf_args},max_length={CONTEXT - 2}", ["lemur_code_ppl"])
    ours = _evaluate("local-completions", api_args, ["lemur_code_ppl"])
    a = sorted(ours["samples"]["lemur_code_ppl"], key=lambda s: s["doc_id"])
    b = sorted(theirs["samples"]["lemur_code_ppl"], key=lambda s: s["doc_id"])
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        ll_x, ll_y = x["resps"][0][0], y["resps"][0][0]
        ll_x = ll_x[0] if isinstance(ll_x, list | tuple) else ll_x
        ll_y = ll_y[0] if isinstance(ll_y, list | tuple) else ll_y
        assert abs(ll_x - ll_y) <= max(1e-4, 1e-6 * abs(ll_y)), (ll_x, ll_y)
    mine, ref = ours["results"]["lemur_code_ppl"], theirs["results"]["lemur_code_ppl"]
    for k in (k for k in ref if "," in k and "stderr" not in k):
        assert mine[k] == pytest.approx(ref[k], rel=1e-6), k


PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n",
    "The quick brown fox",
    "class Stack:\n    def __init__(self):\n",
    "SELECT name FROM users WHERE",
]


def _requests() -> list[dict]:
    """Greedy completions and echo + logprobs scoring of each prompt."""
    out = []
    for p in PROMPTS:
        out.append({"prompt": p, "max_tokens": 12, "temperature": 0})
        out.append({"prompt": p, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 2})
    return out


def _same(a: dict, b: dict) -> None:
    """Two answers to one request: the same choices (logprobs within float noise)."""
    for x, y in zip(a["choices"], b["choices"], strict=True):
        assert x["text"] == y["text"] and x["finish_reason"] == y["finish_reason"]
        if x["logprobs"] is None:
            assert y["logprobs"] is None
            continue
        assert x["logprobs"]["tokens"] == y["logprobs"]["tokens"]
        lx = [v for v in x["logprobs"]["token_logprobs"] if v is not None]
        ly = [v for v in y["logprobs"]["token_logprobs"] if v is not None]
        np.testing.assert_allclose(lx, ly, rtol=1e-5, atol=1e-5)


def test_fifty_concurrent_clients_get_one_clients_answers_in_flat_memory(server) -> None:
    proc, url = server
    reqs = _requests()
    alone = [call(url, "/v1/completions", r) for r in reqs]
    assert all(status == 200 for status, _ in alone)

    def round_of_50() -> list[tuple[int, dict]]:
        got: list = [None] * 50

        def client(i: int) -> None:
            got[i] = call(url, "/v1/completions", reqs[i % len(reqs)])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    rss = []
    for _ in range(8):
        for i, (status, body) in enumerate(round_of_50()):
            assert status == 200, body
            _same(body, alone[i % len(reqs)][1])
        rss.append(rss_kib(proc.pid))
    # The first rounds compile the batch shapes that arrivals make (a few MB each, a
    # bounded set: lemur.eval.serve_engine pads row counts); after them, 250 requests.
    grown = rss[-1] - rss[2]
    assert grown < 64 * 1024, f"RSS grew {grown} KiB over 250 requests: {rss}"


def test_echo_logprobs_are_the_scoring_cores(server, model_dirs) -> None:
    """echo + logprobs: every prompt token's logprob (the first None), the top tokens,
    offsets into the echoed text; the numbers are scoring.token_logprobs'."""
    from lemur.eval.load import load_model

    _, url = server
    ids = [[5, 17, 300, 42, 7, 99], [12, 13, 14]]
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 3}
    status, got = call(url, "/v1/completions", body)
    assert status == 200, got
    model = load_model(model_dirs[0], dtype="float32")
    want = scoring.token_logprobs(model.config, model.params, ids)
    for choice, seq, ref in zip(got["choices"], ids, want, strict=True):
        lp = choice["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        np.testing.assert_allclose(lp["token_logprobs"][1:], ref.logprobs, rtol=1e-5, atol=1e-5)
        assert "".join(lp["tokens"]) == choice["text"] == model.tokenizer.decode(seq)
        assert lp["text_offset"] == [len(model.tokenizer.decode(seq[:i])) for i in range(len(seq))]
        shown = zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:], ref.greedy, strict=True)
        for top, mine, greedy in shown:
            assert len(top) <= 3 and max(top.values()) >= mine - 1e-6
            assert (max(top.values()) == mine) == bool(greedy)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"prompt": list(range(1, CONTEXT + 2)), "max_tokens": 1}, 400, "maximum context"),
        ({"prompt": [1, 2, 3], "max_tokens": CONTEXT}, 400, "maximum context"),
        ({"prompt": "hi", "n": 10**6}, 400, "n 1000000 = 1000000 choices, over"),
        ({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens must be"),
        ({"prompt": "hi", "temperature": "hot"}, 400, "temperature must be a number"),
        ({"prompt": "hi", "stream": True}, 400, "stream=True is not supported"),
        ({"prompt": "hi", "frobnicate": 1}, 400, "unknown field"),
        ({"prompt": [[1, 10**9]]}, 400, "token id outside"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "cannot chat"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_bad_requests_get_a_json_error_and_the_server_keeps_serving(
    server, body, status, says
) -> None:
    _, url = server
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else None
    got_status, got = call(url, path or "/v1/completions", body)
    assert got_status == status and says in got["error"]["message"], got
    assert got["error"]["type"] == "invalid_request_error" and "\n" not in got["error"]["message"]
    assert call(url, "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200


def test_a_wrong_or_missing_key_gets_a_401(server) -> None:
    _, url = server
    for key in ("wrong", None, KEY[:-1]):
        status, got = call(url, "/v1/models", key=key)
        assert status == 401 and got["error"]["type"] == "authentication_error"
    status, got = call(url, "/v1/models")
    assert status == 200 and got["data"][0]["object"] == "model"


def test_a_full_server_answers_429_and_sigterm_drains_requests_in_flight(model_dirs) -> None:
    """--max-queue 8 rows: a request of 8 held, the next gets a 429 (valid, retry later)
    and one of 9 a 400 (it never fits); SIGTERM answers the held one and exits 0."""
    proc, url = start_server(model_dirs[0], "--max-queue", "8")
    answers: list = []
    body = {"prompt": "def main():\n", "max_tokens": 200, "n": 8, "temperature": 1, "seed": 3}
    client = threading.Thread(target=lambda: answers.append(call(url, "/v1/completions", body)))
    client.start()
    deadline = time.monotonic() + 60
    while call(url, "/health")[1]["rows"] == 0:  # wait until the request is held
        assert time.monotonic() < deadline
        time.sleep(0.01)
    status, full = call(url, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 429 and full["error"]["type"] == "rate_limit_error", full
    status, never = call(url, "/v1/completions", {"prompt": ["x", "y"], "n": 5})
    assert status == 400 and "--max-queue 8" in never["error"]["message"]
    proc.send_signal(signal.SIGTERM)
    client.join(120)
    assert proc.wait(120) == 0
    assert answers and answers[0][0] == 200 and len(answers[0][1]["choices"]) == 8


def test_a_network_host_without_a_key_is_refused_in_one_line(model_dirs) -> None:
    argv = [sys.executable, "-m", "lemur.eval.cli", "serve", str(model_dirs[0])]
    done = subprocess.run([*argv, "--host", "0.0.0.0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "lemur-eval: --host 0.0.0.0: serving beyond this machine needs --api-key KEY"
    ]


@pytest.mark.parametrize("k", [1, 3])
def test_top_tokens_are_one_forward_pass_per_sequence(k: int) -> None:
    """scoring.top_tokens (serve's echo/logprobs pass): each sequence's logprobs as
    token_logprobs gives them, and after every token, the last included, the k most
    likely next tokens and their logprobs, as one unpadded forward pass gives them."""
    import jax

    from lemur.model import llama

    config = LlamaConfig(
        vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
        dtype="float32", init_std=0.2, max_seq_len=40,
    )  # fmt: skip
    params = llama.init_params(config, jax.random.key(1))
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 97, n).tolist() for n in (1, 5, 17, 40, 9)]
    got = scoring.top_tokens(config, params, seqs, k, batch_size=2)
    plain = scoring.token_logprobs(config, params, seqs)
    for seq, (scores, top), ref in zip(seqs, got, plain, strict=True):
        logits = np.asarray(llama.forward(params, np.array([seq], np.int32), config))[0]
        logp = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))[:, None]
            - logits.max(-1, keepdims=True)
        )
        want_ids = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
        assert top.ids.shape == (len(seq), k)
        np.testing.assert_array_equal(top.ids, want_ids)
        np.testing.assert_allclose(top.logprobs, np.take_along_axis(logp, want_ids, -1), atol=1e-5)
        np.testing.assert_allclose(scores.logprobs, ref.logprobs, atol=1e-5)
        np.testing.assert_array_equal(scores.greedy, ref.greedy)
    with pytest.raises(ValueError, match="context"):
        scoring.top_tokens(config, params, [[1] * 41], k)


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A random tiny Llama with a ChatML SentencePiece tokenizer (a Lemur-Chat build's
    pieces appended), and its float32 `lemur-convert to-hf` export."""
    import sentencepiece as spm
    from conftest import real_python_files

    from lemur.chatml import CHAT_PIECES
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig

    tmp = tmp_path_factory.mktemp("serve-chat")
    texts = [p.read_text() for p in real_python_files(30)]
    train_tokenizer(texts, TokenizerTrainConfig(vocab_size=600), tmp / "t.model", CHAT_PIECES)
    vocab = spm.SentencePieceProcessor(model_file=str(tmp / "t.model")).vocab_size()
    config = LlamaConfig(
        vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
        dtype="float32", init_std=0.1, max_seq_len=CONTEXT,
    )  # fmt: skip
    checkpoint.save_params(tmp / "lemur", random_params(config, 5), config, tmp / "t.model")
    argv = ["to-hf", str(tmp / "lemur"), str(tmp / "hf"), "--dtype", "float32"]
    assert convert.main(argv) == 0
    return tmp / "lemur", tmp / "hf"


def test_local_chat_completions_equals_the_hf_backend_with_its_chat_template(
    chat_dirs, monkeypatch
) -> None:
    """lm-eval's local-chat-completions through the server and its HF backend with
    `apply_chat_template` on the export: the same greedy replies; a request's prompt is
    transformers' `apply_chat_template(..., add_generation_prompt=True)` of its messages."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(REPO)
    proc, url = start_server(chat_dirs[0])
    try:
        messages = [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Reverse a list."},
        ]
        status, got = call(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 8})
        tok = transformers.AutoTokenizer.from_pretrained(str(chat_dirs[1]))
        want = tok.apply_chat_template(messages, add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert status == 200 and got["usage"]["prompt_tokens"] == len(want)
        assert got["choices"][0]["message"]["role"] == "assistant"
        chat_args = f"base_url={url}/v1/chat/completions,max_retries=1"
        hf_args = f"pretrained={chat_dirs[1]},dtype=float32,device=cpu,batch_size=1"
        runs = {}
        for model, args in (("local-chat-completions", chat_args), ("hf", hf_args)):
            lm_eval = pytest.importorskip("lm_eval")
            from lm_eval.tasks import TaskManager

            runs[model] = lm_eval.simple_evaluate(
                model=model,
                model_args=args,
                tasks=["lemur_code_gen"],
                task_manager=TaskManager(include_path=str(REPO / "tests" / "harness_tasks")),
                apply_chat_template=True,
                log_samples=True,
                limit=4,
            )
        a, b = (
            sorted(r["samples"]["lemur_code_gen"], key=lambda s: s["doc_id"]) for r in runs.values()
        )
        assert [s["resps"] for s in a] == [s["resps"] for s in b]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
