"""Compact JAX Llama-2/3: model (llama), sharding table (sharding), HF import/export (hf),
orbax checkpoints (checkpoint). See docs/model.md."""
