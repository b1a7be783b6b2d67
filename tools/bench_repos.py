"""Benchmark: `lemur-data build` with repository documents (`repos:`) against without, one run.

The Python standard library's sources (tests, idlelib and lib2to3 left out) are read as a
`files` tree: each top-level package is a repository, the loose modules are the repository
named after the stdlib folder. Both builds use the same SentencePiece model (mistral-common's
`tokenizer.model.v1`, or `--tokenizer`), code filters off, one after the other into fresh
outputs; CPU seconds are the build's process tree's (bench_build.timed).

    python tools/bench_repos.py [--order imports] [--workers 2]
    python tools/bench_repos.py --same-named 500,1000,2000,10000

`--same-named N,...` times only the import graph of a repository of N folders each holding a
`config.h` and a `.c` including it (the case that was quadratic, #44 item 23).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import bench_build  # noqa: E402  (a sibling tool, as bench_build imports bench_ingest)

WORK = Path("/tmp/lemur-bench-repos")


def _tokenizer() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"


def _recipe(out: Path, model: Path, workers: int, repos: dict | None) -> dict:
    stdlib = sysconfig.get_paths()["stdlib"]
    recipe = {
        "output": str(out),
        "seed": 1,
        "tokenizer": {"model": str(model)},
        "mix": {"ratio": {"code": 1}},
        "executor": {"kind": "local", "tasks": workers, "workers": workers},
        "val_fraction": 0,
        "filters": {"code": {"enabled": False}},
        "sources": [
            {
                "name": "stdlib",
                "domain": "code",
                "format": "files",
                "paths": [stdlib],
                "include": ["*.py"],
                "exclude": ["test/*", "idlelib/*", "lib2to3/*", "site-packages/*"],
            }
        ],
    }
    return {**recipe, **({"repos": repos} if repos is not None else {})}


def _build(name: str, recipe: dict) -> dict:
    out = Path(recipe["output"])
    subprocess.run(["rm", "-rf", str(out)], check=True)
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r = bench_build.timed([sys.executable, "-m", "lemur.data.cli", "build", str(path)])
    manifest = json.loads((out / "manifest.json").read_text())
    r.update(name=name, tokens=sum(s["tokens"] for s in manifest["shards"]))
    r["repositories"] = manifest["counts"].get("repositories")
    print(r, file=sys.stderr, flush=True)
    return r


def same_named(sizes: list[int]) -> int:
    """Time `dependencies` on repositories of N same-named headers; print a markdown table."""
    import time

    from lemur.data.repos.imports import dependencies

    print("| folders | files | includes | seconds |\n|---|---|---|---|")
    for n in sizes:
        files = {"config.h": "int top;\n", "common/config.h": "int common;\n"}
        for i in range(n):
            files[f"m{i}/config.h"] = '#include "common/config.h"\n#include <config.h>\n'
            files[f"m{i}/a.c"] = '#include "config.h"\n#include <m0/config.h>\n'
        started = time.perf_counter()
        dependencies(files)
        print(f"| {n:,} | {len(files):,} | {4 * n:,} | {time.perf_counter() - started:.3f} |")
    return 0


def main() -> int:
    """Run both builds and print a markdown table and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--order", default="imports", choices=["path", "random", "imports"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", type=Path, default=None, metavar="MODEL")
    ap.add_argument("--same-named", default=None, metavar="N,...")
    args = ap.parse_args()
    if args.same_named:
        return same_named([int(n) for n in args.same_named.split(",")])
    WORK.mkdir(parents=True, exist_ok=True)
    model = args.tokenizer or _tokenizer()
    off = _build("files", _recipe(WORK / "files-out", model, args.workers, None))
    on = _build(
        f"repos-{args.order}",
        _recipe(WORK / "repos-out", model, args.workers, {"order": args.order}),
    )
    print("| build | wall s | CPU s | tokens | peak RSS MiB |\n|---|---|---|---|---|")
    for r in (off, on):
        print(
            f"| {r['name']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['tokens']:,} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    c = on["repositories"]
    print(
        f"\nrepos / files, CPU s: {on['cpu_s'] / off['cpu_s']:.2f}x, wall: "
        f"{on['wall_s'] / off['wall_s']:.2f}x; {c['repositories']} repositories, "
        f"{c['files']['grouped']} files in {c['documents']} documents"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
