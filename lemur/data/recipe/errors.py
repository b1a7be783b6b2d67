"""The error every recipe check raises."""


class RecipeError(ValueError):
    """A recipe that cannot be built; the message names the offending key."""
