"""The group stage: repository documents from the files the read tasks set aside, after dedup.

Group task `b` writes a token run laid out as a tokenize task's (`{b}.bin`, `.docs.npy`,
`.ids.txt`, `.json`), which the pack stage then reads in place of the read stage's runs:
- the documents of read task `b` that are no repository's files (text, other sources, rows
  without a repository), as they were tokenized, less those dedup removed;
- the repositories of bucket `b` (spill.py): every read task's rows of that bucket less the
  files dedup removed, grouped by source and repository, ordered (order.py), rendered in the
  model's repository format and split at file boundaries to the budget (render.py).
Its counts go to `{b}.repos.json`: files in (set aside) = grouped + removed as duplicates.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document

from lemur.atomic_files import atomic_open
from lemur.data.encode.step import TokenizeWriter
from lemur.data.fim.cut import fim_transform
from lemur.data.recipe.fim import FimConfig
from lemur.data.repos.order import RepoFile, order_files
from lemur.data.repos.render import RepoFormat, join_text, split_repository
from lemur.data.repos.spill import bucket_rows, spilled_locals
from lemur.data.run.task import TaskStep
from lemur.data.runs import provenance
from lemur.data.runs.format import removals, task_records
from lemur.shards.format import atomic_write_json, open_array
from lemur.tokenizer import Tokenizer, open_tokenizer
from lemur.tokenizer.fim import CodeMarkers, Leading, Part, encode_parts

COUNTS_SUFFIX = ".repos.json"


@dataclass(frozen=True)
class GroupSettings:
    """What every group task is configured with (picklable: executors ship it)."""

    tok_dir: str  # the read stage's token runs
    spill_dir: str
    dedup_dir: str | None
    out_dir: str
    tasks: int  # read tasks = group tasks = buckets
    tokenizer: str
    engine: str
    sources: tuple[str, ...]  # every source's name, by index
    grouped: tuple[int, ...]  # the indexes of the sources whose files are grouped
    order: str
    fmt: RepoFormat
    budget: int  # ids per document, framing included
    seed: int
    fim: FimConfig | None = None  # fill-in-the-middle per file (needs `markers`)
    markers: CodeMarkers | None = None
    domains: tuple[str, ...] = ()  # every source's domain, by index (provenance rows)


@dataclass
class GroupCounts:
    """One group task's counts (summed over tasks into the manifest by `repository_counts`)."""

    files_in: int = 0
    duplicates: int = 0
    grouped: int = 0
    repositories: int = 0
    repositories_removed: int = 0  # every file of it removed by dedup
    documents: int = 0
    split_repositories: int = 0
    files_over_budget: int = 0
    without_repository: int = 0
    by_source: dict[str, Counter] = field(default_factory=dict)
    removed_exact: Counter = field(default_factory=Counter)
    removed_near: Counter = field(default_factory=Counter)

    def source(self, name: str) -> Counter:
        """The per-source counter of `name`."""
        return self.by_source.setdefault(name, Counter())

    def to_json(self) -> dict[str, Any]:
        """Plain data (a task's `{rank}.repos.json`)."""
        return {
            **{k: int(getattr(self, k)) for k in SCALARS},
            "by_source": {n: dict(sorted(c.items())) for n, c in sorted(self.by_source.items())},
            "removed_exact": {str(k): v for k, v in sorted(self.removed_exact.items())},
            "removed_near": {str(k): v for k, v in sorted(self.removed_near.items())},
        }


SCALARS = (
    "files_in",
    "duplicates",
    "grouped",
    "repositories",
    "repositories_removed",
    "documents",
    "split_repositories",
    "files_over_budget",
    "without_repository",
)


class RunWriter:
    """A token run in a tokenize task's layout, written one framed document at a time."""

    def __init__(self, out: Path, rank: int, dtype: np.dtype, framing: list) -> None:
        self.out, self.rank, self.dtype, self.framing = out, rank, dtype, framing
        self.records: list[tuple] = []
        self.ids: list[str] = []
        self.languages: dict[str, int] = {}
        self.end = 0

    def add(
        self,
        fh: Any,
        ids: np.ndarray,
        source: int,
        language: str,
        doc_id: str,
        id_hash: int | None = None,
    ) -> None:
        """Write one framed document's ids to `fh` and record it (a copied document keeps
        the `id_hash` of its record: its id as written may have lost a newline)."""
        fh.write(np.asarray(ids).astype(self.dtype, copy=False).tobytes())
        self.end += len(ids)
        doc = Document(text="", id=doc_id, metadata={"source_index": source, "language": language})
        record = TokenizeWriter.record(doc, len(ids), self.end, self.languages)
        if id_hash is not None:
            record = (*record[:3], id_hash, *record[4:])
        self.records.append(record)
        self.ids.append(doc_id)

    def finish(self) -> None:
        """Write the records, ids and table (the token file is renamed after them)."""
        table = {"languages": list(self.languages), "framing": self.framing}
        TokenizeWriter.finish(self.out, self.rank, self.records, self.ids, table, self.dtype)


def _passthrough(
    s: GroupSettings, rank: int, writer: RunWriter, fh: Any, c: GroupCounts
) -> np.ndarray:
    """Copy read task `rank`'s documents that are no repository's files and dedup kept;
    their indexes in the read task's run."""
    tok_dir = Path(s.tok_dir)
    dedup = Path(s.dedup_dir) if s.dedup_dir else None
    rec = task_records(tok_dir, rank, dedup)
    tokens = open_array(tok_dir / f"{rank:05d}.bin", writer.dtype)
    ids = (tok_dir / f"{rank:05d}.ids.txt").read_text("utf-8").split("\n")
    spilled = np.zeros(len(rec), bool)
    spilled[spilled_locals(Path(s.spill_dir), rank)] = True
    c.removed_exact.update(rec.source[rec.removed_exact].tolist())
    c.removed_near.update(rec.source[rec.removed & ~rec.removed_exact].tolist())
    kept = np.flatnonzero(~rec.removed & ~spilled)
    for i in kept.tolist():
        source = int(rec.source[i])
        language = rec.languages[rec.language[i]]
        doc = tokens[rec.start[i] : rec.end[i]]
        writer.add(fh, doc, source, language, ids[i], int(rec.id_hash[i]))
        if source in s.grouped:  # a grouped source's file with no repository: kept alone
            c.without_repository += 1
            c.source(s.sources[source])["without_repository"] += 1
    return kept


def _bucket_files(s: GroupSettings, bucket: int, c: GroupCounts) -> dict[tuple, list[RepoFile]]:
    """Every read task's kept files of `bucket`, by (source, name, grouping key)."""
    repos: dict[tuple, list[RepoFile]] = {}
    seen: dict[tuple, str] = {}  # every repository of the bucket, kept file or not
    dedup = Path(s.dedup_dir) if s.dedup_dir else None
    for rank in range(s.tasks):
        rows = bucket_rows(Path(s.spill_dir), rank, bucket)
        if not rows:
            continue
        gone = set(removals(dedup, rank)["local"].tolist())
        # The read stage's count of each file's ids, framed: the split's estimate of its size.
        counted = np.load(Path(s.tok_dir) / f"{rank:05d}.docs.npy")["tokens"]
        for row in rows:
            name = s.sources[row["source"]]
            key = (row["source"], row["name"], row["group"])
            seen[key] = name
            c.files_in += 1
            c.source(name)["files_in"] += 1
            if row["local"] in gone:
                c.duplicates += 1
                c.source(name)["duplicates"] += 1
                continue
            tokens = int(counted[row["local"]])
            f = RepoFile(row["path"], row["text"], row["language"], row["id"], tokens)
            repos.setdefault(key, []).append(f)
    for key in seen.keys() - repos.keys():  # repositories = grouped + removed, per source too
        c.repositories_removed += 1
        c.source(seen[key])["repositories_removed"] += 1
    return repos


def _document_names(keys: list[tuple]) -> dict[tuple, str]:
    """A name per repository, unique within its source: two checkouts of one name (in two
    source paths) get `~2`, `~3` after the first by grouping key."""
    seen: Counter = Counter()
    names = {}
    for key in sorted(keys):
        source, name, _ = key
        seen[(source, name)] += 1
        n = seen[(source, name)]
        names[key] = name if n == 1 else f"{name}~{n}"
    return names


class RepoEncoder:
    """Renders a repository's files as documents of the model's format, encoded and framed."""

    def __init__(self, s: GroupSettings, tok: Tokenizer, framing: list) -> None:
        self.s, self.tok = s, tok
        bos, eos = framing
        self.head = [] if bos is None else [bos]
        self.tail = [eos]

    def encode(self, parts: list[Part]) -> np.ndarray:
        """The ids of a run of parts: markers as their ids, each run of text between them
        encoded as one text, never as a marker (lemur/tokenizer/fim.py)."""
        return np.asarray(encode_parts(self.tok, join_text(parts)), np.int64)

    def content(self, f: RepoFile) -> list[Part]:
        """A file's content parts: fill-in-the-middle, cut per file by its own seeded draw
        (its document id), or the text as it is."""
        fim, markers = self.s.fim, self.s.markers
        if fim is None or markers is None or "code" not in fim.domains:
            return [Leading(f.text)]
        return fim_transform(f.text, fim, f.doc_id, markers, self.s.seed)

    def documents(
        self, name: str, files: list[RepoFile]
    ) -> Iterator[tuple[np.ndarray, list[RepoFile]]]:
        """(framed ids, files held) of each document of one repository, in order."""
        fmt = self.s.fmt
        bodies = [fmt.file(f.path, self.content(f)) for f in files]
        budget = self.s.budget - len(self.head) - len(self.tail)
        sizes = None
        if fmt.plain and all(f.tokens for f in files):
            # A file's count as a document, less its framing, plus its separator line's
            # (an estimate: each document is then encoded whole and checked).
            framing = len(self.head) + len(self.tail)
            sizes = [f.tokens - framing + len(self.encode(fmt.file(f.path, []))) for f in files]
        for span, ids in split_repository(
            fmt.header(name), bodies, self.encode, budget, not fmt.plain, sizes
        ):
            framed = np.concatenate([np.asarray(self.head, ids.dtype), ids, [self.tail[0]]])
            yield framed, [files[i] for i in span]


def _language(files: list[RepoFile]) -> str:
    """A document's language: the one most of its bytes are in (ties: the first by name)."""
    size: Counter = Counter()
    for f in files:
        size[f.language] += len(f.text.encode("utf-8", "surrogatepass"))
    return min(size, key=lambda lang: (-size[lang], lang))


def _group(
    s: GroupSettings,
    encoder: RepoEncoder,
    repos: dict[tuple, list[RepoFile]],
    writer: RunWriter,
    fh: Any,
    c: GroupCounts,
    rows: list[dict] | None = None,
) -> None:
    """Write the documents of every repository of a bucket, in the order of their keys
    (with `rows`, a list, each document's provenance row appended to it)."""
    names = _document_names(list(repos))
    for key in sorted(repos):
        source, _, group = key
        files = order_files(repos[key], s.order, s.seed, f"{source}\0{group}")
        parts = 0
        for ids, held in encoder.documents(names[key], files):
            doc_id = f"{s.sources[source]}/{names[key]}#{parts}"
            writer.add(fh, ids, source, _language(held), doc_id)
            if rows is not None:
                rows.append(_repo_row(s, encoder, doc_id, key, held))
            parts += 1
            c.files_over_budget += len(held) == 1 and len(ids) > s.budget
        c.repositories += 1
        c.documents += parts
        c.grouped += len(files)
        c.split_repositories += parts > 1
        per = c.source(s.sources[source])
        per.update({"repositories": 1, "documents": parts, "grouped": len(files)})


def _repo_row(
    s: GroupSettings, encoder: RepoEncoder, doc_id: str, key: tuple, held: list[RepoFile]
) -> dict[str, Any]:
    """The provenance row of a repository document: its repository and its files' ids."""
    source, name, _ = key
    return {
        **dict.fromkeys(provenance.COLUMNS),
        "id": doc_id,
        "source": s.sources[source],
        "domain": s.domains[source] if s.domains else None,
        "language": _language(held),
        "repository": name,
        "files": [f.doc_id for f in held],
        "fim": any(encoder.content(f) != [Leading(f.text)] for f in held),
        "cluster_size": 1,  # its files' duplicates were removed before grouping
    }


def _rows(s: GroupSettings, rank: int, kept: np.ndarray, repo_rows: list[dict]) -> Any:
    """Group task `rank`'s provenance rows: the copied documents' own (with their dedup
    cluster sizes), then its repository documents'."""
    tok_dir = Path(s.tok_dir)
    read = provenance.read_task(tok_dir, rank, len(np.load(tok_dir / f"{rank:05d}.docs.npy")))
    sizes = provenance.cluster_sizes(
        Path(s.dedup_dir) if s.dedup_dir else None, rank, read.num_rows
    )
    if sizes is not None:
        read = provenance.with_cluster_sizes(read, sizes)
    return provenance.concat([read.take(kept), provenance.table_of(repo_rows)])


def group_task(s: GroupSettings, rank: int) -> None:
    """Group task `rank` (see the module's docstring)."""
    tok_dir, out = Path(s.tok_dir), Path(s.out_dir)
    table = json.loads((tok_dir / f"{rank:05d}.json").read_text())
    writer = RunWriter(out, rank, np.dtype(table["dtype"]), table["framing"])
    c = GroupCounts()
    repos = _bucket_files(s, rank, c)
    encoder = RepoEncoder(s, open_tokenizer(s.tokenizer, engine=s.engine), table["framing"])
    # The token file is renamed last (the outer block): its presence marks the task done.
    rows = [] if provenance.run_has_rows(tok_dir) else None  # `output.provenance`
    with atomic_open(out / f"{rank:05d}.bin") as fh:
        kept = _passthrough(s, rank, writer, fh, c)
        _group(s, encoder, repos, writer, fh, c, rows)
        if rows is not None:  # before the token file, as the records are
            provenance.write_task(out, rank, _rows(s, rank, kept, rows))
        writer.finish()
    atomic_write_json(out / f"{rank:05d}{COUNTS_SUFFIX}", c.to_json())


class RepoGroups(TaskStep):
    """The group stage's task `rank`: one bucket of repositories (see the module)."""

    name = "📦 lemur repositories"
    type = "📦 - REPOS"

    def __init__(self, settings: GroupSettings) -> None:
        super().__init__()
        self.settings = settings

    def task(self, rank: int) -> None:
        """Group task `rank`."""
        group_task(self.settings, rank)


def read_counts(out_dir: Path, tasks: int) -> GroupCounts:
    """Every finished group task's counts, summed."""
    total = GroupCounts()
    for rank in range(tasks):
        part = json.loads((out_dir / f"{rank:05d}{COUNTS_SUFFIX}").read_text())
        for k in SCALARS:
            setattr(total, k, getattr(total, k) + part[k])
        for name, per in part["by_source"].items():
            total.source(name).update(per)
        total.removed_exact.update({int(k): v for k, v in part["removed_exact"].items()})
        total.removed_near.update({int(k): v for k, v in part["removed_near"].items()})
    return total
