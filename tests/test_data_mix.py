"""Mix planner arithmetic: feasible, infeasible, repeats and shares, with exact rates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl

from lemur.data.corpus import corpus_of
from lemur.data.mix import (
    LEMUR_CODE_TOKENS,
    MIX_PRESETS,
    MixInfeasible,
    fill_to_budget,
    plan_mix,
)


def select_repeats(tokens: np.ndarray, order_hash: np.ndarray, budget: int) -> np.ndarray:
    """How many copies of each document a unit takes to meet `budget` tokens (the
    document-level selection that the histogram plan must reproduce).

    Whole passes over the unit (for rates >= 1), then a prefix of the documents in seeded
    hash order for the remainder, closest to the budget within one document.
    """
    copies = np.zeros(len(tokens), np.int64)
    total = int(tokens.sum())
    if total == 0 or budget <= 0:
        return copies
    passes = budget // total
    copies[:] = passes
    order = np.argsort(order_hash, kind="stable")
    copies[order[fill_to_budget(tokens[order], budget - passes * total)]] += 1
    return copies


AVAIL = {("code", "Python"): 800, ("code", "C"): 200, ("text", "en"): 500}


def rates(plan):
    return {k: round(u.rate, 6) for k, u in plan.units.items()}


def test_default_keeps_all_of_the_scarcer_side():
    plan = plan_mix(AVAIL, {"code": 10, "text": 1})
    # code (1000 tokens) is scarcer at 10:1: all of it, text sampled to 100
    assert plan.total == 1100
    assert rates(plan) == {("code", "C"): 1.0, ("code", "Python"): 1.0, ("text", "en"): 0.2}
    plan = plan_mix(AVAIL, {"code": 1, "text": 1})
    assert plan.total == 1000 and rates(plan)[("text", "en")] == 1.0
    assert rates(plan)[("code", "Python")] == 0.5 and rates(plan)[("code", "C")] == 0.5


def test_total_tokens_downsamples_everything():
    plan = plan_mix(AVAIL, {"code": 10, "text": 1}, total_tokens=550)
    assert plan.units[("code", "Python")].budget == 400 and plan.units[("code", "C")].budget == 100
    assert plan.units[("text", "en")].budget == 50
    assert rates(plan) == {("code", "C"): 0.5, ("code", "Python"): 0.5, ("text", "en"): 0.1}


def test_shares_inside_a_domain():
    plan = plan_mix(AVAIL, {"code": 10, "text": 1}, shares={"code": {"C": 0.5}})
    # C may only fill half of code: C's 200 tokens bind, code = 400, text = 40
    assert plan.units[("code", "C")].budget == 200 and plan.units[("code", "Python")].budget == 200
    assert rates(plan) == {("code", "C"): 1.0, ("code", "Python"): 0.25, ("text", "en"): 0.08}


def test_repeats_up_to_the_cap_and_infeasible_message():
    plan = plan_mix(
        AVAIL,
        {"code": 10, "text": 1},
        total_tokens=4400,
        shares={"code": {"C": 0.5}},
        max_repeats=10,
    )
    assert rates(plan) == {("code", "C"): 10.0, ("code", "Python"): 2.5, ("text", "en"): 0.8}
    with pytest.raises(MixInfeasible) as e:
        plan_mix(
            AVAIL,
            {"code": 10, "text": 1},
            total_tokens=4400,
            shares={"code": {"C": 0.5}},
            max_repeats=2,
        )
    msg = str(e.value)
    assert "code/C repeated 10.00x" in msg and "max_repeats 2" in msg
    assert "Nearest feasible plan: total_tokens 880" in msg and "max_repeats 10.00" in msg


def test_missing_language_and_bad_shares():
    with pytest.raises(MixInfeasible, match="shares ask for code/SQL but no such tokens"):
        plan_mix(AVAIL, {"code": 10, "text": 1}, shares={"code": {"SQL": 0.1}})
    with pytest.raises(MixInfeasible, match="domain 'text' has no tokens"):
        plan_mix({("code", "C"): 5}, {"code": 1, "text": 1})
    plan = plan_mix(
        {("code", "Python"): 100, ("code", "C"): 100},
        {"code": 1},
        shares={"code": {"Python": 0.3, "C": 0.2}},
    )
    assert plan.units[("code", "Python")].fraction == pytest.approx(0.6)
    assert plan.notes and "scaled them to 1" in plan.notes[0]


def test_lemur_preset_shares():
    shares = MIX_PRESETS["lemur"]["shares"]["code"]
    assert shares["Python"] == pytest.approx(65.46 / 81.8, abs=1e-6)
    assert set(shares) == set(LEMUR_CODE_TOKENS)
    assert 0.95 < sum(shares.values()) < 0.97  # the rest (~3.3B "others") goes to other languages


def test_select_repeats_meets_budget_within_one_document():
    rng = np.random.default_rng(0)
    tokens = rng.integers(10, 200, 300)
    h = rng.integers(0, 2**63, 300).astype(np.uint64)
    for budget in (0, 1000, int(tokens.sum()), int(2.5 * tokens.sum())):
        copies = select_repeats(tokens, h, budget)
        got = int((tokens * copies).sum())
        assert abs(got - budget) <= tokens.max() / 2 + 1
        assert copies.max() - copies.min() <= 1  # whole passes, then one partial pass
    # 7: one document (5, 2 short) is closer than two (10, 3 over); 8: two are (2 over, 3 short)
    assert fill_to_budget(np.array([5, 5, 5]), 7).tolist() == [True, False, False]
    assert fill_to_budget(np.array([5, 5, 5]), 8).tolist() == [True, True, False]


POSTGRES_SQL = sorted(Path("/usr/share/postgresql").glob("*/**/*.sql"))


@pytest.mark.skipif(not POSTGRES_SQL, reason="no PostgreSQL SQL files on this machine")
def test_sql_dialects_count_as_sql_in_the_mix(tmp_path):
    import enry

    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    code = tmp_path / "code"
    code.mkdir()
    precise = {}
    for p in POSTGRES_SQL:
        tag = enry.get_language(p.name, p.read_bytes())
        if len(precise.get(tag, [])) < 15:
            precise.setdefault(tag, []).append(p)
            (code / f"{p.parent.name}-{p.name}").write_bytes(p.read_bytes())
    for p in real_python_files(20):
        (code / p.name).write_bytes(p.read_bytes())
    assert "PLpgSQL" in precise and "SQL" in precise  # go-enry tells the dialect apart
    text = write_jsonl(tmp_path / "text.jsonl", real_text_docs(40))
    raw = base_recipe(tmp_path, code, [text], filters=NO_FILTERS)
    raw["sources"][0].pop("language")  # let the tagger decide per file
    raw["sources"][0]["include"] = ["*.py", "*.sql"]
    raw["mix"] = {"ratio": {"code": 10, "text": 1}, "shares": {"code": {"SQL": 0.2}}}
    m = build(recipe_from_dict(raw))
    code_langs = m["mix"]["languages"]["code"]
    assert "PLpgSQL" not in code_langs and "SQL" in code_langs
    # The share is budgeted on the family: the plan gives SQL exactly 0.2 of the code...
    fractions = {lang: row["fraction"] for lang, row in code_langs.items()}
    assert fractions["SQL"] / sum(fractions.values()) == pytest.approx(0.2, abs=1e-6)
    # ...and each family's tokens meet its budget within one of its documents (whole files
    # are taken or left: a 0.03 tolerance on the share failed for some temp paths, when a
    # large stdlib module fell just outside Python's budget).
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(
        model_file=str(tmp_path / "out" / m["tokenizer"]["file"])
    )
    by_lang = {"SQL": [p for p in code.glob("*.sql")], "Python": [p for p in code.glob("*.py")]}
    for lang, row in code_langs.items():
        longest = max(len(sp.encode(p.read_text(errors="replace"))) for p in by_lang[lang]) + 2
        assert abs(row["tokens"] - row["budget"]) <= longest, (lang, row, longest)


def test_mix_language_maps_dialects_to_families():
    from lemur.data.filter.tagging import mix_language

    assert [mix_language(x) for x in ("TSQL", "PLpgSQL", "PLSQL", "SQLPL", "SQL", "Python")] == [
        "SQL",
        "SQL",
        "SQL",
        "SQL",
        "SQL",
        "Python",
    ]


# --- the histogram plan: prep tasks, plan step, per-task selection (no global sort) ---


def fake_tasks(tok_dir: Path, docs_per_task: list[int], rng, languages=("Python", "C", "SQL")):
    """Tokenize-stage record files of synthetic tasks: code docs of `languages`, text docs."""
    import json

    from lemur.data.runs.format import DOC_RECORD

    tok_dir.mkdir(parents=True, exist_ok=True)
    for rank, n in enumerate(docs_per_task):
        rec = np.zeros(n, DOC_RECORD)
        rec["source"] = rng.integers(0, 2, n)  # 0: code, 1: text
        table = [*languages, "en"]
        lang = rng.integers(0, len(languages), n)
        rec["language"] = np.where(rec["source"] == 1, len(languages), lang)
        rec["tokens"] = rng.integers(3, 400, n)
        rec["id_hash"] = rng.integers(0, 2**63, n, dtype=np.uint64) * 2 + rank % 2
        rec["end"] = np.cumsum(rec["tokens"])
        np.save(tok_dir / f"{rank:05d}.docs.npy", rec)
        (tok_dir / f"{rank:05d}.json").write_text(json.dumps({"languages": table}))


def hist_recipe(tmp_path: Path, **kw):
    from lemur.data.recipe_loader import recipe_from_dict

    (tmp_path / "c").mkdir(exist_ok=True)
    raw = {
        "output": str(tmp_path / "out"),
        "seed": 11,
        "tokenizer": {"train": {"vocab_size": 600}},
        "val_fraction": 0.01,
        "shard_tokens": 1_000_000,
        "mix": {"ratio": {"code": 10, "text": 1}},
        "sources": [
            {"name": "c", "domain": "code", "format": "files", "paths": [str(tmp_path / "c")]},
            {"name": "t", "domain": "text", "format": "files", "paths": [str(tmp_path / "c")]},
        ],
    }
    raw.update(kw)
    return recipe_from_dict(raw)


def run_plan(recipe, tok_dir: Path, n_tasks: int):
    """Prep tasks, the plan, then every task's fates; the totals the selection achieved."""
    from lemur.data.pack.plan import make_plan
    from lemur.data.pack.select import Groups, task_fates
    from lemur.data.pack.steps import prep_task
    from lemur.data.runs.format import task_records

    g = Groups.of(recipe, corpus_of(recipe))
    for rank in range(n_tasks):
        prep_task(rank, tok_dir, None, tok_dir / "hist", g)
    plan = make_plan(recipe, corpus_of(recipe), tok_dir / "hist", n_tasks, 2)
    got: dict[str, int] = {}
    pool: dict[str, int] = {}
    val = {"docs": 0, "by_domain": {}}
    fates = []
    for rank in range(n_tasks):
        rec = task_records(tok_dir, rank)
        f = task_fates(rec, g, plan.val_cut, plan.units)
        fates.append((rec, f))
        for i, (group, lang) in enumerate(f.units):
            m, u = f.unit == i, f"{group}\t{lang}"
            got[u] = got.get(u, 0) + int((rec.tokens * f.copies)[m].sum())
            pool[u] = pool.get(u, 0) + int(rec.tokens[m & f.pool].sum())
        for d in ("code", "text"):
            n = int((f.val & (rec.source == ("code", "text").index(d))).sum())
            val["by_domain"][d] = val["by_domain"].get(d, 0) + n
    return plan, got, pool, val, fates


def test_histogram_plan_meets_budgets_and_shares_within_one_percent(tmp_path):
    rng = np.random.default_rng(1)
    fake_tasks(tmp_path / "tok", [30_000, 25_000, 0, 35_000], rng)
    recipe = hist_recipe(
        tmp_path,
        mix={
            "ratio": {"code": 10, "text": 1},
            "shares": {"code": {"C": 0.5, "SQL": 0.1}},  # C repeated, Python downsampled
            "max_repeats": 3,
        },
    )
    plan, got, pool, _, _ = run_plan(recipe, tmp_path / "tok", 4)
    for (d, lang), u in plan.mix.units.items():
        assert pool[f"{d}\t{lang}"] == u.available  # the plan's fixes match the tasks' cuts
        assert abs(got[f"{d}\t{lang}"] - u.budget) <= 0.001 * u.budget, (d, lang)
    code = sum(v for k, v in got.items() if k.startswith("code"))
    assert abs(got["code\tC"] / code - 0.5) < 0.01 and abs(got["code\tSQL"] / code - 0.1) < 0.01
    assert abs(code / got["text\ten"] / 10 - 1) < 0.01
    assert plan.units[("code", "C")][0] >= 1  # whole passes, then the partial one
    assert plan.train_shards == -(-sum(u.budget for u in plan.mix.units.values()) // 1_000_000)


def test_histogram_selection_is_the_document_first_fit_with_one_document_per_bin(tmp_path):
    from lemur.data.mix import seeded_hash
    from lemur.data.pack.select import BIN_SHIFT

    rng = np.random.default_rng(2)
    fake_tasks(tmp_path / "tok", [60, 60], rng, languages=("Python",))
    recipe = hist_recipe(tmp_path, val_fraction=0.0, mix={"ratio": {"code": 1, "text": 3}})
    plan, _, _, _, fates = run_plan(recipe, tmp_path / "tok", 2)
    for u, src in (("code\tPython", 0), ("text\ten", 1)):
        tokens = np.concatenate([r.tokens[r.source == src] for r, _ in fates])
        ids = np.concatenate([r.id_hash[r.source == src] for r, _ in fates])
        copies = np.concatenate([f.copies[r.source == src] for r, f in fates])
        h = seeded_hash(ids, recipe.seed, "mix")
        assert len(np.unique(h >> np.uint64(BIN_SHIFT))) == len(h)  # one document per bin
        budget = plan.mix.units[tuple(u.split("\t"))].budget
        assert np.array_equal(copies, select_repeats(tokens, h, budget)), u


def test_val_cut_holds_out_a_fraction_at_least_one_never_all(tmp_path):
    rng = np.random.default_rng(3)
    fake_tasks(tmp_path / "tok", [20_000, 20_000], rng)
    recipe = hist_recipe(tmp_path, val_fraction=0.05)
    _, _, _, val, fates = run_plan(recipe, tmp_path / "tok", 2)
    n_code = sum(int((r.source == 0).sum()) for r, _ in fates)
    assert abs(val["by_domain"]["code"] / n_code - 0.05) < 0.005  # a seeded-hash sample
    # a domain of 2 documents (one per task): one val document, whatever the fraction
    small = tmp_path / "small"
    fake_tasks(small, [1, 1], np.random.default_rng(4))
    import json

    from lemur.data.mix import seeded_hash
    from lemur.data.runs.format import DOC_RECORD

    # two ids whose val hashes fall below 0.45: a plain threshold would hold out both
    ids = np.arange(1, 200, dtype=np.uint64)
    ids = ids[seeded_hash(ids, 11, "val") < np.uint64(int(0.45 * 2**64))][:2]
    for rank in range(2):
        rec = np.load(small / f"{rank:05d}.docs.npy")
        rec["source"], rec["id_hash"] = 0, ids[rank]
        np.save(small / f"{rank:05d}.docs.npy", rec.astype(DOC_RECORD))
    extra = np.zeros(3, DOC_RECORD)  # text: needed by the ratio
    extra["source"], extra["language"], extra["tokens"] = 1, 3, 10
    extra["id_hash"], extra["end"] = [5, 6, 7], [10, 20, 30]
    np.save(small / "00002.docs.npy", extra)
    (small / "00002.json").write_text(json.dumps({"languages": ["Python", "C", "SQL", "en"]}))
    for fraction, expected in ((0.0001, 1), (0.45, 1)):
        for f in (small / "hist").glob("*"):
            f.unlink()
        _, _, _, val, _ = run_plan(hist_recipe(tmp_path, val_fraction=fraction), small, 3)
        assert val["by_domain"]["code"] == expected, fraction
