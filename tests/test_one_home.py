"""One home for each thing (issue #35): each value below is written in one module of lemur
and imported everywhere else; read from the source with `ast` (nothing is imported).

The copies that are still elsewhere are listed, each with why; the list can only shrink: a
new copy fails, and so does a listed one that went (delete its entry then).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A literal (a string, or a tuple of strings) and the one file that may write it.
LITERAL_HOMES: dict[object, str] = {
    ("truncate", "drop"): "lemur/data/recipe/recipe.py",  # chat.long's values (CHAT_LONG)
    "<|im_start|>": "lemur/chatml.py",  # the ChatML markers (IM_START, IM_END)
    "<|im_end|>": "lemur/chatml.py",
    ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"): "lemur/model/config.py",
    # the fields a pretrained checkpoint must match (PARAM_SHAPE_FIELDS)
    (
        "d_model",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "d_ff",
        "tie_embeddings",
        "qkv_bias",
    ): "lemur/model/config.py",
}
# Names of the build's work folders (a string, or the start of an f-string's text): only
# lemur/data/work.py spells them.
WORK_NAMES = ("shuffle-", "tokens-", "dedup-", "given-tokenizer-", "hf-tokenizer-", "byte-bpe-")
WORK_NAMES_EXACT = ("decontam", "demo-sources", "tokenizer-")
WORK_HOME = "lemur/data/work.py"
# Parsing and loading a SentencePiece model file: lemur/tokenizer/sentencepiece.py.
SENTENCEPIECE_CALLS = ("ParseFromString", "Load")
SENTENCEPIECE_HOME = "lemur/tokenizer/sentencepiece.py"
KNOWN_COPIES = {
    # chatml.py sits below the tokenizer package: it copies a loaded model without its dummy
    # prefix (bytes the model itself serialized, so parsing cannot fail).
    ("lemur/chatml.py", "ParseFromString"): "below the tokenizer package",
}


def literal(node: ast.expr) -> object:
    """The value of a string constant or a tuple of them, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def is_work_name(text: str, f_string_part: bool) -> bool:
    """Whether a string spells a work folder's name (an f-string's text may be its start)."""
    if text in WORK_NAMES_EXACT or text in (f"{n}*" for n in WORK_NAMES):
        return True
    return f_string_part and text in WORK_NAMES


def copies(rel: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of every value this file writes that has its home elsewhere."""
    found = []
    for node in ast.walk(tree):
        value = literal(node) if isinstance(node, ast.expr) else None
        if value in LITERAL_HOMES and LITERAL_HOMES[value] != rel:
            found.append((node.lineno, f"{value!r} (home: {LITERAL_HOMES[value]})"))
        if isinstance(node, ast.JoinedStr):
            parts = [p.value for p in node.values if isinstance(p, ast.Constant)]
            if rel != WORK_HOME and any(is_work_name(str(p), True) for p in parts):
                found.append((node.lineno, f"a work folder's name (home: {WORK_HOME})"))
        elif isinstance(value, str) and rel != WORK_HOME and is_work_name(value, False):
            found.append((node.lineno, f"a work folder's name (home: {WORK_HOME})"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SENTENCEPIECE_CALLS
            and rel != SENTENCEPIECE_HOME
            and (rel, node.func.attr) not in KNOWN_COPIES
        ):
            found.append((node.lineno, f".{node.func.attr}() (home: {SENTENCEPIECE_HOME})"))
    return found


def copy_problems(sources: dict[str, str]) -> list[str]:
    """Every copy outside its home, and every known copy that went."""
    problems = []
    for rel, source in sorted(sources.items()):
        tree = ast.parse(source)
        problems += [f"{rel}:{line}: {what}" for line, what in copies(rel, tree)]
    for rel, call in KNOWN_COPIES:
        if f".{call}(" not in sources.get(rel, ""):
            problems.append(f"KNOWN_COPIES: {rel} no longer calls .{call}(): delete the entry")
    return problems


def test_each_thing_has_one_home() -> None:
    """No module of lemur writes a value whose home is another module (but the known ones)."""
    files = sorted((ROOT / "lemur").rglob("*.py"))
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    problems = copy_problems(sources)
    assert not problems, "\n".join(problems)


def test_the_home_check_sees_planted_copies() -> None:
    """The checker itself: a copied list, a marker, a work folder's f-string name and a
    model parse outside their homes are found; a docstring that names them is not."""
    source = (
        '"""Writes <|im_start|> and shuffle-<key>."""\n'
        'LONG = ("truncate", "drop")\n'
        'START = "<|im_start|>"\n'
        "def f(root, key, proto, data):\n"
        "    proto.ParseFromString(data)\n"
        '    return root / f"shuffle-{key}", root.glob("tokens-*")\n'
    )
    problems = copy_problems({"lemur/data/x.py": source})
    assert [p.split(": ", 1)[0] for p in problems] == [
        "lemur/data/x.py:2",
        "lemur/data/x.py:3",
        "lemur/data/x.py:5",
        "lemur/data/x.py:6",
        "lemur/data/x.py:6",
        "KNOWN_COPIES",  # chatml.py's copy: not in the planted sources
    ]
