"""The recipe's `fim:` section: fill-in-the-middle documents of code sources.

A code document is chosen with probability `rate`, cut at two points drawn uniformly over
its characters (`split: char`) or over its line starts (`split: line`), and written PSM,
or SPM with probability `spm_rate`, with the model's own marker tokens (`markers` names
them where the tokenizer's are not one of the known families'); every draw is seeded by
`seed` (default: the recipe's) and the document's id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lemur.data.recipe.errors import RecipeError
from lemur.tokenizer.fim import MARKER_ROLES as FIM_MARKER_ROLES

FIM_SPLITS = ("char", "line")


def _probability(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise RecipeError(f"recipe: {key} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class FimConfig:
    """Fill-in-the-middle for documents of `domains` (recipe `fim:`)."""

    rate: float = 0.5  # share of documents made FIM (StarCoder 0.5, CodeLlama 0.9)
    spm_rate: float = 0.5  # share of FIM documents in SPM order, the rest PSM
    split: str = "char"  # where the cut points may fall: any character, or line starts
    seed: int | None = None  # None: the recipe's seed
    domains: list[str] = field(default_factory=lambda: ["code"])
    markers: dict[str, str] | None = None  # role -> token text, for unknown families

    def __post_init__(self) -> None:
        _probability("fim.rate", self.rate)
        _probability("fim.spm_rate", self.spm_rate)
        if self.split not in FIM_SPLITS:
            raise RecipeError(
                f"recipe: fim.split {self.split!r} is not one of {', '.join(FIM_SPLITS)}"
            )
        if not self.domains:
            raise RecipeError("recipe: fim.domains must name at least one domain")
        for role, text in (self.markers or {}).items():
            if role not in FIM_MARKER_ROLES:
                raise RecipeError(
                    f"recipe: fim.markers.{role}: not one of {', '.join(FIM_MARKER_ROLES)}"
                )
            if not isinstance(text, str) or not text:
                raise RecipeError(f"recipe: fim.markers.{role} must be a token's text")
        missing = [r for r in FIM_MARKER_ROLES[:3] if self.markers and r not in self.markers]
        if missing:
            raise RecipeError(f"recipe: fim.markers needs {missing[0]!r} (prefix, middle, suffix)")

    def work_settings(self, recipe_seed: int) -> dict[str, object]:
        """What the FIM documents depend on (the FIM stage's work key), seed resolved."""
        seed = recipe_seed if self.seed is None else self.seed
        return {"rate": self.rate, "spm_rate": self.spm_rate, "split": self.split, "seed": seed}
