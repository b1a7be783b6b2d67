"""What this machine holds: the host's memory, and what the first device may allocate.

The one place both the trainer (a step refused before it starts, not killed by the kernel
at its first step) and `lemur-eval generate` (a KV cache refused before it is allocated)
read them.
"""

from __future__ import annotations

import os


def host_memory_bytes() -> int:
    """This host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory_bytes() -> int:
    """What the first device may hold: its allocator's limit (GPU, TPU), else the host's RAM."""
    import jax  # only when asked: importing lemur's basics must stay light

    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return host_memory_bytes()
