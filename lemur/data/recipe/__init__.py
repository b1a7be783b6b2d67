"""The build recipe: every stage's config as a typed dataclass, read from YAML.

recipe: `Recipe`, the whole (the output, mix, dedup and executor sections, the rules that span
sections, the fingerprint of what each stage depends on); one module per larger section:
sources, filters (code and text filters, decontamination, PII), classifier, tokenizer, fim,
repos, executor; errors: `RecipeError`, the one-line mistake the CLI prints. A recipe is read
from YAML by lemur.data.recipe_loader, which also checks what only the stages can tell.
"""
