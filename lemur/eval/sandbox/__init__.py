"""The sandbox: untrusted Python (generated code and its tests) run in a contained child
process, and everything that containment takes (namespaces, cgroups, uids, cleanup).

Only the evaluator's checks (humaneval, infill, the agent's turns) run code here; what they
use is `run_python`, `run_pool`, `Limits` and `probe`, importable from this package.

| module | its job |
|---|---|
| `run` | the evaluator's side: `run_python`, `run_pool`, `Limits`, `probe` (what can be had) |
| `jail` | the script a run starts instead of the program (by path, stdlib only) |
| `jail_run` | the jail's work (stdlib only): namespaces, the run's root, limits, exec |
| `cgroups` | a run's pids and memory cgroups (v1 or v2): made, capped, removed |
| `procs` | finding and killing a run's processes (by uid or cgroup); free uids |
| `leftovers` | what a killed evaluator's runs left, removed at the next start |

The names below load their module on first use, so importing the package costs nothing.
docs/eval.md (the sandbox) says what each mechanism keeps out.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "Isolation": "run",
    "JAIL_ENV": "run",
    "Limits": "run",
    "REPORT_FD": "run",
    "Result": "run",
    "SANDBOX_CWD": "run",
    "SandboxUnavailable": "run",
    "Stopped": "run",
    "interpreter_paths": "run",
    "open_to_others": "run",
    "probe": "run",
    "run_pool": "run",
    "run_python": "run",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
