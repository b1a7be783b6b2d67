"""Benchmark: chat tokenizing with loss masks vs a plain SentencePiece encode loop.

All runs go in this process over the same real ChatML conversations (pydoc help topics and
stdlib function docstrings as answers, rendered by `render_chatml`), alternating, best of
--repeats, CPU time of one core (num_threads=1 everywhere):
  plain-loop : `sp.encode(text)` per conversation, with <s> and </s> (no masks)
  plain-batch: `sp.encode(list_of_texts, num_threads=1)`
  lemur-chat : `ChatEncoder.run` (one offset-mapping encode per conversation, loss masks,
               long-conversation cut) feeding `TokenizeWriter(masks=True).run` (framing,
               writing the task's token run and its aligned mask file)

    python tools/bench_chat.py --mb 20
"""

from __future__ import annotations

import argparse
import ast
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from datatrove.data import Document

from lemur.data.read.chat import render_chatml
from lemur.data.recipe import TokenizerTrainConfig
from lemur.data.tokenize.chat import CHAT_PIECES, ChatEncoder
from lemur.data.tokenize.step import TokenizeWriter
from lemur.data.tokenize.tokenizer import extend_tokenizer, load_tokenizer, train_tokenizer


def answers(max_bytes: int):
    """Real (question, answer) pairs: pydoc topics, then stdlib function docstrings."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield f"What does the Python help topic '{name}' say?", topics[name]
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (doc := ast.get_docstring(node)):
                if len(doc) > 200:
                    yield f"What does {path.stem}.{node.name} do?", doc


def conversations(max_bytes: int) -> list[tuple[str, list, list]]:
    """Rendered conversations (text, loss spans, turn ends) of about `max_bytes`, 1-2 exchanges."""
    out, size, pending = [], 0, []
    for i, (q, a) in enumerate(answers(max_bytes)):
        pending += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if i % 3 == 2 or len(pending) == 4:
            head = [{"role": "system", "content": "You are a Python expert."}] if i % 2 else []
            out.append(render_chatml(head + pending))
            size += len(out[-1][0].encode())
            pending = []
        if size >= max_bytes:
            break
    return out


def cpu_time(fn) -> tuple[float, int]:
    """CPU seconds of fn(), and what it returned."""
    t0 = time.process_time()
    n = fn()
    return time.process_time() - t0, n


def main() -> int:
    """Run the benchmark and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=20.0, help="MB of conversations")
    ap.add_argument("--tokenizer", help="existing tokenizer.model to extend (default: train 16k)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-docs", type=int, default=256)
    args = ap.parse_args()

    convs = conversations(int(args.mb * 1e6))
    texts = [c[0] for c in convs]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench_chat_"))
    if args.tokenizer:
        tok = str(extend_tokenizer(args.tokenizer, CHAT_PIECES, tmp / "tok.model"))
    else:
        config = TokenizerTrainConfig(vocab_size=16000)
        tok = str(train_tokenizer(texts[::4], config, tmp / "tok.model", CHAT_PIECES))
    sp = load_tokenizer(tok)
    meta = {"source": "chat", "source_index": 0, "language": "en"}
    docs = [
        Document(text, f"c{i}", {**meta, "loss_spans": spans, "turn_ends": ends})
        for i, (text, spans, ends) in enumerate(convs)
    ]

    def plain_loop() -> int:
        return sum(len(sp.encode(t, add_bos=True, add_eos=True)) for t in texts)

    def plain_batch() -> int:
        return sum(len(x) for x in sp.encode(texts, add_bos=True, add_eos=True, num_threads=1))

    def chat() -> int:
        for d in docs:  # ChatEncoder consumes its inputs' metadata: fresh documents each run
            d.metadata = {
                **meta,
                "loss_spans": d.metadata["loss_spans"],
                "turn_ends": d.metadata["turn_ends"],
            }
        encoder = ChatEncoder(tok, 1 << 30, "truncate", args.batch_docs)
        writer = TokenizeWriter(tok, str(tmp / "out"), args.batch_docs, masks=True)
        for _ in writer.run(encoder.run(iter(docs))):
            pass
        n = (tmp / "out" / "00000.bin").stat().st_size // 2
        assert (tmp / "out" / "00000.mask").stat().st_size == n
        return n

    best: dict[str, float] = {}
    tokens = {}
    for _ in range(args.repeats):
        for name, fn in (
            ("plain-loop", plain_loop),
            ("plain-batch", plain_batch),
            ("lemur-chat", chat),
        ):
            secs, n = cpu_time(fn)
            tokens[name] = n
            best[name] = min(best.get(name, float("inf")), secs)
    assert len(set(tokens.values())) == 1, f"token counts differ: {tokens}"
    n = tokens["plain-loop"]
    print(
        f"{len(texts):,} conversations, {mb:.1f} MB, {n:,} tokens, vocab {sp.vocab_size()}, "
        f"best of {args.repeats}"
    )
    print("| run | CPU s | conversations / CPU-s | MB / CPU-s | vs plain-loop |")
    print("|---|---|---|---|---|")
    for name, secs in best.items():
        print(
            f"| {name} | {secs:.2f} | {len(texts) / secs:,.0f} | {mb / secs:.2f} | "
            f"{best['plain-loop'] / secs:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
