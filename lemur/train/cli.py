"""`lemur-train`: train a compact JAX Llama directly off lemur shards."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lemur-train` (the trainer arrives with its own issue)."""
    print(
        "lemur-train: the trainer is not part of this release yet; "
        "build corpora with `lemur-data build` meanwhile.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
