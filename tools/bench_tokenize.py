"""Benchmark: tokens per CPU-second of lemur's tokenize stage vs plain SentencePiece encode.

All three run in this process on the same real documents (Python stdlib sources plus text
from /usr/share/doc and pydoc topics), alternating, best of --repeats:
  plain-loop : `sp.encode(text)` per document (the floor any tokenize stage pays)
  plain-batch: `sp.encode(list_of_texts, num_threads=1)`
  lemur-stage: `TokenizeWriter.run` (datatrove step: batching, framing, writing token runs)

    python tools/bench_tokenize.py --mb 40
"""

from __future__ import annotations

import sys
import sysconfig
import tempfile
from pathlib import Path

from benchlib import best_of, tokenizer_bench_args
from datatrove.data import Document

from lemur.data.demo import doc_files, pydoc_topics
from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.tokenizer import load_llama2_processor, train_tokenizer
from lemur.data.recipe.tokenizer import TokenizerTrainConfig


def real_documents(max_bytes: int) -> list[str]:
    """Real code (stdlib) and text (docs, pydoc topics), about 10:1 by bytes."""
    texts: list[str] = []
    size = 0
    text_budget = max_bytes // 11
    for row in list(pydoc_topics()) + list(doc_files(text_budget)):
        texts.append(row["text"])
        size += len(row["text"].encode())
        if size >= text_budget:
            break
    return texts + stdlib_code(max_bytes - size)


def stdlib_code(max_bytes: int) -> list[str]:
    """Python stdlib sources (sorted by path) until `max_bytes` of UTF-8."""
    texts: list[str] = []
    size = 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= max_bytes:
            break
        if "site-packages" in p.parts:
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        size += len(t.encode())
    return texts


def main() -> int:
    """Run the benchmark and print a markdown table."""
    args = tokenizer_bench_args(
        __doc__, 40.0, "MB of real documents", "existing tokenizer.model (default: train a 16k BPE)"
    )

    texts = real_documents(int(args.mb * 1e6))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench_tok_"))
    tok = args.tokenizer or str(
        train_tokenizer(texts[::3], TokenizerTrainConfig(vocab_size=16000), tmp / "tok.model")
    )
    sp = load_llama2_processor(tok)
    docs = [
        Document(text=t, id=f"d{i}", metadata={"source_index": 0, "language": "x"})
        for i, t in enumerate(texts)
    ]

    def plain_loop() -> int:
        return sum(len(sp.encode(t)) + 2 for t in texts)

    def plain_batch() -> int:
        return sum(len(x) + 2 for x in sp.encode(texts, num_threads=1))

    def stage() -> int:
        step = TokenizeWriter(tok, str(tmp / "out"), args.batch_docs)
        for _ in step.run(iter(docs)):
            pass
        return (tmp / "out" / "00000.bin").stat().st_size // 2

    runs = {
        "plain-loop": plain_loop,
        "plain-batch": plain_batch,
        "lemur-stage": stage,
    }
    best, n = best_of(runs, args.repeats)
    print(
        f"{len(texts):,} documents, {mb:.1f} MB, {n:,} tokens, vocab {sp.vocab_size()}, "
        f"best of {args.repeats}"
    )
    print("| run | CPU s | M tokens / CPU-s | MB / CPU-s | vs plain-loop |")
    print("|---|---|---|---|---|")
    for name, secs in best.items():
        print(
            f"| {name} | {secs:.2f} | {n / secs / 1e6:.3f} | {mb / secs:.2f} | "
            f"{best['plain-loop'] / secs:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
