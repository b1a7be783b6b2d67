"""Budgeted reading: a small text budget reads a small part of the text source, still meets
the ratio, tops up when the sample overestimated the yield, and is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NO_FILTERS, STDLIB, base_recipe, write_jsonl

from lemur.data.budget import seeded_order
from lemur.data.build import build
from lemur.data.read.listing import InputFile
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.stats import compute_stats, print_stats

N_FILES = 100
SEED = 7


def _paragraphs() -> list[str]:
    """Real English paragraphs (pydoc topics), unique, in a fixed order."""
    from pydoc_data.topics import topics

    seen, out = set(), []
    for name in sorted(topics):
        for p in topics[name].split("\n\n"):
            p = p.strip()
            if len(p) > 60 and p not in seen:
                seen.add(p)
                out.append(p)
    return out


def _text_dir(root: Path, rich: set[str] | None = None) -> Path:
    """N_FILES jsonl files of real paragraphs; files not in `rich` (when given) are padded
    with a whitespace-only document four times their text (dropped as empty)."""
    d = root / "text"
    d.mkdir()
    paras = _paragraphs()
    per = len(paras) // N_FILES
    for i in range(N_FILES):
        name = f"part-{i:03d}.jsonl"
        rows = [{"id": f"{i}-{k}", "text": p} for k, p in enumerate(paras[i * per : (i + 1) * per])]
        if rich is not None and name not in rich:
            pad = 4 * sum(len(r["text"]) for r in rows)
            rows.append({"id": f"{i}-pad", "text": " " * pad})
        write_jsonl(d / name, rows)
    return d


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    """120 small real stdlib modules: many documents, so a budget is met closely."""
    d = tmp_path_factory.mktemp("code")
    small = []
    for p in sorted(STDLIB.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts or not 500 < p.stat().st_size < 8000:
            continue
        try:
            small.append(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        if len(small) == 120:
            break
    assert len(small) == 120
    for i, text in enumerate(small):
        (d / f"m{i:03d}.py").write_text(text, encoding="utf-8")
    return d


def _recipe(tmp: Path, code: Path, text: Path, tok: Path, out: str, **mix) -> dict:
    raw = base_recipe(tmp, code, [text], tokenizer={"model": str(tok)})
    raw.update(output=str(tmp / out), filters=NO_FILTERS, val_fraction=0.01, seed=SEED)
    raw["mix"] = {"ratio": {"code": 10, "text": 1}, **mix}
    return raw


def _build(raw: dict, **kw):
    return build(recipe_from_dict(raw), **kw)


def _shards(out: Path, manifest: dict) -> dict[str, bytes]:
    return {s["file"]: (out / s["file"]).read_bytes() for s in manifest["shards"]}


def _text_share(manifest: dict) -> float:
    tokens = manifest["mix"]["tokens"]
    return tokens["text"] / sum(tokens.values())


def _total_for_text_share(raw: dict, share: float) -> tuple[float, int]:
    """`mix.total_tokens` whose text budget is `share` of the text available (full read),
    and those available text tokens."""
    plan = _build(dict(raw, mix={**raw["mix"], "budgeted_reading": False}), plan_only=True)
    assert plan["reading"]["estimate"] == {}  # off: nothing estimated, everything read
    text = plan["plan"]["languages"]["text"]["en"]["available"]
    return share * text * 11, text


def test_small_text_budget_reads_a_small_part(tmp_path, code_dir, tokenizer_model, capsys):
    text = _text_dir(tmp_path)
    raw = _recipe(tmp_path, code_dir, text, tokenizer_model, "probe")
    total, _ = _total_for_text_share(raw, 0.05)

    on = _recipe(tmp_path, code_dir, text, tokenizer_model, "on", total_tokens=total)
    on["mix"]["budgeted_reading"] = True
    m = _build(on)
    docs = m["counts"]["sources"]["docs"]
    assert docs["units_total"] == N_FILES
    assert docs["read_bytes"] <= 0.10 * docs["available_bytes"], docs
    assert docs["units_read"] < docs["units_total"]
    assert abs(_text_share(m) - 1 / 11) < 0.01
    assert sum(m["mix"]["tokens"].values()) == pytest.approx(total, rel=0.03)

    capsys.readouterr()
    print_stats(compute_stats(tmp_path / "on"))
    shown = capsys.readouterr().out
    assert "input read" in shown and f"{docs['units_read']} / {N_FILES}" in shown

    # same recipe in another directory: the same units read, byte-identical shards
    again = dict(on, output=str(tmp_path / "again"))
    m2 = _build(again)
    assert m2["counts"]["sources"] == m["counts"]["sources"]
    assert _shards(tmp_path / "again", m2) == _shards(tmp_path / "on", m)

    off = _recipe(tmp_path, code_dir, text, tokenizer_model, "off", total_tokens=total)
    off["mix"]["budgeted_reading"] = False
    m3 = _build(off)
    docs = m3["counts"]["sources"]["docs"]
    assert "units_read" not in docs  # a full read: the counts are those of any build
    assert docs["read"] == len(_paragraphs()) // N_FILES * N_FILES  # every document read
    assert abs(_text_share(m3) - 1 / 11) < 0.01


def test_overestimated_yield_is_topped_up(tmp_path, code_dir, tokenizer_model, capsys):
    # The sample (the first 2% of the seeded order) gets the only unpadded files, so it
    # overestimates the source's yield about five times: the first round falls short.
    names = [f"part-{i:03d}.jsonl" for i in range(N_FILES)]
    text_root = tmp_path / "text"
    files = [InputFile(1, str(text_root / n), n) for n in names]
    order = seeded_order(SEED, files)[1]
    rich = {names[i] for i in order[:2]}
    text = _text_dir(tmp_path, rich)
    raw = _recipe(tmp_path, code_dir, text, tokenizer_model, "probe")
    total, available = _total_for_text_share(raw, 0.05)
    on = _recipe(tmp_path, code_dir, text, tokenizer_model, "on", total_tokens=total)
    on["mix"]["budgeted_reading"] = True
    seen: list[dict] = []
    m = _build(on, on_plan=seen.append)
    est = seen[0]["reading"]["estimate"]
    assert est["sample_units"]["docs"] == 2
    docs = m["counts"]["sources"]["docs"]
    assert est["estimated_tokens"]["docs"] > 3 * available  # the sample's estimate was high...
    assert seen[0]["reading"]["rounds"] > 1  # ...so a top-up round read more
    assert docs["dropped"]["empty"] > 0
    from rich.console import Console

    from lemur.data.cli import print_plan

    capsys.readouterr()
    print_plan(seen[0], Console())  # what --plan-only shows: the estimate, what is read
    shown = capsys.readouterr().out
    assert "budgeted reading" in shown and "tokens needed" in shown
    assert docs["units_read"] < N_FILES
    assert abs(_text_share(m) - 1 / 11) < 0.01
    assert sum(m["mix"]["tokens"].values()) == pytest.approx(total, rel=0.03)


def test_knobs_are_checked(tmp_path, code_dir, tokenizer_model):
    text = _text_dir(tmp_path)
    for key, value in (("read_margin", 0.5), ("sample_fraction", 0.0)):
        raw = _recipe(tmp_path, code_dir, text, tokenizer_model, "x", **{key: value})
        with pytest.raises(RecipeError, match=f"mix.{key}"):
            recipe_from_dict(raw)


def test_a_zero_weight_domain_needs_nothing_and_binds_nothing(tmp_path, code_dir, tokenizer_model):
    from lemur.data.budget import domain_needs

    raw = _recipe(tmp_path, code_dir, _text_dir(tmp_path), tokenizer_model, "z")
    raw["mix"]["ratio"] = {"code": 1, "text": 0}
    needs = domain_needs(recipe_from_dict(raw), {"code": 990.0, "text": 5.0}, set())
    assert needs == {"code": pytest.approx(990.0 / 0.99), "text": 0.0}
