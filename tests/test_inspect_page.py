"""`lemur-data inspect` without a browser: the page's data against the build's manifest,
hostile text kept out of the markup, the page's size bounded, each token's piece, the
CSP, the server, and one-line errors (the browser tests: test_inspect_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from bytelevel_fixtures import llama3_folder, pathological_texts
from conftest import base_recipe
from inspect_fixtures import HOSTILE, build_chat, plant_samples

from lemur.data.cli import main as lemur_data
from lemur.data.inspect.page import InspectError, fit_texts, gather, token_pieces
from lemur.data.inspect.render import embed_json, render
from lemur.shards.format import open_index, open_tokens
from lemur.tokenizer import open_tokenizer

PAGE_LIMIT = 10 * 2**20  # issue #46 item 3: under 10 MB whatever the build


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """A small real two-domain build with FIM documents, made by the command."""
    tmp = tmp_path_factory.mktemp("inspect-build")
    recipe = base_recipe(tmp, corpus_dir / "code", [corpus_dir / "a.jsonl"])
    recipe["fim"] = {"rate": 0.5, "spm_rate": 0.5}
    recipe["rejects"] = str(tmp / "rejects")
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return Path(recipe["output"])


@pytest.fixture(scope="module")
def planted(build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plant_samples(build, tmp_path_factory.mktemp("planted") / "build")


@pytest.fixture(scope="module")
def chat_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat(tmp_path_factory.mktemp("inspect-chat"))


def manifest_of(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def data_block(page: str) -> str:
    m = re.search(r'<script type="application/json" id="lemur-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return m.group(1)


def test_embed_json_leaves_nothing_that_can_end_the_block() -> None:
    data = {"texts": [*HOSTILE, "\u2029", "lone \ud800 half", "a\u2028b"]}
    out = embed_json(data)
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in out
    out.encode("utf-8")  # no lone surrogate left to write
    assert json.loads(out) == data


def test_hostile_documents_are_only_escaped_json_in_the_page(planted: Path) -> None:
    page = render(gather(planted))
    assert page.count("</script>") == 2 and page.count("<script") == 2  # data, code
    assert "<img" not in page and "<textarea" not in page.lower()
    for text in HOSTILE:
        assert text not in page
    block = data_block(page)
    texts = [d["text"] for d in json.loads(block)["samples"]["drops"]]
    assert texts == list(HOSTILE)


def test_the_csp_allows_only_the_inline_script_and_style_and_no_request(planted: Path) -> None:
    page = render(gather(planted))
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    script = re.findall(r"<script>(.*?)</script>", page, re.S)
    style = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(script) == 1 and len(style) == 1

    def allowed(source: str) -> str:
        return base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()

    assert f"script-src 'sha256-{allowed(script[0])}'" in csp
    assert f"style-src 'sha256-{allowed(style[0])}'" in csp
    assert "default-src 'none'" in csp and "unsafe" not in csp
    # The SVG namespace is a name, not a request.
    code = page.replace(data_block(page), "").replace("http://www.w3.org/2000/svg", "")
    assert not re.search(r"https?://|//cdn|\bsrc=", code), "the page would load something"
    assert not re.search(r"\.(inner|outer)HTML|insertAdjacentHTML|document\.write", script[0])


def test_funnel_and_drops_are_the_manifests(build: Path) -> None:
    data, manifest = gather(build), manifest_of(build)
    counted, mixed = manifest["counts"]["sources"], manifest["mix"]["sources"]
    assert [r["source"] for r in data["funnel"]] == list(counted)
    for row in data["funnel"]:
        assert row["read"] == counted[row["source"]]["read"]
        assert row["kept"] == counted[row["source"]]["kept"]
        assert row["mixed"] == mixed[row["source"]]["documents"]
        assert row["tokens"] == mixed[row["source"]]["tokens"]
        assert row["read"] >= row["kept"] >= row["deduplicated"]
    dropped = {r["source"]: r["dropped"] for r in data["drops"] if r["source"]}
    assert dropped == {n: s["dropped"] for n, s in counted.items()}


def test_shard_browser_documents_are_the_shards_tokens(build: Path) -> None:
    data, manifest = gather(build), manifest_of(build)
    tok = open_tokenizer(build / manifest["tokenizer"]["file"])
    shards = {s["file"]: s for s in manifest["shards"]}
    checked = 0
    for shown in data["browser"]["shards"]:
        entry = shards[shown["file"]]
        tokens = open_tokens(build, entry, manifest["dtype"])
        ends = np.asarray(open_index(build, entry), dtype=np.int64)
        for doc in shown["docs"]:
            a = int(ends[doc["index"] - 1]) if doc["index"] else 0
            ids = [int(t) for t in tokens[a : int(ends[doc["index"]])]]
            assert doc["ids"] == ids[: len(doc["ids"])]
            assert doc["ids"][0] == tok.bos_id
            assert "".join(doc["pieces"]) == tok.decode(doc["ids"])
            checked += 1
    assert checked >= 6
    control = data["browser"]["control"]
    assert control[str(tok.bos_id)] == "BOS" and control[str(tok.eos_id)] == "EOS"


def test_fim_markers_have_their_roles_and_split_the_document(build: Path) -> None:
    """The FIM markers the manifest names are the browser's roles; a FIM document shown
    holds each marker once, and its parts between them are the text of the parts."""
    data, manifest = gather(build), manifest_of(build)
    markers = manifest["fim"]["markers"]
    roles = data["browser"]["roles"]
    assert {roles[str(markers[r])] for r in ("prefix", "middle", "suffix")} == {
        "prefix",
        "middle",
        "suffix",
    }
    fim_docs = [
        d
        for s in data["browser"]["shards"]
        for d in s["docs"]
        if str(markers["prefix"]) in map(str, d["ids"])
    ]
    assert fim_docs, "no FIM document among those shown"
    for doc in fim_docs:
        for r in ("prefix", "middle", "suffix"):
            assert doc["ids"].count(markers[r]) == 1 or doc["cut"]
            assert doc["pieces"][doc["ids"].index(markers[r])] == ""  # a chip, not text


def test_token_pieces_join_to_the_decoded_text_on_a_byte_level_model(tmp_path: Path) -> None:
    """Per-token decoding alone would split characters (é in two byte tokens) and lose
    SentencePiece's spaces; the pieces joined must be the tokenizer's decode."""
    tok = open_tokenizer(llama3_folder(tmp_path / "llama3"))
    texts = [t[:3000] for t in pathological_texts()] + ["naïve café 😀 中文字符 \u202e x"]
    for text in texts:
        ids = tok.encode(text)[:600]
        pieces = token_pieces(tok, ids)
        assert len(pieces) == len(ids)
        assert "".join(pieces) == tok.decode(ids)


def test_samples_over_the_budget_are_cut_to_one_length_and_marked() -> None:
    samples = {
        "drops": [{"text": "x" * 1000}, {"text": "short"}],
        "kept": [{"text": "é" * 800}],
        "near_duplicates": [{"kept": {"text": "y" * 900}, "removed": [{"text": "z" * 700}]}],
    }
    cap = fit_texts(samples, 2000)
    assert cap is not None
    texts = [
        samples["drops"][0],
        samples["drops"][1],
        samples["kept"][0],
        samples["near_duplicates"][0]["kept"],
        samples["near_duplicates"][0]["removed"][0],
    ]
    assert sum(len(t["text"]) for t in texts) <= 2000
    assert samples["drops"][1] == {"text": "short"}  # short texts untouched
    assert samples["kept"][0]["cut"] and samples["kept"][0]["bytes"] == 1600
    assert fit_texts({"drops": [{"text": "a"}]}, 10) is None


def test_the_page_stays_under_10_mb_with_oversized_samples(planted: Path, tmp_path: Path) -> None:
    """A samples folder far past the page's size (12 MB of drops, half of them `<`, which
    takes 6 bytes escaped) still gives a page under 10 MB, each text marked cut."""
    folder = planted / "samples"
    big = [
        {"source": "s", "reason": f"r{i % 40}", "id": str(i), "text": f"{i} " + "w<"[i % 2] * 8000}
        for i in range(1500)
    ]
    saved = (folder / "drops.jsonl").read_text()
    try:
        (folder / "drops.jsonl").write_text("".join(json.dumps(r) + "\n" for r in big))
        out = tmp_path / "page.html"
        assert lemur_data(["inspect", str(planted), "--out", str(out)]) == 0
        size = out.stat().st_size
        drops = json.loads(data_block(out.read_text()))["samples"]["drops"]
    finally:
        (folder / "drops.jsonl").write_text(saved)
    assert 3 * 2**20 < size < PAGE_LIMIT
    assert len(drops) == 1500 and all(d["cut"] for d in drops)


def test_the_page_is_written_where_asked_and_its_path_printed(
    build: Path, capsys: pytest.CaptureFixture
) -> None:
    assert lemur_data(["inspect", str(build)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [str(build / "inspect.html")]
    assert (build / "inspect.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "case",
    ["no build", "bad samples line", "out is a folder", "bad port"],
)
def test_mistakes_are_one_line_exit_2(
    case: str, planted: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv, expect = ["inspect", str(tmp_path)], f"{tmp_path}: no manifest.json"
    saved = (planted / "samples" / "kept.jsonl").read_text()
    if case == "bad samples line":
        (planted / "samples" / "kept.jsonl").write_text(saved + "{not json\n")
        argv = ["inspect", str(planted), "--out", str(tmp_path / "p.html")]
        expect = f"{planted / 'samples' / 'kept.jsonl'}:{len(HOSTILE) + 1}: not a JSON line"
    elif case == "out is a folder":
        argv, expect = ["inspect", str(planted), "--out", str(tmp_path)], "is a directory"
    elif case == "bad port":
        argv, expect = ["inspect", str(planted), "--serve", "99999"], "from 0 to 65535"
    try:
        with pytest.raises(SystemExit) as e:
            lemur_data(argv)
    finally:
        (planted / "samples" / "kept.jsonl").write_text(saved)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err
    assert "Traceback" not in err[0]


def test_gather_refuses_a_damaged_build(build: Path, tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest_of(build)))
    with pytest.raises(InspectError, match="damaged shard directory"):
        gather(tmp_path)  # a manifest without its shards


def test_serve_answers_the_page_alone_on_localhost_and_stops_on_sigterm(planted: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lemur.data.cli", "inspect", str(planted), "--serve", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        path = proc.stdout.readline().strip()
        line = proc.stdout.readline().strip()
        url = re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)", line).group(1)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == Path(path).read_bytes()
            assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        for other in ("manifest.json", "samples/drops.jsonl", "../etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url + other, timeout=10)
            assert e.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x"), timeout=10)
        assert e.value.code == 405
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.strip() == "stopped"


def test_a_chat_builds_documents_carry_their_loss_mask_and_markers(chat_build: Path) -> None:
    data, manifest = gather(chat_build), manifest_of(chat_build)
    assert data["build"]["chat"]
    added = {str(p["id"]): p["piece"] for p in manifest["tokenizer"]["added_pieces"]}
    assert data["browser"]["added"] == added
    shards = {s["file"]: s for s in manifest["shards"]}
    for shown in data["browser"]["shards"]:
        mask = np.fromfile(chat_build / shards[shown["file"]]["mask"], dtype=np.uint8)
        for doc in shown["docs"]:
            a = doc["offset"]
            assert doc["mask"] == "".join(map(str, mask[a : a + len(doc["ids"])]))
            assert "1" in doc["mask"] and "0" in doc["mask"]  # replies trained, prompts not


def test_the_rejects_folder_is_read_a_page_per_reason(build: Path) -> None:
    """The `rejects:` folder's first documents of each (source, reason) join the samples,
    with the value and threshold that tripped the rule, as many as the manifest counts up
    to 20 each."""
    manifest = manifest_of(build)
    rejects = gather(build)["samples"]["rejects"]
    assert rejects
    counted = manifest["counts"]["sources"]
    seen: dict[tuple[str, str], int] = {}
    for r in rejects:
        seen[(r["source"], r["reason"])] = seen.get((r["source"], r["reason"]), 0) + 1
        assert r["text"] and r["id"]
    assert seen == {
        (n, reason): min(20, k) for n, s in counted.items() for reason, k in s["dropped"].items()
    }
    assert any("rule" in r and "threshold" in r for r in rejects)


def test_a_plain_repository_documents_file_separators_are_found(tmp_path: Path) -> None:
    """A repository document in the plain-text format (a model without repository
    markers) spells `<file_sep>` in text: the browser marks the token each begins in."""
    code = tmp_path / "code"
    code.mkdir()
    for p in sorted(Path(json.__file__).parent.glob("*.py")):  # a real package: one repository
        (code / p.name).write_bytes(p.read_bytes())
    recipe = {
        "output": str(tmp_path / "out"),
        "seed": 3,
        "seq_len": 256,
        "tokenizer": {"train": {"vocab_size": 600, "sample_bytes": 400_000}},
        "mix": {"ratio": {"code": 1}},
        "executor": {"kind": "local", "tasks": 1, "workers": 1},
        "val_fraction": 0,
        "filters": {"code": {"enabled": False}},
        "sources": [
            {"name": "tree", "domain": "code", "format": "files", "paths": [str(code)]}
            | {"include": ["*.py"], "language": "Python"}
        ],
        "repos": {"order": "imports", "max_tokens": 100_000},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    cli = [sys.executable, "-m", "lemur.data.cli", "build", str(tmp_path / "r.yaml")]
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "out"
    assert manifest_of(out)["counts"]["repositories"]["format"] == "plain"
    docs = [d for s in gather(out)["browser"]["shards"] for d in s["docs"]]
    seps = [(d, k) for d in docs for k in d.get("file_seps", [])]
    assert seps
    for doc, k in seps:
        assert "".join(doc["pieces"][k:]).find("<file_sep>") < len(doc["pieces"][k])
    for doc in docs:
        assert len(doc.get("file_seps", [])) == "".join(doc["pieces"]).count("<file_sep>")
