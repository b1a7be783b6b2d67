"""Evaluation (`lemur-eval`): bits per byte, generation with a KV cache, HumanEval in a sandbox,
HumanEval-infilling on the model's FIM prompt, multi-turn agent tasks with execution feedback,
an OpenAI-compatible server, sample files for other scorers.

| module | what it holds |
|---|---|
| `bpb` | `TokenBytes` (bytes per token id), `bits_per_byte`, `score_directory` over val shards |
| `generate` | `generate` / `generate_ids` (batched, left-padded prompts) |
| `decoding` | `GenerationConfig`, `Completion`, stop rules: what generate and the agent share |
| `chat_prompt` | `chat_prompt_ids`: a chat prompt as ids (ChatML, or the model's own template) |
| `sampling` | `Sampling`, `sample`: greedy, temperature, top-k, top-p |
| `humaneval` | `Task`, `humaneval_tasks`, `load_tasks`, `check`, `pass_at_k`, `summarize` |
| `long_prompts` | task prompts longer than the context: refused, skipped or truncated, counted |
| `infill_tasks` | `InfillTask`, `humaneval_infilling` (single/multi-line), `load_infill_tasks` |
| `infill` | `FimPrompter` (FIM prompt, end ids), `complete`, `check`, `summarize`, `plot` |
| `infill_cli` | the `infill` subcommand |
| `agent` | `run_agent`, `AgentConfig`, `ModelReplies`: multi-turn tasks with execution feedback |
| `agent_tasks` | `load_agent_tasks` (HumanEval, MBPP shapes), `extract_code`, `execute` |
| `agent_decode` | `TurnDecoder`: batched turns with each conversation's KV cache kept |
| `agent_report` | `summarize` (success rate by turn), `plot` |
| `agent_cli` | the `agent` and `plot` subcommands |
| `serve` | the `serve` subcommand: an OpenAI-compatible HTTP server |
| `serve_api` | what `serve` accepts and answers: OpenAI's request checks, response shapes |
| `serve_engine` | `Engine`: the worker that batches `serve`'s requests into one decode |
| `sample_files` | `--samples-out`: evalplus `samples.jsonl`, bigcode `generations.json` |
| `sandbox/` | `run_python`, `Limits`, `probe`; the jail, cgroups, processes, leftovers |
| `load` | `load_model`: a run dir, orbax step, lemur checkpoint or HF Llama folder |
| `find_tokenizer` | a run's tokenizer (its first data directory), or the one given |
| `cli` | the `lemur-eval` command |

The names below are importable from `lemur.eval` directly; each loads its module on first
use, so `lemur.eval.sandbox` does not pull in JAX. See docs/eval.md.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "TokenBytes": "bpb",
    "bits_per_byte": "bpb",
    "score_directory": "bpb",
    "Sampling": "sampling",
    "sample": "sampling",
    "GenerationConfig": "decoding",
    "generate": "generate",
    "generate_ids": "generate",
    "humaneval_tasks": "humaneval",
    "load_tasks": "humaneval",
    "pass_at_k": "humaneval",
    "run_python": "sandbox.run",
    "Limits": "sandbox.run",
    "load_model": "load",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
