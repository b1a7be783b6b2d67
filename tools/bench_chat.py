"""Benchmark: chat tokenizing with loss masks vs a plain SentencePiece encode loop.

All runs go in this process over the same real ChatML conversations (the demo chat corpus,
lemur/data/chat_demo.py: questions on Python's help topics and stdlib functions answered by
their text and docstrings, drawn with several seeds up to --mb), alternating, best of
--repeats, CPU time of one core (num_threads=1 everywhere):
  plain-loop : `sp.encode(text, add_bos=True, add_eos=True)` per conversation (no masks)
  plain-batch: `sp.encode(list_of_texts, num_threads=1)`
  lemur-chat : `ChatEncoder.run` (the messages rendered as ChatML, one encoding per
               conversation, token byte offsets, loss
               masks, the long-conversation cut) feeding `TokenizeWriter(masks=True).run`
               (framing, writing the task's token run and its aligned mask file)
  lemur-chat (offset_mapping): the same with every offset taken from SentencePiece's
               `encode(out_type="offset_mapping")` (the path for models whose pieces do not
               map 1:1 to text)

    python tools/bench_chat.py --mb 10
    python tools/bench_chat.py --mb 10 --tokenizer PATH/llama-2/tokenizer.model
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from benchlib import best_of, tokenizer_bench_args
from datatrove.data import Document

from lemur.chatml import CHAT_PIECES, render_chatml
from lemur.data.chat_demo import conversations as demo_conversations
from lemur.data.encode import offsets as offsets_module
from lemur.data.encode.chat import ChatEncoder
from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.tokenizer import extend_tokenizer, load_llama2_processor, train_tokenizer
from lemur.data.read.chat import MESSAGES_KEY, Message
from lemur.data.recipe.tokenizer import TokenizerTrainConfig


def conversations(max_bytes: int) -> list[tuple[str, list[Message]]]:
    """Demo conversations (ChatML text, messages) of about `max_bytes`."""
    out, size, seed = [], 0, 0
    while size < max_bytes:
        for row in demo_conversations(seed):
            out.append((render_chatml(row["messages"])[0], row["messages"]))
            size += len(out[-1][0].encode())
            if size >= max_bytes:
                break
        seed += 1
    return out


def main() -> int:
    """Run the benchmark and print a markdown table."""
    args = tokenizer_bench_args(
        __doc__,
        20.0,
        "MB of conversations",
        "existing tokenizer.model to extend (default: train 16k)",
    )

    convs = conversations(int(args.mb * 1e6))
    texts = [c[0] for c in convs]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench_chat_"))
    if args.tokenizer:
        tok = str(extend_tokenizer(args.tokenizer, CHAT_PIECES, tmp / "tok.model"))
    else:
        config = TokenizerTrainConfig(vocab_size=16000)
        tok = str(train_tokenizer(texts[::4], config, tmp / "tok.model", CHAT_PIECES))
    sp = load_llama2_processor(tok)
    meta = {"source": "chat", "source_index": 0, "language": "en"}
    docs = [Document(text=text, id=f"c{i}", metadata={}) for i, (text, _) in enumerate(convs)]

    def plain_loop() -> int:
        return sum(len(sp.encode(t, add_bos=True, add_eos=True)) for t in texts)

    def plain_batch() -> int:
        return sum(len(x) for x in sp.encode(texts, add_bos=True, add_eos=True, num_threads=1))

    def chat(fallback: bool = False) -> int:
        for d, (text, messages) in zip(docs, convs, strict=True):
            # The steps consume their inputs' metadata: fresh metadata every run.
            d.text, d.metadata = text, {**meta, MESSAGES_KEY: messages}
        encoder = ChatEncoder(tok, 1 << 30, "truncate", args.batch_docs)
        writer = TokenizeWriter(tok, str(tmp / "out"), args.batch_docs, masks=True)
        table = offsets_module.piece_lengths
        if fallback:  # no piece table: SentencePiece's offset mapping for every text
            offsets_module.piece_lengths = lambda sp: None
        try:
            for _ in writer.run(encoder.run(iter(docs))):
                pass
        finally:
            offsets_module.piece_lengths = table
        n = (tmp / "out" / "00000.bin").stat().st_size // 2
        assert (tmp / "out" / "00000.mask").stat().st_size == n
        return n

    runs = {
        "plain-loop": plain_loop,
        "plain-batch": plain_batch,
        "lemur-chat": chat,
        "lemur-chat (offset_mapping)": lambda: chat(fallback=True),
    }
    best, n = best_of(runs, args.repeats)
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
