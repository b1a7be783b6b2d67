"""lemur.machine: the host's memory and the first device's, read in one place."""

from __future__ import annotations

import os

from lemur import machine


def test_host_memory_is_the_physical_memory() -> None:
    pages = os.sysconf("SC_PHYS_PAGES")
    assert machine.host_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * pages > 2**20


def test_a_device_without_an_allocator_limit_may_hold_the_host_memory(monkeypatch) -> None:
    """The CPU backend reports no `bytes_limit`: the KV-cache check uses the host's RAM
    (the same figure, and the same patch point, as the trainer's host-memory check)."""
    monkeypatch.setattr(machine, "host_memory_bytes", lambda: 12345)
    assert machine.device_memory_bytes() == 12345
