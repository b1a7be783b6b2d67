"""lemur: build a code-and-text corpus (`lemur.data`, `lemur.shards`), train a JAX Llama on it
(`lemur.model`, `lemur.train`) and evaluate it (`lemur.eval`). See README.md, Layout."""
