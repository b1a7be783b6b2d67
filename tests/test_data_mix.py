"""Mix planner arithmetic: feasible, infeasible, repeats and shares, with exact rates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl

from lemur.data.pack.mix import (
    LEMUR_CODE_TOKENS,
    MIX_PRESETS,
    MixInfeasible,
    fill_to_budget,
    plan_mix,
    select_repeats,
)

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
    assert fill_to_budget(np.array([5, 5, 5]), 7).sum() in (1, 2)


POSTGRES_SQL = sorted(Path("/usr/share/postgresql").glob("*/**/*.sql"))


@pytest.mark.skipif(not POSTGRES_SQL, reason="no PostgreSQL SQL files on this machine")
def test_sql_dialects_count_as_sql_in_the_mix(tmp_path):
    import enry

    from lemur.data.build import build
    from lemur.data.load import recipe_from_dict

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
    # the share is budgeted on the family (a few large SQL files: within one document)
    sql = code_langs["SQL"]
    assert abs(sql["tokens"] / sum(u["tokens"] for u in code_langs.values()) - 0.2) < 0.03


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
