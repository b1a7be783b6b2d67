"""Fill-in-the-middle at the stage level: which documents are cut, where, and the FIM stage.

- cut.py: one document's FIM draw and cut (`fim_split`, `fim_chosen`), and its text or ids
  in the model's layout (`fim_transform`); repository documents cut each file with it;
- rewrite.py: the FIM stage (`FimRewrite` tasks over a token run, `FimJob`, `fim_counts`).

The tokenizer-level part (the markers of known code models, the PSM/SPM layouts, splicing
ids at a cut) is lemur/tokenizer/fim.py and fim_splice.py; the recipe's `fim:` section is
lemur/data/recipe/fim.py.
"""
