"""Code:text ratio sweep: how the mix trades text ability against code ability.

The Lemur paper's open question 1. From one recipe, build corpora at several code:text
ratios over the same sources and the same total train tokens, train the same small model
on each (same config, steps and seed), and score every model on the same held-out code and
text (bits per byte, `lemur.eval.bpb`). Writes `OUT/sweep.json`, `OUT/sweep.md` (a table)
and `OUT/sweep.png` (code bpb against text bpb, one point per ratio).

    python tools/ratio_sweep.py                       # the demo recipe, 0:1 1:1 4:1 10:1 1:0
    python tools/ratio_sweep.py RECIPE.yaml --out out/sweep --ratios 0:1,1:3,1:1,3:1,1:0 \\
        --set executor.tasks=8 --train demo --steps 300 --train-set batch.size=16

What is shared (docs/eval.md "code:text ratio sweep"): every corpus is built with the same
`work_dir` (`OUT/.work`), so the tokenizer, the read/tag/filter/PII/dedup/tokenize work and
the dedup clusters are made once, by a plan-only build, and every ratio's build only plans
its mix and packs (histograms, scatter, gather). The val split is cut before the mix, so
every corpus holds the same `val/code` and `val/text` shards (checked by sha256); a 0 weight
keeps its domain's val shards. All models are scored on the first corpus's val shards.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemur.cli_common import OneLineParser, positive_float, positive_int

DOMAINS = ("code", "text")
DEFAULT_RATIOS = "0:1,1:1,4:1,10:1,1:0"
# The demo build holds out 1% of each domain; its text val would be 9 documents, so the
# sweep's demo recipe holds out 5% (~45 text documents, ~70k tokens).
DEMO_VAL_FRACTION = 0.05


class SweepError(RuntimeError):
    """A sweep that cannot run as asked (the message says why)."""


@dataclass
class Sweep:
    """One sweep: the recipe (plain data, before per-ratio keys), ratios, training and eval."""

    recipe: dict[str, Any]
    out: Path
    ratios: list[tuple[float, float]]
    train: str = "demo"  # a shipped train config name or a YAML path
    train_set: list[str] = field(default_factory=list)
    steps: int | None = None
    total_tokens: float | None = None  # None: the largest total every ratio can have
    eval_seq_len: int | None = None  # None: the training batch's seq_len
    max_windows: int | None = 512
    log: Any = print
    # The demo recipe's text source: written here (once) before the first build; None: the
    # recipe's sources are the user's, and must exist before anything is written.
    demo_sources: Path | None = None


def parse_ratios(text: str) -> list[tuple[float, float]]:
    """'0:1,1:1,4:1' -> [(0, 1), (1, 1), (4, 1)]; SweepError on anything else: a part that
    is not two finite weights >= 0 with a finite sum (the code share of 1e308:1e308 is 0),
    not both 0, or a ratio that another one names again in
    other numbers (2:2 is 1:1; it would be built and trained twice)."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        try:
            code, txt = (float(x) for x in part.split(":"))
        except ValueError:
            raise SweepError(f"--ratios: {part!r} is not CODE:TEXT (e.g. 4:1)") from None
        if not (math.isfinite(code) and math.isfinite(txt) and math.isfinite(code + txt)):
            raise SweepError(f"--ratios: {part!r} needs finite weights")
        if not (code >= 0 and txt >= 0 and code + txt > 0):
            raise SweepError(f"--ratios: {part!r} needs weights >= 0, not both 0")
        for other in out:
            if label(other) == label((code, txt)) or math.isclose(
                code_share(other), code_share((code, txt)), rel_tol=1e-9
            ):
                raise SweepError(
                    f"--ratios: {part!r} is the ratio {label(other)} again (code share "
                    f"{code_share(other):g}): one mix would be built and trained twice"
                )
        out.append((code, txt))
    return out


def code_share(ratio: tuple[float, float]) -> float:
    """(3.0, 1.0) -> 0.75: the code domain's share of the mix."""
    return ratio[0] / (ratio[0] + ratio[1])


def label(ratio: tuple[float, float]) -> str:
    """(4.0, 1.0) -> '4:1'."""
    return f"{ratio[0]:g}:{ratio[1]:g}"


def recipe_for(
    sweep: Sweep, ratio: tuple[float, float], total: float | None, check_paths: bool = True
) -> Any:
    """The validated recipe of one ratio: its own output, the shared work_dir."""
    from lemur.data.recipe_loader import recipe_from_dict

    raw = copy.deepcopy(sweep.recipe)
    raw["output"] = str(sweep.out / f"corpus-{ratio[0]:g}-{ratio[1]:g}")
    raw["work_dir"] = str(sweep.out / ".work")
    raw.setdefault("mix", {})
    raw["mix"] = {**raw["mix"], "ratio": dict(zip(DOMAINS, ratio, strict=True))}
    if total is not None:
        raw["mix"]["total_tokens"] = float(total)
    recipe = recipe_from_dict(raw, check_paths)
    if sorted(recipe.domains()) != sorted(DOMAINS) or recipe.is_chat():
        raise SweepError(f"the recipe must have code and text sources, not {recipe.domains()}")
    return recipe


def common_total(
    available: dict[str, int], ratios: list[tuple[float, float]], max_repeats: float
) -> int:
    """The largest total train tokens that every ratio reaches with at most `max_repeats`:
    for each ratio, each weighted domain allows available x repeats / its share; the
    smallest of those over domains and ratios."""
    limits = []
    for ratio in ratios:
        weights = dict(zip(DOMAINS, ratio, strict=True))
        s = sum(weights.values())
        limits += [available[d] * max_repeats * s / w for d, w in weights.items() if w > 0]
    return int(min(limits))


def _markers(work: Path) -> dict[str, int]:
    """The tokenize tasks' completion markers under the shared work dir, with mtimes."""
    return {str(p): p.stat().st_mtime_ns for p in work.glob("tokens-*/logs/completions/*")}


def plan_pass(sweep: Sweep) -> dict[str, Any]:
    """The one read/filter/dedup/tokenize pass (a plan-only build); tokens per domain."""
    from lemur.data.build import build

    work = sweep.out / ".work"
    before, started = _markers(work), time.time()
    # In the first ratio's output (plan-only builds write no shards), whatever the ratio:
    # the tokens available per domain do not depend on it.
    plan = build(recipe_for(sweep, sweep.ratios[0], None), plan_only=True)["plan"]
    available = {
        d: sum(u["available"] for u in plan["languages"].get(d, {}).values()) for d in DOMAINS
    }
    after = _markers(work)
    return {
        "seconds": round(time.time() - started, 1),
        "available": available,
        "tokenize_tasks_run": sum(1 for k, v in after.items() if before.get(k) != v),
        "work_keys": sorted(p.name for p in work.glob("tokens-*")),
    }


def build_ratio(sweep: Sweep, ratio: tuple[float, float], total: int) -> dict[str, Any]:
    """Build one ratio's corpus on the shared work; what it made and what it redid."""
    from lemur.data.build import build

    work = sweep.out / ".work"
    recipe = recipe_for(sweep, ratio, total)
    before, started = _markers(work), time.time()
    manifest = build(recipe)
    after = _markers(work)
    val = {s["domain"]: s["sha256"] for s in manifest["shards"] if s["split"] == "val"}
    return {
        "ratio": label(ratio),
        "weights": dict(zip(DOMAINS, ratio, strict=True)),
        "corpus": recipe.output,
        "build_seconds": round(time.time() - started, 1),
        "tokenize_tasks_run": sum(1 for k, v in after.items() if before.get(k) != v),
        "train_tokens": {d: manifest["mix"]["tokens"].get(d, 0) for d in DOMAINS},
        "val_sha256": val,
    }


def check_same_val(rows: list[dict[str, Any]]) -> None:
    """Every corpus holds the same val shards of both domains, or the comparison is void."""
    first = rows[0]["val_sha256"]
    if sorted(first) != sorted(DOMAINS):
        raise SweepError(f"{rows[0]['corpus']}: val shards of {sorted(first)}, need code and text")
    for row in rows[1:]:
        if row["val_sha256"] != first:
            raise SweepError(
                f"{row['corpus']}: its val shards differ from {rows[0]['corpus']}'s "
                f"(a recipe key that changes the val split differs between ratios?)"
            )


def train_config(sweep: Sweep, corpus: str, run: Path) -> Any:
    """The train config of one ratio's run: the sweep's, on that corpus, in that run dir."""
    from lemur.train.config import load_train_config

    overrides = [
        f"compile_cache_dir={sweep.out / '.jax-cache'}",  # one compile serves every ratio
        *sweep.train_set,
        f"data.dirs=[{corpus}]",
        f"run_dir={run}",
        *([f"steps={sweep.steps}"] if sweep.steps else []),
    ]
    return load_train_config(sweep.train, overrides)


def check_sweep(sweep: Sweep) -> None:
    """Refuse a sweep that could not run to its end, before anything is written: every
    ratio's recipe (and, for a user's recipe, what it names on disk) and the train config.
    SweepError, RecipeError or ConfigError."""
    if not sweep.ratios:
        raise SweepError("--ratios: no ratio given")
    for i, ratio in enumerate(sweep.ratios):  # the paths do not depend on the ratio
        recipe_for(sweep, ratio, sweep.total_tokens, check_paths=i == 0 and not sweep.demo_sources)
    train_config(sweep, str(sweep.out / "corpus"), sweep.out / "run")


def train_ratio(sweep: Sweep, row: dict[str, Any]) -> dict[str, Any]:
    """Train the sweep's model on one ratio's corpus from scratch; its run dir and figures."""
    from lemur.train.loop import train

    run = sweep.out / f"run-{row['ratio'].replace(':', '-')}"
    shutil.rmtree(run, ignore_errors=True)  # same steps and seed for every ratio: no resume
    config = train_config(sweep, row["corpus"], run)
    started = time.time()
    summary = train(config)
    return {
        "run": str(run),
        "train_seconds": round(time.time() - started, 1),
        "steps": summary.step,
        "final_loss": summary.loss,
        "tokens_seen": summary.step * config.tokens_per_step,
        "seq_len": config.batch.seq_len,
    }


def score(sweep: Sweep, run: str, held_out: str, seq_len: int) -> dict[str, Any]:
    """Bits per byte of a run's last checkpoint on the held-out corpus's val shards."""
    from lemur.eval.bpb import BpbSettings, score_directory
    from lemur.eval.load import load_model

    model = load_model(run)
    settings = BpbSettings(
        seq_len=sweep.eval_seq_len or seq_len, max_windows=sweep.max_windows, languages=False
    )
    result = score_directory(model.params, model.config, held_out, settings)
    return {d: result["domains"][d] for d in DOMAINS}


def run_sweep(sweep: Sweep) -> dict[str, Any]:
    """The whole sweep: one tokenize pass, a build, a run and a score per ratio; the report.
    A sweep that `check_sweep` refuses writes nothing."""
    check_sweep(sweep)
    sweep.out.mkdir(parents=True, exist_ok=True)
    if sweep.demo_sources is not None:
        from lemur.data import demo

        demo.materialize_text(sweep.demo_sources)
    plan = plan_pass(sweep)
    max_repeats = float(sweep.recipe.get("mix", {}).get("max_repeats", 1.0))
    total = int(sweep.total_tokens or common_total(plan["available"], sweep.ratios, max_repeats))
    sweep.log(
        f"tokenize pass: {plan['seconds']} s, {plan['tokenize_tasks_run']} tasks run; "
        f"available train tokens {plan['available']}; total per ratio {total:,}"
    )
    rows = []
    for ratio in sweep.ratios:  # every build before any JAX work in this process
        rows.append(build_ratio(sweep, ratio, total))
        sweep.log(
            f"build {label(ratio)}: {rows[-1]['build_seconds']} s, {rows[-1]['train_tokens']}"
        )
    check_same_val(rows)
    held_out = rows[0]["corpus"]
    for row in rows:
        row.update(train_ratio(sweep, row))
        row["bpb"] = score(sweep, row["run"], held_out, row["seq_len"])
        bpb = {d: round(row["bpb"][d]["bits_per_byte"], 4) for d in DOMAINS}
        sweep.log(f"{row['ratio']}: train {row['train_seconds']} s; bits/byte {bpb}")
    report = {"total_tokens": total, "held_out": held_out, "plan_pass": plan, "rows": rows}
    write_report(sweep.out, report)
    return report


def table(report: dict[str, Any]) -> str:
    """The sweep as a markdown table (one row per ratio)."""
    lines = [
        "| code:text | code share | train tokens (code / text) | code bpb | text bpb | "
        "final train loss | build s | tokenize tasks run | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        t, w = r["train_tokens"], r["weights"]
        lines.append(
            f"| {r['ratio']} | {w['code'] / (w['code'] + w['text']):.3f} | "
            f"{t['code']:,} / {t['text']:,} | {r['bpb']['code']['bits_per_byte']:.4f} | "
            f"{r['bpb']['text']['bits_per_byte']:.4f} | {r['final_loss']:.4f} | "
            f"{r['build_seconds']} | {r['tokenize_tasks_run']} | {r['train_seconds']} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Code bpb (x) against text bpb (y), one labelled point per ratio, in code-share order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(report["rows"], key=lambda r: r["weights"]["code"] / sum(r["weights"].values()))
    xs = [r["bpb"]["code"]["bits_per_byte"] for r in rows]
    ys = [r["bpb"]["text"]["bits_per_byte"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=100)
    ax.plot(xs, ys, "-", color="0.7", zorder=1)
    ax.scatter(xs, ys, c=range(len(rows)), cmap="viridis", zorder=2)
    for r, x, y in zip(rows, xs, ys, strict=True):
        ax.annotate(r["ratio"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=9)
    ax.set_xlabel("held-out code: bits per byte (lower is better)")
    ax.set_ylabel("held-out text: bits per byte (lower is better)")
    ax.set_title(
        f"code:text ratio sweep ({report['total_tokens']:,} train tokens each)", fontsize=10
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(out: Path, report: dict[str, Any]) -> None:
    """sweep.json, sweep.md and sweep.png under `out`."""
    (out / "sweep.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "sweep.md").write_text(table(report))
    plot(report, out / "sweep.png")


def demo_raw(out: Path) -> dict[str, Any]:
    """The demo recipe (lemur/data/demo.py); its text source, under the shared work, is
    written by `run_sweep` (`Sweep.demo_sources`)."""
    from lemur.data import demo

    raw = demo.demo_recipe(str(out))  # text source: OUT/.work/demo-sources/text.jsonl.zst
    raw["val_fraction"] = DEMO_VAL_FRACTION
    return raw


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = OneLineParser(
        prog="ratio_sweep.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", nargs="?", help="recipe YAML (default: the demo recipe)")
    p.add_argument("--out", default="out/ratio-sweep", help="corpora, runs and the report")
    p.add_argument("--ratios", default=DEFAULT_RATIOS, help="CODE:TEXT,... (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe key")
    p.add_argument(
        "--total-tokens", type=positive_float, default=None, help="default: the largest common"
    )
    p.add_argument("--train", default="demo", help="train config name or YAML (default demo)")
    p.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=positive_int, default=None, help="default: the train config's")
    p.add_argument(
        "--eval-seq-len", type=positive_int, default=None, help="default: training seq_len"
    )
    p.add_argument("--max-windows", type=positive_int, default=512, help="val windows per domain")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a sweep from the command line; exit 2 with one line on a user mistake."""
    args = parser().parse_args(argv)
    from lemur import process_setup
    from lemur.data.build import BuildError
    from lemur.data.recipe.errors import RecipeError
    from lemur.data.recipe_loader import apply_overrides, load_recipe
    from lemur.train.config import ConfigError

    process_setup.install("lemur-data")  # builds in this process: lemur-data's console
    out = Path(args.out).expanduser().absolute()
    try:
        ratios = parse_ratios(args.ratios)  # before anything is read, rendered or written
        if args.recipe:  # resolved (presets applied) but not checked: each ratio's build is
            raw = load_recipe(args.recipe, args.set, check_paths=False).to_dict()
        else:
            raw = apply_overrides(demo_raw(out), args.set)
        sweep = Sweep(
            recipe=raw,
            out=out,
            ratios=ratios,
            train=args.train,
            train_set=args.train_set,
            steps=args.steps,
            total_tokens=args.total_tokens,
            eval_seq_len=args.eval_seq_len,
            max_windows=args.max_windows,
            log=lambda m: print(f"ratio-sweep: {m}", file=sys.stderr),
            demo_sources=None if args.recipe else out / ".work" / "demo-sources",
        )
        report = run_sweep(sweep)
    except (SweepError, RecipeError, BuildError, ConfigError) as e:
        print(f"ratio-sweep: error: {e}", file=sys.stderr)
        return 2
    print(table(report), end="")
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
