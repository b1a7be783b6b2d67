"""Tests for lemur.shards.windows and lemur.train.loader: windows, shuffling, host sharding,
resume, mixtures, checks."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from lemur.shards.check import ShardCompatibilityError, check_compatible
from lemur.shards.format import (
    FORMAT,
    ShardFormatError,
    ShardWriter,
    atomic_write_json,
    dtype_name,
    open_index,
    open_tokens,
    token_dtype,
)
from lemur.shards.windows import BATCH_KEYS, ShardSource, window_record
from lemur.train.loader import (
    ExpectedTokenizer,
    LoaderStateMismatch,
    Reading,
    make_eval_iterators,
    make_train_iterator,
)
from lemur.train.old_loader_state import content_id_with_build_folder, saved_before_rename

VOCAB = 1000
SEQ = 32
TOKENIZER = b"not a real sentencepiece model, only its bytes matter here"


def build_dir(
    root: Path,
    *,
    seed: int,
    lo: int = 3,
    hi: int = VOCAB,
    n_docs: int = 300,
    dtype: np.dtype | None = None,
    tokenizer: bytes = TOKENIZER,
) -> Path:
    """Write a small shard directory: ~9 train shards, val shards for code and text."""
    rng = np.random.default_rng(seed)
    dtype = token_dtype(VOCAB) if dtype is None else np.dtype(dtype)
    root.mkdir(parents=True)
    (root / "tokenizer.model").write_bytes(tokenizer)

    def doc() -> np.ndarray:
        # Mostly short documents, some of one token, some longer than a window.
        kind = rng.random()
        n = (
            1
            if kind < 0.1
            else int(rng.integers(60, 200))
            if kind < 0.3
            else int(rng.integers(1, 40))
        )
        return np.concatenate(([1], rng.integers(lo, hi, n), [2]))

    shards = []
    for prefix, split, domain, count in (
        ("train", "train", "mixed", n_docs),
        ("val/code", "val", "code", 40),
        ("val/text", "val", "text", 25),
    ):
        w = ShardWriter(root, prefix, split, domain, dtype, shard_tokens=2000)
        for _ in range(count):
            w.add(doc())
        shards += w.close()
    atomic_write_json(
        root / "manifest.json",
        {
            "format": FORMAT,
            "dtype": dtype_name(dtype),
            "seq_len": 4096,
            "tokenizer": {
                "file": "tokenizer.model",
                "sha256": hashlib.sha256(tokenizer).hexdigest(),
                "vocab_size": VOCAB,
                "bos_id": 1,
                "eos_id": 2,
            },
            "shards": [s.to_json() for s in shards],
            "mix": {},
            "counts": {},
            "recipe": {},
            "recipe_sha256": "",
        },
    )
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dir(tmp_path_factory.mktemp("a") / "corpus", seed=0, hi=500)


@pytest.fixture(scope="module")
def corpus_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dir(tmp_path_factory.mktemp("b") / "corpus", seed=1, lo=500)


@pytest.fixture(scope="module")
def keys(corpus: Path) -> dict[bytes, int]:
    """Window index by its input tokens (all windows are distinct)."""
    src = ShardSource(corpus, SEQ)
    out = {src[i]["inputs"].tobytes(): i for i in range(len(src))}
    assert len(out) == len(src)
    return out


def it_for(dirs, vocab_size=None, **kw):
    """A train iterator of `dirs`; keywords of `Reading` go into its `reading`."""
    reading = {"num_threads": 0}
    reading |= {k: kw.pop(k) for k in [k for k in kw if k in Reading.__dataclass_fields__]}
    kw = {
        "seq_len": SEQ,
        "batch_size": 8,
        "seed": 0,
        "process_index": 0,
        "process_count": 1,
        "expect": None if vocab_size is None else ExpectedTokenizer(vocab_size),
        "reading": Reading(**reading),
        **kw,
    }
    return make_train_iterator(dirs, **kw)


def take(it, n: int) -> list[dict[str, np.ndarray]]:
    return [next(it) for _ in range(n)]


def rows(batches, keys: dict[bytes, int]) -> list[int]:
    return [keys[r.tobytes()] for b in batches for r in b["inputs"]]


def same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    if len(a) != len(b):
        return False
    return all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def reference(tokens: np.ndarray, ends: np.ndarray, start: int, L: int) -> dict[str, np.ndarray]:
    """The record computed the slow, obvious way from the document index."""
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate(([0], ends[:-1]))
    doc = np.repeat(np.arange(len(ends)), ends - starts)  # document of every token
    pos = np.arange(len(doc)) - starts[doc]
    d = doc[start : start + L + 1]
    seg = d[:-1] - d[0] + 1
    positions = np.where(d[:-1] == d[0], np.arange(L), pos[start : start + L])
    w = np.asarray(tokens[start : start + L + 1], np.int64)
    return {
        "inputs": w[:-1],
        "targets": w[1:],
        "segment_ids": seg,
        "positions": positions,
        "loss_mask": (d[1:] == d[:-1]).astype(np.int64),
    }


def assert_record(rec: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    assert sorted(rec) == sorted(BATCH_KEYS)
    for k in BATCH_KEYS:
        assert rec[k].dtype == np.int32 and rec[k].shape == ref[k].shape, k
        np.testing.assert_array_equal(rec[k], ref[k], err_msg=k)


def test_records_match_document_index(corpus: Path) -> None:
    src = ShardSource(corpus, SEQ)
    manifest_shards = [s for s in src.shards]
    for i in range(len(src)):
        s, start = src.locate(i)
        tokens = open_tokens(corpus, manifest_shards[s], src.dtype.name)
        ends = open_index(corpus, manifest_shards[s])
        assert_record(src[i], reference(tokens, ends, start, SEQ))
    # Many documents per window (the vectorized path) and a document starting exactly
    # at the window end (only the mask changes).
    ends = np.arange(3, 3001, 3, dtype=np.int64)
    tokens = np.tile(np.array([1, 7, 2], np.uint16), 1000)
    for start in (0, 1, 2, 96, 1000):
        assert_record(window_record(tokens, ends, start, 96), reference(tokens, ends, start, 96))


def test_windows_stay_in_shard_and_tail_is_counted(corpus: Path) -> None:
    src = ShardSource(corpus, SEQ)
    tokens = [int(s["tokens"]) for s in src.shards]
    assert len(src) == sum((t - 1) // SEQ for t in tokens)
    assert src.dropped_tokens == sum(tokens) - len(src) * SEQ
    assert 0 < src.dropped_tokens <= len(tokens) * SEQ
    s, start = src.locate(len(src) - 1)
    assert start + SEQ + 1 <= tokens[s]
    with pytest.raises(IndexError):
        src[len(src)]


def test_every_record_once_per_epoch_and_seeds_reorder(corpus: Path, keys) -> None:
    n = len(keys)
    it = it_for(corpus)
    stream = rows(take(it, 2 * n // 8 + 1), keys)
    first, second = stream[:n], stream[n : 2 * n]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
    assert first != second  # a new permutation each epoch
    other = rows(take(it_for(corpus, seed=1), n // 8 + 1), keys)[:n]
    assert sorted(other) == list(range(n)) and other != first
    assert first != list(range(n))  # it did shuffle


@pytest.mark.parametrize("pcount", [2, 3])
def test_processes_read_disjoint_records_covering_all(corpus: Path, keys, pcount: int) -> None:
    n, batch = len(keys), 4
    steps = -(-n // (pcount * batch))
    per_host = [
        take(it_for(corpus, batch_size=batch, process_index=p, process_count=pcount), steps)
        for p in range(pcount)
    ]
    # Global order: step, then row, then host (host p holds global rows p, p + P, ...).
    stream = [
        rows([per_host[p][s]], keys)[m]
        for s in range(steps)
        for m in range(batch)
        for p in range(pcount)
    ]
    assert sorted(stream[:n]) == list(range(n))
    # Within the epoch, each host's records are its own: no record on two hosts.
    epoch_of = [stream[p:n:pcount] for p in range(pcount)]
    assert all(len(set(e)) == len(e) for e in epoch_of)
    assert sum(len(e) for e in epoch_of) == len(set().union(*epoch_of)) == n
    # The global batches equal a single process's batches of pcount * batch records.
    single = take(it_for(corpus, batch_size=pcount * batch), steps)
    for s in range(steps):
        for p in range(pcount):
            for k in BATCH_KEYS:
                np.testing.assert_array_equal(single[s][k][p::pcount], per_host[p][s][k])


def test_restore_into_fresh_iterator_gives_the_same_batches(corpus: Path, keys) -> None:
    ahead = 5
    epoch_steps = len(keys) // 8
    marks = [0, 1, 17, epoch_steps, epoch_steps + 3]
    # The reference reads ahead in a thread; restores read without one: same batches.
    ref = it_for(corpus, num_threads=1, prefetch=4)
    states, batches = {}, []
    for step in range(marks[-1] + ahead):
        if step in marks:
            states[step] = json.loads(json.dumps(ref.get_state()))  # as a checkpoint stores it
        batches.append(next(ref))
    ref.close()
    for step, state in states.items():
        fresh = it_for(corpus)
        fresh.set_state(state)
        assert same(take(fresh, ahead), batches[step : step + ahead]), step
        assert fresh.get_state()["global_next_index"] == (step + ahead) * 8


def test_restore_with_another_process_count(corpus: Path, keys) -> None:
    hosts = [it_for(corpus, batch_size=4, process_index=p, process_count=2) for p in range(2)]
    for h in hosts:
        take(h, 5)
    state = hosts[0].get_state()
    assert state == hosts[1].get_state()  # any host's state restores every host
    assert state["global_next_index"] == 5 * 2 * 4
    # Same global batch on one host: exactly the batches of an uninterrupted run.
    one = it_for(corpus, batch_size=8)
    one.set_state(state)
    assert same(take(one, 4), take(it_for(corpus, batch_size=8), 9)[5:])
    # Three hosts of 4: the global stream continues at record 40.
    flat = rows(take(it_for(corpus, batch_size=1), 40 + 36), keys)
    three = [it_for(corpus, batch_size=4, process_index=p, process_count=3) for p in range(3)]
    for h in three:
        h.set_state(state)
    got = [rows(take(h, 3), keys) for h in three]
    stream = [got[p][s * 4 + m] for s in range(3) for m in range(4) for p in range(3)]
    assert stream == flat[40:]


def test_a_moved_copy_resumes_in_the_same_order(tmp_path: Path, corpus: Path) -> None:
    it = it_for(corpus)
    take(it, 4)
    moved = tmp_path / "elsewhere"
    shutil.copytree(corpus, moved)
    fresh = it_for(moved)
    fresh.set_state(it.get_state())  # the fingerprint names the content, not the path
    assert same(take(fresh, 3), take(it, 3))


def as_build(corpus: Path, root: Path, build: str) -> Path:
    """A copy of `corpus` laid out as `lemur-data build` writes it: shards under `build-<id>/`."""
    shutil.copytree(corpus, root)
    (root / build).mkdir()
    for part in ("train", "val"):
        (root / part).rename(root / build / part)
    manifest = json.loads((root / "manifest.json").read_text())
    for shard in manifest["shards"]:
        shard["file"], shard["index"] = f"{build}/{shard['file']}", f"{build}/{shard['index']}"
    atomic_write_json(root / "manifest.json", manifest)
    return root


def test_a_rebuild_into_another_build_folder_trains_in_the_same_order(
    tmp_path: Path, corpus: Path
) -> None:
    # Each build hashes its inputs' stat into the folder name: the same shards rebuilt
    # land in another folder, and must shuffle, and resume, as they did.
    first = as_build(corpus, tmp_path / "first", "build-5b1c0a3a408f")
    again = as_build(corpus, tmp_path / "again", "build-d6e2e5ece8c7")
    assert ShardSource(first, SEQ).content_id == ShardSource(corpus, SEQ).content_id
    it = it_for(first)
    batches = take(it, 4)
    assert same(batches, take(it_for(again), 4))
    fresh = it_for(again)
    fresh.set_state(it.get_state())
    assert same(take(fresh, 3), take(it, 3))


def test_a_state_saved_with_the_build_folder_in_its_ids_is_recognized_and_refused(
    tmp_path: Path, corpus: Path
) -> None:
    first = as_build(corpus, tmp_path / "first", "build-5b1c0a3a408f")
    source = ShardSource(first, SEQ)
    # The identity lemur gave the data before the build folder left it (shards/windows.py
    # at 4dcc95b), written out here so that the old ids cannot drift with the new ones.
    listing = [[s["file"], s["tokens"], s["documents"], s.get("sha256")] for s in source.shards]
    old_id = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]
    assert content_id_with_build_folder(source.shards) == old_id != source.content_id
    # A checkpoint of such a run at step 6: its order is gone (a state is only a position,
    # so it cannot be converted), and resuming it is refused, recognized as such.
    it = it_for(first)
    old_fingerprint = it.identity.fingerprint([old_id])
    saved = {"version": 1, "global_next_index": 6 * 8, "fingerprint": old_fingerprint}
    assert old_fingerprint != it.fingerprint
    assert saved_before_rename(saved, it.identity)
    with pytest.raises(LoaderStateMismatch, match="another pipeline"):
        it.set_state(saved)
    # A state of today's pipeline, or of another pipeline, is not taken for one.
    assert not saved_before_rename({**saved, "fingerprint": it.fingerprint}, it.identity)
    assert not saved_before_rename(saved, it_for(first, seed=1).identity)
    # Without build folder in the file names the identities agree: nothing to refuse.
    plain = it_for(corpus)
    assert not saved_before_rename({**saved, "fingerprint": plain.fingerprint}, plain.identity)


def test_state_from_another_pipeline_is_refused(corpus: Path) -> None:
    it = it_for(corpus)
    take(it, 3)
    state = it.get_state()
    with pytest.raises(ValueError, match="another pipeline"):
        it_for(corpus, seed=1).set_state(state)
    lenient = it_for(corpus, seed=1, strict_state=False)
    lenient.set_state(state)
    assert lenient.get_state()["global_next_index"] == 24


@pytest.mark.parametrize("weights", [(3.0, 1.0), (1.0, 4.0)])
def test_mixture_weights_are_honoured(corpus: Path, corpus_b: Path, weights) -> None:
    it = it_for([(str(corpus), weights[0]), (str(corpus_b), weights[1])])
    batches = take(it, 50)
    from_a = np.concatenate([b["inputs"].max(axis=1) < 500 for b in batches])
    want = weights[0] / sum(weights)
    # Grain interleaves deterministically, so the share is exact up to rounding.
    assert abs(from_a.mean() - want) < 0.02
    # Within one component's epoch no record repeats.
    a_rows = [r.tobytes() for b in batches for r in b["inputs"] if r.max() < 500]
    assert len(set(a_rows)) == len(a_rows)
    # The mixture resumes like a single source.
    state = json.loads(json.dumps(it.get_state()))
    fresh = it_for([(str(corpus), weights[0]), (str(corpus_b), weights[1])])
    fresh.set_state(state)
    assert same(take(fresh, 3), take(it, 3))


def test_mixture_refuses_different_tokenizers(tmp_path: Path, corpus: Path) -> None:
    other = build_dir(tmp_path / "other", seed=2, n_docs=60, tokenizer=b"another tokenizer")
    with pytest.raises(ShardCompatibilityError, match="different tokenizers"):
        it_for([(str(corpus), 1.0), (str(other), 1.0)])
    with pytest.raises(ValueError, match="positive"):
        it_for([(str(corpus), 1.0), (str(other), 0.0)])


def test_eval_streams_read_each_val_window_once_in_order(corpus: Path) -> None:
    streams = make_eval_iterators(
        corpus, seq_len=SEQ, batch_size=4, process_index=0, process_count=1
    )
    assert sorted(streams) == ["code", "text"]
    for domain, stream in streams.items():
        src = ShardSource(corpus, SEQ, split="val", domain=domain)
        batches = list(stream)
        assert len(batches) == len(stream) == -(-len(src) // 4)
        real = [
            {k: b[k][r] for k in BATCH_KEYS}
            for b in batches
            for r in range(4)
            if b["loss_mask"][r].any() or b["segment_ids"][r].any()
        ]
        assert len(real) == len(src)
        for i, rec in enumerate(real):
            for k in BATCH_KEYS:
                np.testing.assert_array_equal(rec[k], src[i][k])
        pad = len(batches) * 4 - len(src)
        assert not batches[-1]["loss_mask"][4 - pad :].any()
        assert same(list(stream), batches)  # deterministic, re-iterable
    assert (
        len(
            list(
                make_eval_iterators(
                    corpus,
                    seq_len=SEQ,
                    batch_size=4,
                    max_batches=1,
                    process_index=0,
                    process_count=1,
                )["code"]
            )
        )
        == 1
    )
    # Two hosts: the same number of batches, together every window once.
    two = [
        make_eval_iterators(corpus, seq_len=SEQ, batch_size=4, process_index=p, process_count=2)[
            "text"
        ]
        for p in range(2)
    ]
    assert len(two[0]) == len(two[1])
    got = sorted(
        b["inputs"][r].tobytes()
        for s in two
        for b in s
        for r in range(4)
        if b["segment_ids"][r].any()
    )
    src = ShardSource(corpus, SEQ, split="val", domain="text")
    assert got == sorted(src[i]["inputs"].tobytes() for i in range(len(src)))


def one_line_error(exc: pytest.ExceptionInfo, name: str) -> None:
    assert "\n" not in str(exc.value) and name in str(exc.value), str(exc.value)


def test_check_compatible_refuses_mismatches(tmp_path: Path, corpus: Path) -> None:
    sha = hashlib.sha256(TOKENIZER).hexdigest()
    manifest = check_compatible(corpus, vocab_size=VOCAB, tokenizer_sha256=sha, seq_len=SEQ)
    assert manifest["tokenizer"]["vocab_size"] == VOCAB
    with pytest.raises(ShardCompatibilityError, match="vocab_size") as e:
        check_compatible(corpus, vocab_size=32000)
    one_line_error(e, "manifest.json")
    with pytest.raises(ShardCompatibilityError, match="tokenizer sha256") as e:
        check_compatible(corpus, vocab_size=VOCAB, tokenizer_sha256="0" * 64)
    one_line_error(e, "manifest.json")
    with pytest.raises(ShardCompatibilityError, match="seq_len") as e:
        check_compatible(corpus, vocab_size=VOCAB, seq_len=100_000)
    with pytest.raises(ShardCompatibilityError, match="vocab_size"):
        it_for(corpus, vocab_size=VOCAB + 1)
    wide = build_dir(tmp_path / "wide", seed=3, n_docs=60, dtype=np.dtype("<u4"))
    with pytest.raises(ShardCompatibilityError, match="dtype uint32") as e:
        check_compatible(wide, vocab_size=VOCAB)
    one_line_error(e, "manifest.json")
    stale = tmp_path / "stale"
    shutil.copytree(corpus, stale)
    (stale / "tokenizer.model").write_bytes(b"a newer tokenizer")
    with pytest.raises(ShardCompatibilityError, match="stale") as e:
        check_compatible(stale, vocab_size=VOCAB)
    one_line_error(e, "tokenizer.model")


@pytest.mark.parametrize(
    "damage", ["truncate_bin", "missing_idx", "short_idx", "wrong_ends", "missing_tokenizer"]
)
def test_structural_checks_name_the_file(tmp_path: Path, corpus: Path, damage: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = json.loads((bad / "manifest.json").read_text())["shards"][1]
    bin_path, idx_path = bad / shard["file"], bad / shard["index"]
    if damage == "truncate_bin":
        bin_path.write_bytes(bin_path.read_bytes()[:-2])
        name = shard["file"]
    elif damage == "missing_idx":
        idx_path.unlink()
        name = shard["index"]
    elif damage == "short_idx":
        idx_path.write_bytes(idx_path.read_bytes()[:-8])
        name = shard["index"]
    elif damage == "wrong_ends":
        ends = np.fromfile(idx_path, "<u8")
        ends[-1] -= 1
        ends.tofile(idx_path)
        name = shard["index"]
    else:
        (bad / "tokenizer.model").unlink()
        name = "tokenizer.model"
    with pytest.raises(ShardFormatError) as e:
        ShardSource(bad, SEQ) if damage != "missing_tokenizer" else check_compatible(
            bad, vocab_size=VOCAB
        )
    one_line_error(e, name)
    with pytest.raises(ShardFormatError):
        check_compatible(bad, vocab_size=VOCAB)


@pytest.mark.parametrize("damage", ["repeated_end", "first_end_zero", "decreasing"])
def test_structure_rules_are_stated_once(tmp_path: Path, corpus: Path, damage: str) -> None:
    """An index that does not increase strictly: the same one line from `structure_problem`
    (start-up and `lemur-data stats`) and `check_index` (contents), the last entry intact."""
    from lemur.shards import check
    from lemur.shards.verify import structure_problem

    assert structure_problem is check.structure_problem  # lemur.data.stats imports this one
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = json.loads((bad / "manifest.json").read_text())["shards"][1]
    idx_path = bad / shard["index"]
    ends = np.fromfile(idx_path, "<u8")
    entry = {"repeated_end": 1, "first_end_zero": 0, "decreasing": 1}[damage]
    ends[entry] = {"repeated_end": ends[0], "first_end_zero": 0, "decreasing": ends[0] - 1}[damage]
    ends.tofile(idx_path)
    problem = check.structure_problem(bad, shard, 2)
    assert problem == (
        f"{idx_path}: document index entry {entry} is {int(ends[entry])} (previous "
        f"{0 if entry == 0 else int(ends[entry - 1])}, shard of {shard['tokens']} tokens): "
        "corrupt index"
    )
    # The cheap start-up form reads only the last entry, which is intact.
    assert check.structure_problem(bad, shard, 2, whole_index=False) is None
    ShardSource(bad, SEQ)
    with pytest.raises(ShardFormatError) as e:
        check_compatible(bad, vocab_size=VOCAB)
    assert str(e.value).startswith(problem + " ")
    one_line_error(e, shard["index"])


def test_a_chat_shards_mask_is_checked_for_presence_and_size(tmp_path: Path, corpus: Path) -> None:
    from lemur.shards.check import structure_problem

    shard = dict(json.loads((corpus / "manifest.json").read_text())["shards"][0])
    assert structure_problem(corpus, shard, 2) is None
    mask = tmp_path / "00000.mask"
    shard["mask"] = str(mask)  # absolute: `corpus / mask` is `mask`, the fixture stays intact
    assert structure_problem(corpus, shard, 2) == (
        f"{mask}: shard file listed in the manifest is missing"
    )
    mask.write_bytes(bytes(shard["tokens"] - 1))
    assert structure_problem(corpus, shard, 2) == (
        f"{mask}: {shard['tokens'] - 1} bytes, manifest says {shard['tokens']} tokens x 1 mask byte"
    )
    mask.write_bytes(bytes(shard["tokens"]))
    assert structure_problem(corpus, shard, 2) is None


def test_source_pickles_without_data_and_has_a_stable_repr(corpus: Path) -> None:
    src = ShardSource(corpus, SEQ)
    first = src[3]
    blob = pickle.dumps(src)
    assert len(blob) < 20_000  # no token data travels to worker processes
    copy = pickle.loads(blob)
    assert repr(copy) == repr(src) == repr(ShardSource(corpus, SEQ))
    assert "0x" not in repr(src)
    for k in BATCH_KEYS:
        np.testing.assert_array_equal(copy[3][k], first[k])


def test_page_release_does_not_change_records(corpus: Path) -> None:
    # release_bytes=1 drops the mapped pages after every window.
    eager, plain = ShardSource(corpus, SEQ, release_bytes=1), ShardSource(corpus, SEQ)
    for i in range(0, len(plain), 7):
        for k in BATCH_KEYS:
            np.testing.assert_array_equal(eager[i][k], plain[i][k])


def test_worker_processes_give_the_same_batches(corpus: Path) -> None:
    it = it_for(corpus, num_workers=1)
    try:
        got = take(it, 4)
        state = it.get_state()
    finally:
        it.close()
    ref = it_for(corpus)
    assert same([{k: np.asarray(v) for k, v in b.items()} for b in got], take(ref, 4))
    assert state == ref.get_state()


def test_state_round_trips_through_an_orbax_checkpoint(tmp_path: Path, corpus: Path) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    import grain

    it = it_for(corpus)
    take(it, 3)
    mngr = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data", "data_grain"))
    # JsonSave stores the process-independent state once (restorable with any process
    # count); Grain's own handler writes one file per process (same process count only).
    mngr.save(
        3,
        args=ocp.args.Composite(
            data=ocp.args.JsonSave(it.get_state()), data_grain=grain.checkpoint.CheckpointSave(it)
        ),
    )
    mngr.wait_until_finished()
    want = take(it, 2)
    fresh = it_for(corpus)
    fresh.set_state(mngr.restore(3, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data)
    assert same(take(fresh, 2), want)
    other = it_for(corpus)
    mngr.restore(3, args=ocp.args.Composite(data_grain=grain.checkpoint.CheckpointRestore(other)))
    assert same(take(other, 2), want)
    mngr.close()


def test_index_check_finds_a_corrupt_middle_entry_fast(tmp_path: Path) -> None:
    from lemur.shards.check import check_index

    # 8M documents (64 MB of index, a ~16B-token shard's worth at 2k tokens a document).
    n = 8_000_000
    ends = np.arange(1, n + 1, dtype="<u8") * 3
    path = tmp_path / "big.idx"
    ends.tofile(path)
    import time

    t = time.perf_counter()
    check_index(path, 3 * n)
    elapsed = time.perf_counter() - t
    assert elapsed < 5.0, elapsed  # ~0.1 s here: vectorized, in 32 MiB chunks
    for i, value, word in ((n // 2, 3 * n + 7, "shard of"), (5_000_001, 5, "previous")):
        bad = ends.copy()
        bad[i] = value
        bad.tofile(path)
        with pytest.raises(ShardFormatError, match=f"entry {i} is {value} .*{word}") as e:
            check_index(path, 3 * n)
        one_line_error(e, "big.idx")


def test_token_ids_beyond_the_vocab_name_the_shard(tmp_path: Path, corpus: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = json.loads((bad / "manifest.json").read_text())["shards"][0]
    tokens = np.fromfile(bad / shard["file"], "<u2")
    src = ShardSource(bad, SEQ)
    window = 3
    i, start = src.locate(window)
    assert src.shards[i]["file"] == shard["file"]
    tokens[start + 5] = VOCAB + 3
    tokens.tofile(bad / shard["file"])
    # Without a vocab the source reads it as is; with one, the read names file and offset.
    assert src[window]["inputs"][5] == VOCAB + 3
    checked = ShardSource(bad, SEQ, vocab_size=VOCAB)
    with pytest.raises(
        ShardFormatError, match=f"token id {VOCAB + 3} at offset {start + 5} >= vocab_size {VOCAB}"
    ) as e:
        checked[window]
    one_line_error(e, shard["file"])
    # Through the iterator (Grain's reader threads re-raise it in the consumer).
    with pytest.raises(ShardFormatError, match="token id"):
        take(it_for(bad, vocab_size=VOCAB, num_threads=2, batch_size=64), 200)


def test_a_val_split_too_small_for_one_window_names_the_keys_to_change(tmp_path: Path) -> None:
    """Continued pre-training on a small corpus: its val split (one document of 148 tokens)
    holds no window at batch.seq_len 1024; the error names the keys that fix it (#44 item 8)."""
    from lemur.train.batch import HostSlice
    from lemur.train.config import config_from_dict
    from lemur.train.errors import RunError
    from lemur.train.setup import DataDirs, RunPlan, open_eval_streams

    root = build_dir(tmp_path / "small", seed=3, n_docs=3000)
    manifest = json.loads((root / "manifest.json").read_text())
    w = ShardWriter(root, "val/tiny", "val", "code", token_dtype(VOCAB), shard_tokens=2000)
    w.add(np.concatenate(([1], np.full(146, 7), [2])))
    manifest["shards"] = [s for s in manifest["shards"] if s["split"] == "train"]
    manifest["shards"] += [s.to_json() for s in w.close()]
    atomic_write_json(root / "manifest.json", manifest)
    config = config_from_dict(
        {
            "data": {"dirs": [str(root)]},
            "model": {"preset": "tiny", "overrides": {"max_seq_len": 1024}},
            "batch": {"size": 4, "seq_len": 1024},
        }
    )
    plan = RunPlan(config, None, VOCAB, manifest["tokenizer"]["sha256"], [])
    with pytest.raises(RunError) as e:
        open_eval_streams(config, DataDirs(), plan, HostSlice(0, 1, 4))
    assert str(e.value) == (
        f"{root}/manifest.json: no val shards of domain 'code' holds a window of seq_len + 1 "
        "= 1025 tokens (the longest holds 148): lower batch.seq_len to 147 or less, rebuild "
        f"{root} with a larger val_fraction, or name other directories in data.eval_dirs"
    )
