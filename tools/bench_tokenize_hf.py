"""Benchmark: lemur's tokenize stage with a byte-level BPE tokenizer.json (Llama-3's 128k).

All runs in this process on the same real documents (stdlib sources, /usr/share/doc text,
pydoc topics), alternating, best of --repeats, CPU seconds (all threads of the process):
  tiktoken          : raw `encode_ordinary` per document (the floor)
  tokenizers-batch  : raw `tokenizers` `encode_batch_fast` (special-token parsing off)
  datatrove-stage   : datatrove's `DocumentTokenizer` with the same tokenizer.json
  lemur-stage       : `TokenizeWriter.run` (lemur's stage: engine choice, long-piece guard,
                      framing, writing token runs)
Token counts are compared as content + 2 per document (each run frames differently).
Then the cost per MB of pathological documents (1 MB of one character, of spaces, long
digit runs...) through lemur's encoder, against normal text.

    python tools/bench_tokenize_hf.py --mb 20          # Llama-3's tokenizer from llama-models
    python tools/bench_tokenize_hf.py --tokenizer DIR  # any tokenizer.json or HF folder
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench_tokenize import real_documents
from benchlib import best_of, tokenizer_bench_args
from datatrove.data import Document

from lemur.data.encode.step import TokenizeWriter
from lemur.tokenizer import open_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def pathological() -> dict[str, str]:
    """1 MB documents that are slow or fatal for a naive byte-level encoder."""
    return {
        "1 MB of 'a'": "a" * 1_000_000,
        "1 MB of spaces (in a document)": "x" + " " * 1_000_000 + "y",
        "1 MB of digits": "7" * 1_000_000,
        "1 MB of '='": "=" * 1_000_000,
        "1 MB of newlines": "x" + "\n" * 1_000_000,
        "1 MB of 'é' (2 bytes each)": "é" * 500_000,
        "1 MB of '中' (3 bytes each)": "中" * 333_333,
        "1 MB of literal special tokens": "<|begin_of_text|><|eot_id|> " * 35_715,
        "1 MB with lone surrogates": "a\ud800b " * 250_000,
    }


def main() -> int:
    """Run the benchmark and print two markdown tables."""
    args = tokenizer_bench_args(
        __doc__, 20.0, "MB of real documents", "tokenizer.json or HF folder (default: Llama-3's)"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench_tok_hf_"))
    if args.tokenizer:
        folder = Path(args.tokenizer)
    else:
        from bytelevel_fixtures import llama3_folder

        folder = llama3_folder(tmp / "llama3")
    tok = open_tokenizer(folder)
    path = str(folder / "tokenizer.json" if folder.is_dir() else folder)
    texts = real_documents(int(args.mb * 1e6))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    docs = [
        Document(text=t, id=f"d{i}", metadata={"source_index": 0, "language": "x"})
        for i, t in enumerate(texts)
    ]
    itemsize = 4 if tok.vocab_size > 65536 else 2
    reference = tok.reference

    def raw_tiktoken() -> int:
        enc = tok._tiktoken
        return sum(len(enc.encode_ordinary(t)) + 2 for t in texts)

    def tokenizers_batch() -> int:
        out = reference.encode_batch_fast(texts, add_special_tokens=False)
        return sum(len(e.ids) + 2 for e in out)

    def datatrove_stage() -> int:
        from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

        out = tmp / "dt"
        step = DocumentTokenizer(
            str(out), path, eos_token="<|end_of_text|>", batch_size=1000, shuffle_documents=False
        )
        step.run(iter(docs))  # not a generator: it consumes the documents
        written = sum(f.stat().st_size for f in out.glob("*.ds")) // itemsize
        for f in out.glob("*"):
            f.unlink()
        return written + len(texts)  # doc EOS: one framing token per document

    def lemur_stage() -> int:
        step = TokenizeWriter(path, str(tmp / "out"), args.batch_docs)
        for _ in step.run(iter(docs)):
            pass
        return (tmp / "out" / "00000.bin").stat().st_size // itemsize

    runs = {"tiktoken": raw_tiktoken, "tokenizers-batch": tokenizers_batch}
    runs |= {"datatrove-stage": datatrove_stage, "lemur-stage": lemur_stage}
    if tok.engine != "tiktoken":
        del runs["tiktoken"]
    best, n = best_of(runs, args.repeats)
    base = "tiktoken" if "tiktoken" in best else "tokenizers-batch"
    print(
        f"{len(texts):,} documents, {mb:.1f} MB, {n:,} tokens, vocab {tok.vocab_size}, "
        f"engine {tok.engine}, best of {args.repeats}"
    )
    print(f"| run | CPU s | MB / CPU-s | vs {base} | lemur-stage vs it |")
    print("|---|---|---|---|---|")
    for name, secs in best.items():
        print(
            f"| {name} | {secs:.2f} | {mb / secs:.2f} | {best[base] / secs:.2f}x | "
            f"{secs / best['lemur-stage']:.2f}x |"
        )
    normal = mb / best["lemur-stage"]
    print(
        f"\nlemur's encoder per MB on pathological documents (normal text: {normal:.2f} MB/CPU-s)"
    )
    print("| document | CPU s | MB / CPU-s | cost per MB vs normal text |")
    print("|---|---|---|---|")
    for name, text in pathological().items():
        t0 = time.process_time()
        tok.encode(text)
        secs = time.process_time() - t0
        size = len(text.encode("utf-8", "surrogatepass")) / 1e6
        print(f"| {name} | {secs:.3f} | {size / secs:.2f} | {normal / (size / secs):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
