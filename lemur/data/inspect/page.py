"""What the inspect page shows, gathered as plain data: the build's numbers (read once from
the manifest and stats.json through `lemur.data.stats`, the one home of those figures), the
samples the build kept (the folder the manifest's `samples.dir` names) and the first of its
`rejects:` folder, and a bounded shard browser (a few documents per shard, each token's
decoded piece computed here with the build's tokenizer, since a page cannot run one).
See docs/inspect.md.

Everything embedded is bounded whatever the build's size: samples are capped by the build
(K per reason, bytes per text) and again here on reading; the shard browser takes at most
`max_shards` shards per split, `docs_per_shard` documents and `max_doc_tokens` tokens each.
"""

from __future__ import annotations

import bisect
import gzip
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.repos.render import PLAIN_FILE
from lemur.data.sample_stage import SAMPLES_DIR
from lemur.data.samples.records import (
    DECONTAMINATION,
    DROPS,
    EXACT_DUPLICATES,
    KEPT,
    NEAR_DUPLICATES,
    PII,
    SUMMARY,
)
from lemur.data.stats import compute_stats, document_lengths, framing
from lemur.shards.format import (
    MANIFEST,
    ShardFormatError,
    open_index,
    open_mask,
    open_tokens,
    read_manifest,
)
from lemur.tokenizer import Tokenizer, TokenizerError, open_tokenizer
from lemur.tokenizer.fim import MARKER_ROLES

PAGE_FORMAT = "lemur-inspect/1"
# The page's name of each samples file (the format's own names: lemur/data/samples/records).
SAMPLE_FILES = {
    "drops": DROPS,
    "near_duplicates": NEAR_DUPLICATES,
    "exact_duplicates": EXACT_DUPLICATES,
    "decontamination": DECONTAMINATION,
    "pii": PII,
    "kept": KEPT,
}
# Reading a samples file stops past these (a file the build wrote is far smaller: K per
# reason, each text at most `max_bytes`), so that a stray file cannot swell the process.
MAX_SAMPLE_RECORDS = 20_000
MAX_SAMPLE_BYTES = 32 << 20
# The samples' texts on the page, all together: a recipe of many sources and reasons can
# sample more than a page should hold (20 sources x 20 reasons x 20 x 8 KB = 64 MB), so
# every text is cut to one common length that fits (marked cut, as the build marks its own).
SAMPLE_TEXT_BUDGET = 6 << 20
# The `rejects:` folder holds every dropped document: it is read up to this many bytes
# (decompressed), and each text kept to the samples' default cap.
REJECT_READ = 64 << 20
REJECT_CHARS = 8192
# How far back a token's piece is decoded from: enough for a byte-level model's longest
# UTF-8 sequence and SentencePiece's leading-space rule, short enough to stay linear.
PIECE_CONTEXT = 8
# Characters JSON writes as \u00XX (six bytes).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


class InspectError(ValueError):
    """A folder that is no build, or a build file the page cannot read: one line."""


@dataclass(frozen=True)
class BrowserLimits:
    """How much of the shards the page embeds (its size does not grow with the build)."""

    max_shards: int = 6  # per split
    docs_per_shard: int = 6  # the first half of them, then a seeded sample of the rest
    max_doc_tokens: int = 1500  # a document's tokens past this are cut (marked)
    seed: int = 0


def gather(directory: str | Path, limits: BrowserLimits = BrowserLimits()) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data; InspectError for a folder that is no
    build (or whose files are damaged)."""
    root = Path(directory)
    if not (root / MANIFEST).is_file():
        raise InspectError(f"{root}: no {MANIFEST}: not a lemur-data build folder")
    try:
        stats = compute_stats(root)
    except (ShardFormatError, OSError) as e:
        raise InspectError(str(e)) from None
    manifest = read_manifest(root)  # read again: compute_stats returns figures, not it
    return {
        "format": PAGE_FORMAT,
        "name": root.resolve().name,
        "build": _build_facts(stats, manifest),
        "funnel": funnel(manifest),
        "drops": stats["drops"],
        "counts": _count_facts(stats["counts"]),
        "mix": {"ratio": stats["ratio"], "sources": stats["sources"]},
        "languages": stats["languages"],
        "groups": stats["groups"],
        "lengths": stats["lengths"],
        "length_histograms": length_histograms(root, manifest),
        "splits": stats["splits"],
        "classifiers": _classifier_facts(stats.get("classifiers") or {}),
        "samples": _samples_and_rejects(root, manifest),
        "browser": shard_browser(root, manifest, limits),
    }


def _samples_and_rejects(root: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The samples folder's records and the first of the `rejects:` folder's, their texts
    fit to the page's budget together; None when the build wrote neither."""
    samples = read_samples(root, manifest)
    rejects = read_rejects(manifest)
    if rejects:
        samples = samples or {name: [] for name in SAMPLE_FILES} | {"summary": {}}
        samples["rejects"] = rejects
    if samples is not None:
        fit_texts(samples, SAMPLE_TEXT_BUDGET)
    return samples


def length_histograms(root: Path, manifest: dict[str, Any], bins: int = 30) -> dict[str, Any]:
    """Tokens per document per `split/domain` (the shard indexes, as `stats` reads them), in
    log-spaced bins: a bounded picture of any number of documents."""
    out = {}
    for key, lengths in sorted(document_lengths(root, manifest).items()):
        if not len(lengths):
            continue
        top = max(float(lengths.max()), 2.0)
        edges = np.unique(np.round(np.geomspace(1, top + 1, bins + 1)))
        counts, _ = np.histogram(lengths, bins=edges)
        out[key] = {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}
    return out


def _build_facts(stats: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The heading: dtype, seq_len, vocabulary, framing, kind of corpus."""
    return {
        "dtype": stats["dtype"],
        "seq_len": stats["seq_len"],
        "vocab_size": stats["vocab_size"],
        "framing": framing(stats.get("tokenizer", {})),
        "chat": any(s.get("mask") for s in manifest["shards"]),
        "fim": stats.get("fim", {}).get("counts"),
        "repositories": bool((manifest.get("counts") or {}).get("repositories")),
        "recipe_sha256": manifest.get("recipe_sha256"),
    }


def _count_facts(counts: dict[str, Any]) -> dict[str, Any]:
    """The manifest counts the page shows (not its error list, which can be long)."""
    keys = ("read", "kept", "tokenized", "duplicates", "dropped", "pii", "decontaminated")
    out = {k: counts[k] for k in keys if k in counts}
    dedup = counts.get("dedup") or {}
    out["dedup"] = {k: dedup[k] for k in ("exact", "near", "by_source") if k in dedup}
    out["errors_total"] = counts.get("errors_total", 0)
    return out


def _classifier_facts(classifiers: dict[str, Any]) -> dict[str, Any]:
    """Each classifier's rule, counts and examples around its cut, as the manifest has them."""
    keep = ("label", "model", "min_score", "keep_top", "thresholds", "keep_rate")
    out = {}
    for name, c in classifiers.items():
        facts = {k: c[k] for k in keep if k in c}
        facts |= {k: c.get(k, 0) for k in ("kept", "dropped", "scored")}
        facts["examples"] = c.get("examples", {})
        out[name] = facts
    return out


def funnel(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source: documents read -> kept by the filters -> left after dedup -> selected
    by the mix (train documents, repeats counted, and tokens), the manifest's numbers."""
    counts = manifest.get("counts") or {}
    removed = (counts.get("dedup") or {}).get("by_source") or {}
    mixed = (manifest.get("mix") or {}).get("sources") or {}
    domains = {
        s.get("name"): s.get("domain", "?")
        for s in (manifest.get("recipe") or {}).get("sources", [])
        if isinstance(s, dict)
    }
    rows = []
    for name, s in (counts.get("sources") or {}).items():
        gone = removed.get(name) or {}
        kept = s.get("kept", 0)
        m = mixed.get(name) or {}
        rows.append(
            {
                "source": name,
                "domain": domains.get(name, m.get("domain", "?")),
                "read": s.get("read", 0),
                "kept": kept,
                "deduplicated": kept - gone.get("exact", 0) - gone.get("near", 0),
                "mixed": m.get("documents", 0),
                "available_tokens": m.get("available_tokens", 0),
                "tokens": m.get("tokens", 0),
            }
        )
    return rows


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A samples file's records (bounded), each a JSON object, else InspectError naming
    the file and line."""
    records: list[dict[str, Any]] = []
    size = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            size += len(line)
            if len(records) >= MAX_SAMPLE_RECORDS or size > MAX_SAMPLE_BYTES:
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise InspectError(f"{path}:{n}: not a JSON line ({e})") from None
            if not isinstance(record, dict):
                raise InspectError(f"{path}:{n}: a record must be a JSON object")
            records.append(record)
    return records


def read_samples(root: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The build's samples folder (the manifest's `samples.dir`, inside the build's own
    directory; else `samples/`; docs/format.md#samples), or None when it wrote none."""
    entry = manifest.get("samples")
    folder = root / str(entry.get("dir", SAMPLES_DIR) if isinstance(entry, dict) else SAMPLES_DIR)
    if not folder.is_dir():
        return None
    out: dict[str, Any] = {}
    for name, file in SAMPLE_FILES.items():
        path = folder / file
        out[name] = _read_jsonl(path) if path.is_file() else []
    summary = folder / SUMMARY
    try:
        out["summary"] = json.loads(summary.read_text()) if summary.is_file() else {}
    except (OSError, ValueError) as e:
        raise InspectError(f"{summary}: not readable JSON ({e})") from None
    if not isinstance(out["summary"], dict):
        raise InspectError(f"{summary}: must be a JSON object")
    return out


def _reject_record(line: str, path: Path, n: int) -> dict[str, Any]:
    """One `rejects:` line (a datatrove Document: text, id, metadata with `filter_reason`
    and, from our filters, `filter_value`, `filter_threshold`, `filter_op`, `filter_rule`)
    as a drop sample."""
    try:
        doc = json.loads(line)
    except ValueError as e:
        raise InspectError(f"{path}:{n}: not a JSON line ({e})") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        raise InspectError(f"{path}:{n}: not a rejected document (no metadata)")
    text = str(doc.get("text", ""))
    return {
        "source": str(meta.get("source", "?")),
        "reason": str(meta.get("filter_reason", path.parent.name)),
        "id": str(doc.get("id", "")),
        "text": text[:REJECT_CHARS],
        "cut": len(text) > REJECT_CHARS,
        "bytes": len(text.encode("utf-8", "surrogatepass")),
        **{
            k: meta[f"filter_{k}"]
            for k in ("value", "threshold", "op", "rule")
            if f"filter_{k}" in meta
        },
    }


def read_rejects(manifest: dict[str, Any], per_reason: int = 20) -> list[dict[str, Any]]:
    """The first `per_reason` documents of each (source, reason) in the build's `rejects:`
    folder (one folder per filter of `RANK.jsonl.gz` files), read a page at a time and
    never past REJECT_READ bytes in all: the folder holds every drop, and may be huge."""
    folder = (manifest.get("recipe") or {}).get("rejects")
    root = Path(str(folder)).expanduser() if folder else None
    if root is None or not root.is_dir():
        return []
    taken: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any]] = []
    read = 0
    for path in sorted(root.glob("*/*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                read += len(line)
                if read > REJECT_READ:
                    return out
                record = _reject_record(line, path, n)
                key = (record["source"], record["reason"])
                if taken.get(key, 0) < per_reason:
                    taken[key] = taken.get(key, 0) + 1
                    out.append(record)
    return out


def _text_fields(samples: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every (record, key) of the samples holding a document's text."""
    found: list[tuple[dict[str, Any], str]] = []

    def add(record: Any, key: str) -> None:
        if isinstance(record, dict) and isinstance(record.get(key), str):
            found.append((record, key))

    for name in ("drops", "kept", "pii", "rejects"):
        for r in samples.get(name, []):
            add(r, "text")
    for r in samples.get("decontamination", []):
        add(r, "excerpt")
    for r in samples.get("exact_duplicates", []):
        add(r.get("kept"), "text")
    for r in samples.get("near_duplicates", []):
        add(r.get("kept"), "text")
        for m in r.get("removed") or []:
            add(m, "text")
    borderline = (samples.get("summary") or {}).get("classifier_borderline") or {}
    for docs in borderline.values() if isinstance(borderline, dict) else []:
        for d in docs if isinstance(docs, list) else []:
            add(d, "text")
    return found


def _page_bytes(text: str) -> float:
    """Bytes a text's characters take on the page, on average, as `embed_json` writes them
    (`<`, `>`, `&` and control characters 6, a quote or newline 2, `é` 2, most code 1);
    counted with str.count, as escaping every text took longer than the rest of the page."""
    if not text:
        return 1.0
    size = len(text.encode("utf-8", "surrogatepass"))
    size += 5 * sum(map(text.count, "<>&\u2028\u2029")) + sum(map(text.count, '"\\\n\t\r'))
    size += 5 * len(_CONTROL.findall(text))
    return size / len(text)


def fit_texts(samples: dict[str, Any], budget: int) -> int | None:
    """Cut every sample text longer than one common length (characters) so that all of them
    together take at most about `budget` bytes on the page; the length, or None when all
    fit as they are."""
    fields = _text_fields(samples)
    sizes = [(len(r[k]), _page_bytes(r[k])) for r, k in fields]
    if sum(n * w for n, w in sizes) <= budget:
        return None
    lo, hi = 0, max(n for n, _ in sizes)  # the longest cap whose total fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) * w for n, w in sizes) <= budget:
            lo = mid
        else:
            hi = mid - 1
    for record, key in fields:
        text = record[key]
        if len(text) > lo:
            record.setdefault("bytes", len(text.encode("utf-8", "surrogatepass")))
            record[key], record["cut"] = text[:lo], True
    return lo


def token_pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Each token's decoded text, so that the pieces joined are `tok.decode(ids)` of the
    text tokens: a piece is what decoding it adds after the few tokens before it (a token
    that ends inside a UTF-8 character gets "" and the next one the whole character)."""
    pieces = [""] * len(ids)
    start = 0  # the first token whose text is not out yet
    for i in range(len(ids)):
        s = max(0, start - PIECE_CONTEXT)
        cur = tok.decode(ids[s : i + 1])
        if cur.endswith("\ufffd") and i + 1 < len(ids) and i - start < 4:
            continue  # an incomplete character: wait for the token that completes it
        base = tok.decode(ids[s:start])
        pieces[i] = cur[len(base) :] if cur.startswith(base) else tok.decode(ids[start : i + 1])
        start = i + 1
    return pieces


def _marker_roles(tok: Tokenizer, manifest: dict[str, Any]) -> dict[int, str]:
    """FIM and repository marker ids -> role: the manifest's `fim.markers`, else the
    model's own markers when the build wrote repository documents with them."""
    markers = (manifest.get("fim") or {}).get("markers") or {}
    roles = {int(v): r for r, v in markers.items() if r in MARKER_ROLES and isinstance(v, int)}
    repos = (manifest.get("counts") or {}).get("repositories") or {}
    if repos.get("format") == "markers" and "file_sep" not in roles.values():
        from lemur.tokenizer.fim import MARKER_STYLES

        for style in MARKER_STYLES.values():
            for role in ("repo_name", "file_sep"):
                i = tok.piece_id(style[role]) if role in style else None
                if i is not None:
                    roles.setdefault(i, role)
    return roles


def _pick_docs(n: int, limits: BrowserLimits, key: str) -> list[int]:
    """The documents of a shard shown: the first few, then a seeded sample of the rest."""
    first = list(range(min(n, (limits.docs_per_shard + 1) // 2)))
    rest = range(len(first), n)
    k = min(len(rest), limits.docs_per_shard - len(first))
    rng = random.Random(f"{limits.seed}:{key}")
    return first + sorted(rng.sample(rest, k))


def plain_file_seps(pieces: list[str]) -> list[int]:
    """Where a plain-text repository document's files start: the tokens whose text begins
    a `<file_sep>` (the format's spelling when the model has no marker of its own)."""
    starts, at = [], 0
    for p in pieces:
        starts.append(at)
        at += len(p)
    text = "".join(pieces)
    found, i = [], text.find(PLAIN_FILE)
    while i >= 0:
        found.append(bisect.bisect_right(starts, i) - 1)
        i = text.find(PLAIN_FILE, i + 1)
    return found


def _document(
    tok: Tokenizer, tokens: np.ndarray, mask: np.ndarray | None, a: int, b: int, cap: int
) -> dict[str, Any]:
    """One document of a shard: ids, each text token's piece (a control or special token,
    shown as a labelled chip, has none), its mask."""
    ids = [int(x) for x in tokens[a : min(b, a + cap)]]
    text_at = [i for i, t in enumerate(ids) if not tok.is_control(t)]
    pieces = [""] * len(ids)
    for i, p in zip(text_at, token_pieces(tok, [ids[i] for i in text_at]), strict=True):
        pieces[i] = p
    doc: dict[str, Any] = {"offset": a, "length": b - a, "ids": ids, "pieces": pieces}
    doc["cut"] = b - a > cap
    if seps := plain_file_seps(pieces):
        doc["file_seps"] = seps
    if mask is not None:
        doc["mask"] = "".join("1" if m else "0" for m in mask[a : a + len(ids)])
    return doc


def shard_browser(
    root: Path, manifest: dict[str, Any], limits: BrowserLimits = BrowserLimits()
) -> dict[str, Any]:
    """The shard browser's data: per split, a few shards with a few decoded documents, the
    names of control ids and the marker roles."""
    try:
        tok = open_tokenizer(root / manifest["tokenizer"]["file"])
    except (TokenizerError, OSError) as e:
        raise InspectError(f"{root / manifest['tokenizer']['file']}: {e}") from None
    shards, seen = [], set()
    per_split: dict[str, int] = {}
    for s in manifest["shards"]:
        per_split[s["split"]] = per_split.get(s["split"], 0) + 1
        if per_split[s["split"]] > limits.max_shards:
            continue
        tokens = open_tokens(root, s, manifest["dtype"])
        ends = np.asarray(open_index(root, s), dtype=np.int64)
        mask = open_mask(root, s)
        docs = []
        for d in _pick_docs(len(ends), limits, s["file"]):
            a = int(ends[d - 1]) if d else 0
            doc = _document(tok, tokens, mask, a, int(ends[d]), limits.max_doc_tokens)
            docs.append({"index": d, **doc})
            seen.update(doc["ids"])
        keep = ("file", "split", "domain", "tokens", "documents")
        shards.append({k: s[k] for k in keep} | {"docs": docs})
    control = sorted(i for i in seen if tok.is_control(i))
    return {
        "shards": shards,
        "shards_per_split": per_split,
        "limits": {"docs_per_shard": limits.docs_per_shard, "max_tokens": limits.max_doc_tokens},
        "control": {str(i): _control_name(tok, i) for i in control},
        "roles": {str(i): r for i, r in _marker_roles(tok, manifest).items()},
        # A chat build's markers (`<|im_start|>`): text never holds them, so they are chips.
        "added": {
            str(p["id"]): p["piece"]
            for p in manifest["tokenizer"].get("added_pieces") or []
            if isinstance(p, dict) and isinstance(p.get("id"), int)
        },
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
    }


def _control_name(tok: Tokenizer, i: int) -> str:
    """How a control token is labelled: BOS, EOS, or its spelling (`<|im_start|>`)."""
    if i == tok.bos_id:
        return "BOS"
    if i == tok.eos_id:
        return "EOS"
    return tok.decode([i]) or f"#{i}"
