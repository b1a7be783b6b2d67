"""Whether a tokenizer gives back the text it encodes: the check a pre-training tokenizer
must pass (a WordPiece or whitespace-split tokenizer drops indentation, case, newlines).

The probe is a few short strings of code and text that every byte-level BPE (Llama-3,
tekken, Qwen2.5), every byte-fallback SentencePiece model (Llama-2, Mistral v1-v7) and
their `tokenizer.json` conversions give back exactly. It leaves out what such tokenizers
lose by design and a corpus can live with: whitespace at the very start of a text (a
`Metaspace` pre-tokenizer with a dummy prefix drops one leading space), text that is not
NFC (Qwen2.5 normalizes to NFC), SentencePiece's own space marker U+2581, lone surrogates.
Encoding it costs milliseconds (docs/recipe.md#tokenizer).
"""

from __future__ import annotations

from lemur.tokenizer.base import Tokenizer

PROBE: tuple[str, ...] = (
    # Python: 4-space indentation, a blank line, a docstring, a comment, quotes.
    'def parse(path, *, strict=False):\n    """Read `path`."""\n    if not strict:\n'
    "        return None  # nothing to do\n\n    return {'key': [1, 2], \"x\": path}\n",
    # C with tabs.
    'int main(void) {\n\tfor (int i = 0; i < 10; i++) {\n\t\tprintf("%d\\n", i);\n\t}\n}\n',
    "Windows line\r\nends here\r\n\r\nand here\r\n",
    "indented:\n  two  spaces, three   spaces, trailing spaces  \n\n\n",
    "CamelCase HTTPServer getURL XMLHttpRequest UPPER lower MiXeD",
    "naïve café, Straße, Ünïcödé, “quoted” — ½ °C",
    "中文字符 日本語のテキスト 한국어 텍스트",
    "emoji: 🚀 👍🏽 🇫🇷 ❤️ 👩‍💻",
    "digits 0123456789 3.14159 1e-9 0xFF 1,000,000",
    # A long line: 1,895 characters.
    "x = [" + ", ".join(str(i) for i in range(400)) + "]\n",
)
# Characters of a lossy string shown on each side of where it first differs.
_SHOWN = 24


def _around(text: str, start: int) -> str:
    """`text` from `start` on, cut to `_SHOWN * 2` characters, marked where it was cut."""
    part = text[start : start + 2 * _SHOWN]
    return ("..." if start else "") + part + ("..." if start + 2 * _SHOWN < len(text) else "")


def round_trip_problem(tok: Tokenizer) -> str | None:
    """What `tok` loses of the probe: the first string whose `decode(encode(x)) != x` and
    what it decodes to, both cut around the first difference (one line); None if none."""
    lossy = [(x, y) for x in PROBE if (y := tok.decode(tok.encode(x))) != x]
    if not lossy:
        return None
    x, y = lossy[0]
    same = min(len(x), len(y))
    first = next((i for i in range(same) if x[i] != y[i]), same)
    start = max(0, first - _SHOWN)
    return (
        f"{_around(x, start)!r} decodes to {_around(y, start)!r} "
        f"({len(lossy)} of {len(PROBE)} probe texts do not come back)"
    )
