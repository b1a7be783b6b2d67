"""`lemur-data stats`: what a shard directory holds, by split, domain, source and language."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.counts import drop_reasons, remote_summary
from lemur.data.labels import REMOTE_COUNTERS
from lemur.plots import pyplot, save_figure
from lemur.shards.check import structure_problem
from lemur.shards.format import (
    MANIFEST,
    PROVENANCE_SUFFIX,
    ShardFormatError,
    open_index,
    read_manifest,
)
from lemur.shards.verify import manifest_problems

PERCENTILES = (0, 10, 50, 90, 99, 100)


def document_lengths(directory: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """Document lengths in tokens per `split/domain`, read from the shard indexes."""
    out: dict[str, list[np.ndarray]] = defaultdict(list)
    for s in manifest["shards"]:
        ends = np.asarray(open_index(directory, s), dtype=np.int64)
        out[f"{s['split']}/{s['domain']}"].append(np.diff(ends, prepend=0))
    return {k: np.concatenate(v) for k, v in out.items()}


def check_readable(root: Path) -> dict[str, Any]:
    """The manifest, once a cheap check (no checksums) finds it and every shard sound.

    A damaged directory raises ShardFormatError naming the first problem and pointing to
    `verify`, so that `stats` never shows figures of missing shards or a broken index.
    """
    manifest = read_manifest(root)
    problems = manifest_problems(manifest, root / MANIFEST)
    if not problems:
        itemsize = np.dtype(manifest["dtype"]).itemsize
        found = (structure_problem(root, s, itemsize) for s in manifest["shards"])
        problems = [p for p in found if p][:1]
    if problems:
        raise ShardFormatError(
            f"{root}: damaged shard directory: {problems[0]}; "
            f"run `lemur-data verify {root}` for every problem"
        )
    return manifest


def _extra_stats(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The build's `stats.json` (groups by source and language); none is fine, bad is not."""
    path = root / str(manifest.get("stats", "stats.json"))
    if not path.is_file():
        return {"groups": []}
    try:
        extra = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ShardFormatError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(extra, dict) or not isinstance(extra.get("groups", []), list):
        raise ShardFormatError(f"{path}: 'groups' must be a list")
    return extra


def compute_stats(directory: str | Path) -> dict[str, Any]:
    """All figures `stats` shows, as plain data (the `--json` output)."""
    root = Path(directory)
    manifest = check_readable(root)
    extra = _extra_stats(root, manifest)
    splits: dict[str, dict[str, int]] = defaultdict(
        lambda: {"documents": 0, "tokens": 0, "shards": 0}
    )
    for s in manifest["shards"]:
        key = f"{s['split']}/{s['domain']}"
        splits[key]["documents"] += s["documents"]
        splits[key]["tokens"] += s["tokens"]
        splits[key]["shards"] += 1
    lengths = {
        k: {
            f"p{q}": float(v)
            for q, v in zip(PERCENTILES, np.percentile(a, PERCENTILES), strict=True)
        }
        | {"mean": float(a.mean())}
        for k, a in document_lengths(root, manifest).items()
        if len(a)
    }
    mix = manifest.get("mix", {})
    tokens = mix.get("tokens", {})
    total = sum(tokens.values()) or 1
    target = mix.get("target", {})
    tsum = sum(target.values()) or 1
    ratio = {
        d: {
            "target": target.get(d, 0) / tsum,
            "achieved": tokens.get(d, 0) / total,
            "tokens": tokens.get(d, 0),
        }
        for d in target
    }
    return {
        "directory": str(root),
        "dtype": manifest["dtype"],
        "seq_len": manifest["seq_len"],
        "vocab_size": manifest["tokenizer"]["vocab_size"],
        "tokenizer": {
            k: manifest["tokenizer"].get(k) for k in ("kind", "engine", "bos_id", "eos_id")
        },
        "splits": dict(splits),
        "groups": extra.get("groups", []),
        "lengths": lengths,
        "ratio": ratio,
        "sources": mix.get("sources", {}),
        "languages": mix.get("languages", {}),
        "counts": manifest.get("counts", {}),
        "drops": drops_by_source(manifest),
        **({"fim": manifest["fim"]} if "fim" in manifest else {}),
        **({"classifiers": manifest["classifiers"]} if "classifiers" in manifest else {}),
    }


def drops_by_source(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source (in recipe order), then per domain (`source: None`): documents read,
    kept by the filters and dropped, by reason (the manifest's `counts.sources`)."""
    domains = {
        s.get("name"): s.get("domain", "?")
        for s in (manifest.get("recipe") or {}).get("sources", [])
        if isinstance(s, dict)
    }
    rows, by_domain = [], {}
    counted = (manifest.get("counts") or {}).get("sources", {})
    for name in [*[n for n in domains if n in counted], *[n for n in counted if n not in domains]]:
        s = counted[name]
        row = {
            "source": name,
            "domain": domains.get(name, "?"),
            "read": s.get("read", 0),
            "kept": s.get("kept", 0),
            "dropped": dict(s.get("dropped", {})),
        }
        rows.append(row)
        total = by_domain.setdefault(
            row["domain"],
            {"source": None, "domain": row["domain"], "read": 0, "kept": 0, "dropped": {}},
        )
        total["read"] += row["read"]
        total["kept"] += row["kept"]
        for reason, n in row["dropped"].items():
            total["dropped"][reason] = total["dropped"].get(reason, 0) + n
    return rows + list(by_domain.values())


def fim_summary(fim: dict[str, Any]) -> str:
    """The FIM stage in one line: documents made FIM of those eligible, PSM and SPM, tokens
    before and after (the markers' cost)."""
    c = fim["counts"]
    share = c["fim"] / c["documents"] if c["documents"] else 0.0
    grown = c["tokens_after"] - c["tokens_before"]
    return (
        f"{c['fim']:,} of {c['documents']:,} {'/'.join(fim.get('domains', []))} documents "
        f"({share:.1%}; PSM {c['psm']:,}, SPM {c['spm']:,}); tokens {c['tokens_before']:,} -> "
        f"{c['tokens_after']:,} ({grown:+,})"
    )


def table(title: str, columns: list[str]) -> Any:
    """A rich table with the first column left-aligned and the others right-aligned; a
    value too long for its column (a path, a source name) wraps, never cut to `…`."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    return t


def say(console: Any, text: str) -> None:
    """One line as written (no markup, no wrapping by rich: a path stays whole, so that it
    can be copied out of a log or a pipe of any width)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def language_rows(languages: dict[str, dict[str, dict[str, Any]]]) -> Iterator[tuple[str, dict]]:
    """("domain / language", unit) of a mix plan's languages, largest budget first."""
    for d, langs in languages.items():
        for lang, u in sorted(langs.items(), key=lambda kv: -kv[1]["budget"]):
            yield f"{d} / {lang}", u


def _print_mix(console: Any, stats: dict[str, Any]) -> None:
    t = table("mix (train tokens)", ["domain", "target", "achieved", "tokens"])
    for d, v in stats["ratio"].items():
        t.add_row(d, f"{v['target']:.4f}", f"{v['achieved']:.4f}", f"{v['tokens']:,}")
    console.print(t)
    if stats.get("languages"):
        t = table(
            "mix by language (train tokens)",
            ["domain / language", "available", "target", "achieved", "rate"],
        )
        for label, u in language_rows(stats["languages"]):
            t.add_row(
                label,
                f"{u['available']:,}",
                f"{u['budget']:,}",
                f"{u['tokens']:,}",
                f"{u['rate']:.4f}",
            )
        console.print(t)


def _print_groups(console: Any, stats: dict[str, Any]) -> None:
    t = table(
        "by source and language", ["split / domain / source / language", "documents", "tokens"]
    )
    for g in sorted(
        stats["groups"], key=lambda g: (g["split"], g["domain"], g["source"], g["language"])
    ):
        t.add_row(
            f"{g['split']} / {g['domain']} / {g['source']} / {g['language']}",
            f"{g['documents']:,}",
            f"{g['tokens']:,}",
        )
    console.print(t)
    t = table("sources (train)", ["source", "domain", "available", "selected", "rate", "documents"])
    for name, s in stats["sources"].items():
        t.add_row(
            name,
            s["domain"],
            f"{s['available_tokens']:,}",
            f"{s['tokens']:,}",
            f"{s['rate']:.4f}",
            f"{s['documents']:,}",
        )
    console.print(t)
    t = table("document length (tokens)", ["split/domain", *[f"p{q}" for q in PERCENTILES], "mean"])
    for k, v in sorted(stats["lengths"].items()):
        t.add_row(k, *[f"{v[f'p{q}']:,.0f}" for q in PERCENTILES], f"{v['mean']:,.0f}")
    console.print(t)


def _print_dedup(console: Any, dedup: dict[str, Any]) -> None:
    if not dedup.get("by_source"):
        return
    t = table("duplicates removed", ["source", "exact", "near"])
    for name, d in dedup["by_source"].items():
        t.add_row(name, f"{d['exact']:,}", f"{d['near']:,}")
    console.print(t)
    sizes = dedup.get("cluster_sizes") or {}
    if sizes:
        console.print(
            "duplicate cluster sizes: "
            + ", ".join(
                f"{k} docs x{v:,}" for k, v in sorted(sizes.items(), key=lambda kv: int(kv[0]))
            )
        )


def _print_repositories(console: Any, repos: dict[str, Any]) -> None:
    """`counts.repositories` of a build with `repos:`: files in -> grouped, per source."""
    if not repos:
        return
    t = table(
        f"repository documents ({repos['order']} order, {repos['format']} format, "
        f"{repos['max_tokens']:,} tokens)",
        ["source", "files in", "duplicates", "grouped", "repositories", "documents", "alone"],
    )
    for name, s in repos.get("by_source", {}).items():
        t.add_row(
            name,
            *(
                f"{s.get(k, 0):,}"
                for k in (
                    "files_in",
                    "duplicates",
                    "grouped",
                    "repositories",
                    "documents",
                    "without_repository",
                )
            ),
        )
    console.print(t)


def print_reading(reading: dict[str, Any], console: Any) -> None:
    """The `--plan-only` view of budgeted reading: estimates, and units and bytes to read."""
    est = reading.get("estimate") or {}
    if not est:
        return  # everything is read: nothing was estimated
    t = table("budgeted reading", ["source", "tokens/byte", "est. tokens", "units", "bytes"])
    for name, r in reading.get("sources", {}).items():
        t.add_row(
            name,
            f"{est['tokens_per_byte'].get(name, 0):.4f}",
            f"{est['estimated_tokens'].get(name, 0):,}",
            f"{r['units_read']:,} / {r['units_total']:,}",
            f"{r['read_bytes']:,} / {r['available_bytes']:,}",
        )
    console.print(t)
    needs = ", ".join(f"{d} {n:,}" for d, n in est.get("needed_tokens", {}).items())
    console.print(f"tokens needed (val included): {needs}; read margin {est.get('margin')}")


def _print_reading(console: Any, sources: dict[str, Any]) -> None:
    """Units and bytes read per source, of those listed (budgeted reading reads a part)."""
    rows = {n: s for n, s in sources.items() if "units_total" in s}
    if not rows:
        return  # manifests from before budgeted reading
    t = table("input read", ["source", "units read", "bytes read", "of bytes", "share"])
    for name, s in rows.items():
        share = s["read_bytes"] / s["available_bytes"] if s["available_bytes"] else 1.0
        t.add_row(
            name,
            f"{s['units_read']:,} / {s['units_total']:,}",
            f"{s['read_bytes']:,}",
            f"{s['available_bytes']:,}",
            f"{share:.1%}",
        )
    console.print(t)


def _print_remote(console: Any, counts: dict[str, Any]) -> None:
    """Remote reading per source (bytes, requests, retries, failures), if any was remote."""
    if not counts.get("remote"):
        return
    t = table(f"remote reading: {remote_summary(counts['remote'])}", ["source", *REMOTE_COUNTERS])
    for name, src in (counts.get("sources") or {}).items():
        if src.get("remote"):
            t.add_row(name, *(f"{src['remote'].get(k, 0):,}" for k in REMOTE_COUNTERS))
    console.print(t)


def _print_counts(console: Any, counts: dict[str, Any]) -> None:
    t = table("documents in -> out", ["stage", "documents"])
    t.add_row("read", f"{counts.get('read', 0):,}")
    for reason, n in counts.get("dropped", {}).items():
        t.add_row(f"dropped: {reason}", f"{n:,}")
    t.add_row("tokenized", f"{counts.get('tokenized', 0):,}")
    t.add_row("duplicates removed", f"{counts.get('duplicates', 0):,}")
    for kind, n in counts.get("error_kinds", {}).items():
        t.add_row(f"skipped input ({kind})", f"{n:,}")
    for kind, n in counts.get("repaired", {}).items():
        t.add_row(f"repaired, kept ({kind})", f"{n:,}")
    console.print(t)
    _print_remote(console, counts)
    _print_reading(console, counts.get("sources") or {})
    _print_dedup(console, counts.get("dedup") or {})
    _print_repositories(console, counts.get("repositories") or {})
    errors = counts.get("errors", [])
    if errors:  # lines, not a table: a table's column cuts a path short at 80 columns
        total = counts.get("errors_total", len(errors))
        say(console, f"input errors (first {min(len(errors), 20)} of {total}):")
        for e in errors[:20]:
            line = f":{e['line']}" if e.get("line") not in (None, "") else ""
            say(console, f"  {e['file']}{line}: {e['kind']}: {e['error']}")


def _print_drops(console: Any, drops: list[dict[str, Any]]) -> None:
    """Documents read, kept and dropped (by reason) per source, then per domain."""
    if not drops:
        return
    t = table("filters by source and domain", ["source (domain)", "read", "kept", "dropped"])
    t.add_column("reasons", overflow="fold")
    for row in drops:
        label = f"{row['source']} ({row['domain']})" if row["source"] else f"all {row['domain']}"
        dropped = sum(row["dropped"].values())
        t.add_row(label, f"{row['read']:,}", f"{row['kept']:,}", f"{dropped:,}", drop_reasons(row))
    console.print(t)


def _print_classifiers(console: Any, classifiers: dict[str, Any]) -> None:
    """Each quality classifier's cut and keep rate, then its extreme kept and dropped
    documents (the best and the borderline ones on each side of the cut)."""
    for name, c in classifiers.items():
        if "keep_top" in c:
            cuts = ", ".join(f"{s} {v:.4g}" for s, v in c["thresholds"].items())
            rule = f"keep_top {c['keep_top']:g} (thresholds: {cuts})"
        else:
            rule = f"min_score {c['min_score']:g}" if "min_score" in c else "scores only"
        rate = "" if c.get("keep_rate") is None else f", kept {c['keep_rate']:.1%}"
        say(
            console,
            f"classifier {name}: {c['label']} of {c['model']}; {rule}{rate} "
            f"({c['kept']:,} kept, {c['dropped']:,} dropped; {c['scored']:,} scored, "
            f"{c['cached']:,} from the cache)",
        )
        # A line per sample and its text below: a table squeezed into 80 columns cut the
        # document ids and wrapped each text into a narrow column.
        for kind in ("kept_high", "kept_low", "dropped_high", "dropped_low"):
            for e in c.get("examples", {}).get(kind, [])[:2]:
                say(console, f"  {kind.replace('_', ', '):<13}  {e['score']:.4f}  {e['id']}")
                say(console, "      " + " ".join(e["text"].split())[:100])


def framing(tokenizer: dict[str, Any]) -> str:
    """How a document is framed and who encoded it, from the manifest's tokenizer entry:
    `BOS 1 + doc + EOS 2`, or `doc + EOS 151643 (no BOS)` (Qwen2.5)."""
    bos, eos = tokenizer.get("bos_id"), tokenizer.get("eos_id")
    frame = f"doc + EOS {eos} (no BOS)" if bos is None else f"BOS {bos} + doc + EOS {eos}"
    engine = tokenizer.get("engine")
    return f"{frame}, {engine}" if engine else frame


def print_stats(stats: dict[str, Any]) -> None:
    """Render the stats as rich tables on the terminal."""
    from rich.console import Console

    console = Console()
    t = table(
        f"{stats['directory']}  ({stats['dtype']}, vocab {stats['vocab_size']}; "
        f"{framing(stats.get('tokenizer', {}))})",
        ["split/domain", "shards", "documents", "tokens"],
    )
    for k, v in sorted(stats["splits"].items()):
        t.add_row(k, f"{v['shards']:,}", f"{v['documents']:,}", f"{v['tokens']:,}")
    console.print(t)
    _print_mix(console, stats)
    _print_groups(console, stats)
    if stats["counts"]:
        _print_counts(console, stats["counts"])
    _print_drops(console, stats.get("drops") or [])
    if stats.get("fim"):
        f = stats["fim"]
        say(
            console,
            f"fill-in-the-middle (rate {f.get('rate')}, SPM share {f.get('spm_rate')}, "
            f"{f.get('split')} cuts): {fim_summary(f)}",
        )
    _print_classifiers(console, stats.get("classifiers") or {})


def write_plots(stats: dict[str, Any], directory: str | Path, shard_dir: str | Path) -> list[Path]:
    """PNG histograms of document lengths per split/domain and tokens per source."""
    plt = pyplot()

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    manifest = read_manifest(shard_dir)
    lengths = document_lengths(Path(shard_dir), manifest)
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, a in sorted(lengths.items()):
        if len(a):
            bins = np.logspace(np.log10(max(a.min(), 1)), np.log10(a.max() + 1), 50)
            ax.hist(a, bins=bins, histtype="step", label=f"{k} ({len(a):,} docs)")
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens, BOS/EOS included)")
    ax.set_ylabel("documents")
    ax.legend()
    ax.set_title("Document length distribution")
    fig.tight_layout()
    written.append(save_figure(fig, out / "document_lengths.png", dpi=100))
    if stats["sources"]:
        fig, ax = plt.subplots(figsize=(8, 5))
        names = list(stats["sources"])
        avail = [stats["sources"][n]["available_tokens"] for n in names]
        sel = [stats["sources"][n]["tokens"] for n in names]
        x = np.arange(len(names))
        ax.bar(x - 0.2, avail, 0.4, label="available")
        ax.bar(x + 0.2, sel, 0.4, label="selected")
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel("train tokens")
        ax.set_title("Tokens per source: available vs selected by the mix")
        ax.legend()
        fig.tight_layout()
        written.append(save_figure(fig, out / "tokens_per_source.png", dpi=100))
    return written


class DocumentQueryError(ValueError):
    """A `--doc SHARD:N` that names no document, or a build without provenance (one line)."""


NO_PROVENANCE = (
    "{root}: built without provenance: set `output: {{path: ..., provenance: true}}` in the "
    "recipe (or `--set output.provenance=true`) and rebuild to get each shard's "
    "documents.parquet"
)


def _shard_named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """The shard `name` names: `train/00003`, `val/code/00000`, or its file's name (any of its
    files, with or without the build folder)."""
    want = name.strip("/")
    for suffix in (".bin", ".idx", ".mask", PROVENANCE_SUFFIX):
        want = want.removesuffix(suffix)
    found = []
    for s in manifest["shards"]:
        stem = str(s["file"]).removesuffix(".bin")
        if stem == want or stem.endswith("/" + want):
            found.append(s)
    if not found:
        first = str(manifest["shards"][0]["file"]).removesuffix(".bin").split("/", 1)[-1]
        raise DocumentQueryError(f"--doc: no shard {name!r} (shards are named like {first!r})")
    if len(found) > 1:
        names = ", ".join(str(s["file"]) for s in found[:3])
        raise DocumentQueryError(f"--doc: {name!r} names {len(found)} shards ({names}): say which")
    return found[0]


def _first_line(root: Path, manifest: dict[str, Any], shard: dict[str, Any], n: int) -> str:
    """The first line of document `n` of a shard that is not blank, decoded."""
    from lemur.shards.format import open_tokens
    from lemur.tokenizer import open_tokenizer

    tok_info = manifest["tokenizer"]
    tok = open_tokenizer(root / tok_info["file"], engine=tok_info.get("engine", "auto"))
    ends = np.asarray(open_index(root, shard), np.int64)
    start = int(ends[n - 1]) if n else 0
    ids = np.asarray(open_tokens(root, shard, manifest["dtype"])[start : int(ends[n])])
    if manifest.get("framing") != "template":  # our framing: BOS (if any) ... EOS
        ids = ids[(1 if tok_info.get("bos_id") is not None else 0) : -1]
    text = tok.decode(ids.tolist())
    return next((line for line in text.splitlines() if line.strip()), "")


def document_info(directory: str | Path, spec: str) -> dict[str, Any]:
    """Where document `N` of shard `SHARD` came from (`--doc SHARD:N`): its row of the
    shard's documents.parquet, its place and its first line."""
    from lemur.data.runs.provenance import read_shard_row

    root = Path(directory)
    manifest = check_readable(root)
    name, sep, number = spec.rpartition(":")
    if not sep or not name or not number.isdigit():
        raise DocumentQueryError(f"--doc {spec!r}: expected SHARD:N, e.g. train/00003:17")
    shard, n = _shard_named(manifest, name), int(number)
    if n >= shard["documents"]:
        raise DocumentQueryError(
            f"--doc {spec}: {shard['file']} holds {shard['documents']} documents (0 to "
            f"{shard['documents'] - 1})"
        )
    if "provenance" not in shard:
        raise DocumentQueryError(NO_PROVENANCE.format(root=root))
    row = read_shard_row(root / shard["provenance"], n)
    ends = np.asarray(open_index(root, shard), np.int64)
    tokens = int(ends[n] - (ends[n - 1] if n else 0))
    place = {"shard": shard["file"], "document": n, "split": shard["split"], "tokens": tokens}
    return {**place, **row, "first_line": _first_line(root, manifest, shard, n)}


def print_document(info: dict[str, Any]) -> None:
    """`--doc`'s lines: one field a line, the first line last."""
    quality = info.get("quality") or []
    shown = {
        **{k: v for k, v in info.items() if k not in ("quality", "files", "first_line")},
        "quality": ", ".join(f"{k}={v:.4g}" for k, v in quality) or None,
        "files": ", ".join(info.get("files") or []) or None,
    }
    width = max(len(k) for k in (*shown, "first line"))
    for key, value in shown.items():
        if value is not None:
            print(f"{key:<{width}}  {value}")
    print(f"{'first line':<{width}}  {info['first_line'][:200]}")
