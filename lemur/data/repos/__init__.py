"""Repository documents (recipe `repos:`): a repository's files, deduplicated and
decontaminated one by one, joined into one code document in the model's repository format.
Which checkout a file of a `files` source belongs to is read with it (read/checkouts.py).

- imports.py: the import graph of a repository's files (Python, C/C++, JavaScript/TypeScript)
  and DeepSeek-Coder's topological order over it;
- order.py: the recipe's file orders (`path`, `random`, `imports`);
- render.py: the repository format and the split at file boundaries to a token budget;
- spill.py, group.py: the build's stages (files set aside per repository bucket during the
  read, then one group task per bucket after dedup), see docs/recipe.md#repos.
"""
