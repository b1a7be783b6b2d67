"""The model: compact JAX Llama-2/3, Qwen2 and Mistral as pure functions over params (no flax).

| module | what it holds |
|---|---|
| `config` | `LlamaConfig`, `PRESETS`, `config_from_preset`; param shapes, count, FLOPs per token |
| `llama` | `init_params`, `forward` and its parts (RMSNorm, rotary, attention, SwiGLU) |
| `decode` | `KVCache`, `prefill`, `decode_step`: KV-cache inference over left-padded batches |
| `scoring` | `token_logprobs`: per-token log-probabilities of sequences, in length buckets |
| `batch_decode` | `generate_tokens`: greedy or sampled batch generation over the KV cache |
| `harness_lm` | `harness_lm`: lm-evaluation-harness's `LM` over (config, params, tokenizer) |
| `sharding` | the mesh axes and the one partition table of params and activations |
| `hf` | HF names and layouts, safetensors reading and writing |
| `hf_config` | HF config.json <-> LlamaConfig for Llama, Qwen2 and Mistral |
| `checkpoint` | a lemur model checkpoint: `config.json` + orbax `params/` |
| `preset` | `ModelConfig`: a config's `model:` section (a preset with overrides), `ConfigError` |
| `pretrained` | a lemur checkpoint or an HF folder, read either way (`model.init_from`) |
| `grow` | `grow_vocab`: new embedding rows / head columns for appended pieces (ChatML) |
| `export_dir` | `replacing`: an export written beside DST, renamed into place when complete |

The names below are importable from `lemur.model` directly; each loads its module on first
use, so importing the package does not pull in JAX. See docs/model.md.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "LlamaConfig": "config",
    "Params": "config",
    "PRESETS": "config",
    "config_from_preset": "config",
    "param_shapes": "config",
    "param_count": "config",
    "flops_per_token": "config",
    "init_params": "llama",
    "forward": "llama",
    "KVCache": "decode",
    "init_cache": "decode",
    "prefill": "decode",
    "decode_step": "decode",
    "make_mesh": "sharding",
    "param_shardings": "sharding",
    "params_from_hf": "hf",
    "params_to_hf": "hf",
    "config_from_hf": "hf",
    "config_to_hf": "hf",
    "save_params": "checkpoint",
    "load_params": "checkpoint",
    "grow_vocab": "grow",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
