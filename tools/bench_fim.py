"""Benchmark: what FIM adds per document, against tokenizing it: parts re-encoded vs spliced.

All runs in this process on the same real code (Python stdlib sources), alternating, best of
--repeats, on a SentencePiece model with CodeLlama's FIM pieces appended (as the build does)
or a tokenizer.json with its own FIM tokens (default: Llama-3's from the llama-models wheel
with Qwen2.5-Coder's tokens added):
  tokenize       : `tok.encode(text)` of every document (what the build's tokenize step pays)
  fim-reencode   : for the documents FIM chooses (`--rate`), decode the document's ids,
                   cut, and encode the three parts (`encode_parts`: the build before the
                   splicer, and still for models it refuses, such as unigram ones)
  fim-splice     : the same documents through `WordSplicer` (lemur/tokenizer/fim_splice.py):
                   decode, cut, and encode only the words at the cuts

Both FIM runs must give the same ids for every document (checked). For a tokenizer.json,
the decode of the FIM documents by lemur (tiktoken where exact) and by `tokenizers`. The figure that matters
is each FIM run's CPU time over `tokenize`'s: the share FIM adds to the tokenize work.

    python tools/bench_fim.py --mb 20 \
        --tokenizer .venv/lib/python3.11/site-packages/mistral_common/data/tokenizer.model.v1
    python tools/bench_fim.py --mb 20   # Llama-3 + Qwen2.5-Coder's tokens (tiktoken engine)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_tokenize import stdlib_code
from benchlib import best_of

from lemur.data.encode.tokenizer import extend_tokenizer
from lemur.data.fim.cut import fim_chosen, fim_split
from lemur.data.recipe.fim import FimConfig
from lemur.tokenizer import Tokenizer, open_tokenizer
from lemur.tokenizer.fim import FIM_PIECES, encode_parts, fim_layout, fim_parts, find_code_markers
from lemur.tokenizer.fim_splice import WordSplicer


def _tokenizer(path: str | None) -> Tokenizer:
    """The benchmark's tokenizer: a SentencePiece model with CodeLlama's pieces appended, a
    tokenizer.json folder as it is, or (None) Llama-3's with Qwen2.5-Coder's tokens."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_fim_"))
    if path is None:
        from bytelevel_fixtures import QWEN_CODER_TOKENS, add_tokens, llama3_folder

        return open_tokenizer(add_tokens(llama3_folder(tmp / "l3"), QWEN_CODER_TOKENS, False))
    if Path(path).is_file() and not path.endswith(".json"):
        return open_tokenizer(extend_tokenizer(path, (), tmp / "fim.model", control=FIM_PIECES))
    return open_tokenizer(path)


def main() -> int:
    """Run the benchmark and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=20.0, help="MB of real code")
    ap.add_argument("--tokenizer", help="a SentencePiece model or a tokenizer.json folder")
    ap.add_argument("--rate", type=float, default=0.5, help="fim.rate")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    tok = _tokenizer(args.tokenizer)
    markers = find_code_markers(tok)
    splicer = WordSplicer.for_tokenizer(tok)
    if markers is None or splicer is None:
        sys.exit(f"{args.tokenizer}: no FIM markers or no splicer for this model")
    texts = stdlib_code(int(args.mb * 1e6))
    settings = FimConfig(rate=args.rate, spm_rate=0.5)
    doc_ids = [np.asarray(tok.encode(t), np.uint32) for t in texts]
    chosen = [i for i in range(len(texts)) if fim_chosen(settings, f"d{i}")]

    def tokenize() -> int:
        return sum(len(tok.encode(t)) for t in texts)

    def reencoded(i: int) -> list[int]:
        """Document i's FIM ids: decoded, cut, its parts encoded."""
        text = tok.decode(doc_ids[i])
        cut = fim_split(text, settings, f"d{i}")
        return encode_parts(
            tok, fim_parts(cut.prefix, cut.middle, cut.suffix, markers, spm=cut.spm)
        )

    def spliced(i: int) -> list[int] | None:
        """Document i's FIM ids: decoded, cut, spliced from its own ids."""
        text = tok.decode(doc_ids[i])
        cut = fim_split(text, settings, f"d{i}")
        a = len(cut.prefix)
        layout = fim_layout(a, a + len(cut.middle), len(text), markers, spm=cut.spm)
        return splicer.ids(layout, text, doc_ids[i])

    mismatched = sum(spliced(i) != reencoded(i) for i in chosen)
    if mismatched:
        sys.exit(f"{mismatched} documents: spliced ids differ from the parts' encoding")
    runs = {
        "fim-reencode": lambda: sum(len(reencoded(i)) for i in chosen),
        "fim-splice": lambda: sum(len(spliced(i) or ()) for i in chosen),
    }
    best, _ = best_of(runs, args.repeats)
    base, n = best_of({"tokenize": tokenize}, args.repeats)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(
        f"{tok.kind} ({tok.engine}), markers {markers.style}: "
        f"{len(texts):,} code documents, {mb:.1f} MB, {n:,} tokens; {len(chosen):,} made FIM "
        f"(rate {args.rate}), ids equal for all; best of {args.repeats}"
    )
    print("| run | CPU s | vs tokenize |")
    print("|---|---|---|")
    print(f"| tokenize | {base['tokenize']:.2f} | 1.00x |")
    for name, secs in best.items():
        print(f"| {name} | {secs:.2f} | {secs / base['tokenize']:.3f}x |")
    print(f"splice / re-encode: {best['fim-splice'] / best['fim-reencode']:.3f}x")
    reference = getattr(tok, "reference", None)  # tokenizer.json: `tokenizers` decodes too
    if reference is not None:
        arrays = [doc_ids[i] for i in chosen]  # as the FIM stage holds them
        decodes, _ = best_of(
            {
                "lemur": lambda: sum(len(tok.decode(ids)) for ids in arrays),
                "tokenizers": lambda: sum(
                    len(reference.decode(ids.tolist(), skip_special_tokens=False)) for ids in arrays
                ),
            },
            args.repeats,
        )
        print(
            f"decode of the FIM documents: lemur {decodes['lemur']:.3f} s, `tokenizers` "
            f"{decodes['tokenizers']:.3f} s ({decodes['tokenizers'] / decodes['lemur']:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
