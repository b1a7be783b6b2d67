"""Accuracy of lemur's language taggers on real, labelled files found on this machine.

Code: go-enry `get_language(name, content)` (with our fallbacks), and content alone
(`content_language`: shebang or modeline, else Magika; what a JSONL row without
`path_key` gets), on the same stdlib .py, C++ standard headers, npm .js, Perl modules and
/usr/bin shell scripts, each timed in this process (the speed ratio is the figure to
quote; absolute rates depend on the machine's load). Text: fastText lid.176.ftz on
paragraphs (>= 150 characters) of localized man pages under /usr/share/man/<lang>.

    python tools/bench_tagging.py --per-language 300 --pages 4
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from lemur.data.filter.tagging import TextLanguageID, code_language, content_language

# The labelled samples are test fixtures (tests/labelled.py), shared with this benchmark.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from labelled import labelled_code, labelled_paragraphs  # noqa: E402


def main() -> int:
    """Print per-language accuracy tables (markdown) for code and text tagging."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--per-language", type=int, default=300, help="code files per language")
    ap.add_argument("--pages", type=int, default=4, help="man pages per locale")
    args = ap.parse_args()

    samples = list(labelled_code(args.per_language))
    content_language("warm-up: load Magika's model\n" * 20)
    rates = {}
    for how, tagger in (
        ("name and content (enry)", code_language),
        ("content alone (shebang, modeline, Magika)", lambda _name, text: content_language(text)),
    ):
        rates[how] = code_table(how, samples, tagger)
    by_name, by_content = rates.values()
    print(f"\ncontent alone tags {by_name / by_content:.1f}x slower than by name (same run)\n")

    lid = TextLanguageID()
    per: dict[str, Counter] = defaultdict(Counter)
    wrong: Counter = Counter()
    t0 = time.perf_counter()
    for label, para in labelled_paragraphs(args.pages):
        guess, _ = lid(para)
        per[label]["n"] += 1
        per[label]["ok"] += guess == label
        if guess != label:
            wrong[(label, guess)] += 1
    secs = time.perf_counter() - t0
    n = sum(c["n"] for c in per.values())
    ok = sum(c["ok"] for c in per.values())
    print(
        f"\n## Text: {ok}/{n} = {ok / n:.2%} of paragraphs correct ({len(per)} languages, "
        f"{secs:.0f}s incl. rendering)\n"
    )
    print("| language | paragraphs | correct |\n|---|---|---|")
    for label, c in sorted(per.items()):
        print(f"| {label} | {c['n']} | {c['ok'] / c['n']:.2%} |")
    print(
        "\nmost common confusions:",
        ", ".join(f"{a}->{b} x{k}" for (a, b), k in wrong.most_common(8)),
    )
    return 0


def code_table(how: str, samples: list, tagger) -> float:
    """Print the per-language accuracy of `tagger(name, text)`; return its files/s."""
    totals: dict[str, Counter] = defaultdict(Counter)
    confusions: Counter = Counter()
    t0 = time.perf_counter()
    for label, name, text in samples:
        guess = tagger(name, text)
        totals[label]["n"] += 1
        totals[label]["ok"] += guess == label
        if guess != label:
            confusions[(label, guess)] += 1
    rate = len(samples) / (time.perf_counter() - t0)
    n = sum(c["n"] for c in totals.values())
    ok = sum(c["ok"] for c in totals.values())
    print(f"## Code by {how}: {ok}/{n} = {ok / n:.2%} correct ({rate:,.0f} files/s)\n")
    print("| language | files | correct |\n|---|---|---|")
    for label, c in sorted(totals.items()):
        print(f"| {label} | {c['n']} | {c['ok'] / c['n']:.2%} |")
    print(
        "\nmost common confusions:",
        ", ".join(f"{a}->{b} x{k}" for (a, b), k in confusions.most_common(6)),
    )
    return rate


if __name__ == "__main__":
    sys.exit(main())
