"""A demo chat corpus made offline from real text: Python's help topics and stdlib docstrings.

`write_chat_demo(path)` writes a `messages` JSONL file (the `format: chat, schema: messages`
recipe layout) of a few thousand conversations: questions about Python's language
reference (`pydoc_data.topics`, one per section, e.g. "Explain the `with` statement in
Python.") answered by the section's text, and questions about standard-library functions,
classes and methods ("What does `json.dumps` do?") answered by their signature and
docstring. Some conversations have a system prompt, some ask about several names of one
module in turn. The output is the same on every run with the same Python (seeded choices).

    python -m lemur.data.chat_demo OUT.jsonl [--limit N] [--seed S]
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import inspect
import json
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_LIMIT = 3000
MIN_ANSWER = 40  # characters: shorter docstrings ("Return self+value.") teach little
MAX_ANSWER = 6000  # a help-topic section longer than this is left out, not cut mid-text
# Modules whose public functions, classes and methods are asked about; a name counts only
# where it is defined, so re-exports are not asked about twice.
MODULES = """
builtins os os.path argparse array ast asyncio base64 binascii bisect bz2 calendar cmath codecs
collections concurrent.futures configparser contextlib contextvars copy csv dataclasses datetime
decimal difflib dis doctest email.message email.utils enum filecmp fileinput fnmatch fractions
functools getopt glob graphlib gzip hashlib heapq html html.parser http.client http.cookies
http.server imaplib inspect io ipaddress itertools json linecache locale logging lzma mailbox
math mimetypes numbers operator pathlib pdb pickle pkgutil platform plistlib pprint queue quopri
random re sched secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 stat
statistics string struct subprocess sysconfig tarfile tempfile textwrap threading time timeit
tokenize traceback types typing unicodedata unittest urllib.parse urllib.request uuid warnings
weakref xml.dom.minidom xml.etree.ElementTree zipfile zlib zoneinfo
""".split()
# Other modules a module's names are defined in (its C accelerator, `_json`, and its
# submodules, `asyncio.tasks`, always count).
IMPLEMENTED_IN = {"os": ("posix",), "os.path": ("posixpath", "genericpath")}
BUILTIN_TYPES = (str, bytes, list, tuple, dict, set, frozenset, int, float, complex, range)
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a Python expert. Answer precisely.",
    "You answer questions about Python and its standard library.",
    "Answer from the official Python documentation.",
    "You are a patient programming tutor.",
)
TOPIC_QUESTIONS = (
    "Explain {} in Python.",
    "What should I know about {} in Python?",
    "Can you describe {} in Python?",
    "Tell me about {} in Python.",
)
NAME_QUESTIONS = (
    "What does `{}` do?",
    "How do I use `{}`?",
    "Explain `{}` from the Python standard library.",
    "What is `{}` for?",
)
FOLLOW_UPS = ("And `{}`?", "What about `{}`?", "Next, what does `{}` do?")
_UNDERLINE = re.compile(r"([*=\-~^])\1{2,}")

Pair = tuple[str, str, str]  # (group, subject, answer)


def _title(heading: str) -> str:
    """A help-topic heading as a phrase: `The "with" statement` -> the `with` statement."""
    phrase = re.sub(r'"([^"]+)"', r"`\1`", heading.strip())
    if len(phrase) > 1 and phrase[0].isupper() and phrase[1].islower():
        phrase = phrase[0].lower() + phrase[1:]
    return phrase


def topic_pairs() -> Iterator[Pair]:
    """(topic, phrase, text) for each section of each `pydoc_data.topics` help topic."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        lines = topics[name].splitlines()
        heads = [
            i
            for i in range(1, len(lines))
            if _UNDERLINE.fullmatch(lines[i]) and len(lines[i]) == len(lines[i - 1])
        ]
        for n, at in enumerate(heads):
            end = heads[n + 1] - 1 if n + 1 < len(heads) else len(lines)
            body = "\n".join(lines[at + 1 : end]).strip()
            if MIN_ANSWER <= len(body) <= MAX_ANSWER:
                yield name, _title(lines[at - 1]), body


def _described(qualname: str, obj: Any) -> str | None:
    """`signature` and docstring of an object, or None when it has too little to say."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc = inspect.getdoc(obj)
    if caught:  # deprecated names (`typing.io`) warn when touched: not worth teaching
        return None
    if not doc or len(doc) < MIN_ANSWER or len(doc) > MAX_ANSWER:
        return None
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):  # builtins without a text signature
        signature = "<none>"
    # A default shown as `<object object at 0x7f..>` (or a live list of handlers, as in
    # `logging.shutdown`) changes from process to process: leave such signatures out.
    return doc if "<" in signature else f"`{qualname}{signature}`\n\n{doc}"


def _members(display: str, module: Any, impl: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """(qualified name, object) of a module's public functions, classes and their methods."""
    homes = {h.lstrip("_") for h in (module.__name__, *impl)}
    prefix = "" if display == "builtins" else f"{display}."
    # `__all__`, not `vars()`: a package fills in lazy names (`concurrent.futures`) only once
    # used, and the demo must not depend on what the process imported before.
    for name in sorted(set(getattr(module, "__all__", None) or vars(module))):
        obj = getattr(module, name, None)
        if name.startswith("_") or not callable(obj):
            continue
        home = str(getattr(obj, "__module__", "")).lstrip("_")
        # C accelerators (`_json`) and private submodules (`asyncio.tasks`) count as home.
        if home not in homes and not home.startswith(f"{module.__name__}."):
            continue
        yield prefix + name, obj
        if inspect.isclass(obj):
            yield from _methods(prefix + name, obj)
    if display == "builtins":
        for cls in BUILTIN_TYPES:
            yield from _methods(cls.__name__, cls)


def _methods(owner: str, cls: type) -> Iterator[tuple[str, Any]]:
    for name, attr in sorted(vars(cls).items()):
        if not name.startswith("_") and callable(attr):
            yield f"{owner}.{name}", attr


def docstring_pairs() -> Iterator[Pair]:
    """(module, name, signature and docstring) for the public names of `MODULES`."""
    seen: set[str] = set()
    for display in MODULES:
        impl = IMPLEMENTED_IN.get(display, ())
        module = builtins if display == "builtins" else importlib.import_module(display)
        for qualname, obj in _members(display, module, impl):
            answer = _described(qualname, obj)
            if answer is not None and qualname not in seen:
                seen.add(qualname)
                yield display, qualname, answer


def _question(kind: str, subject: str, rng: random.Random, follow_up: bool) -> str:
    if kind == "topic":
        return rng.choice(TOPIC_QUESTIONS).format(subject)
    return rng.choice(FOLLOW_UPS if follow_up else NAME_QUESTIONS).format(subject)


def conversations(seed: int = 0, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
    """The demo's `messages` rows: `limit` conversations at most, chosen and phrased by `seed`."""
    rng = random.Random(seed)
    pairs = [("topic", *p) for p in topic_pairs()] + [("name", *p) for p in docstring_pairs()]
    rows: list[dict[str, Any]] = []
    i = 0
    while i < len(pairs):
        # About one conversation in eight asks about two or three subjects of one group.
        turns = 1 if rng.random() >= 0.125 else rng.choice((2, 3))
        group = [p for p in pairs[i : i + turns] if p[1] == pairs[i][1]]
        i += len(group)
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for n, (kind, _, subject, answer) in enumerate(group):
            question = _question(kind, subject, rng, follow_up=n > 0)
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
        rows.append({"messages": messages})
    rng.shuffle(rows)
    return [{"id": f"chat-demo-{n:05d}", **row} for n, row in enumerate(rows[:limit])]


def write_chat_demo(path: str | Path, seed: int = 0, limit: int = DEFAULT_LIMIT) -> int:
    """Write the demo conversations to `path` as `messages` JSONL; return how many.

    The corpus is made in a fresh interpreter: a library the caller has imported may have
    patched the standard library (transformers adds `warning_once` to `logging.Logger`,
    others wrap `inspect` functions), which would change the docstring pairs and so the
    file. In a clean child the same Python gives the same bytes from any caller.
    """
    argv = [sys.executable, "-m", __name__, str(path), "--seed", str(seed), "--limit", str(limit)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise OSError(lines[-1].removeprefix(f"chat_demo: error: {path}: "))
    return int(done.stdout.split()[1])


def _write(path: str | Path, seed: int, limit: int) -> int:
    """Make the conversations in this process and write them to `path`."""
    rows = conversations(seed, limit)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    Path(path).write_text(text, encoding="utf-8")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    """`python -m lemur.data.chat_demo OUT.jsonl`: write the demo chat corpus."""
    parser = argparse.ArgumentParser(prog="python -m lemur.data.chat_demo", description=__doc__)
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="most conversations")
    parser.add_argument("--seed", type=int, default=0, help="seeds the choices and phrasing")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be >= 1")
    try:
        n = _write(args.out, args.seed, args.limit)
    except OSError as e:
        print(f"chat_demo: error: {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {n} conversations to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
