"""Opt-in changes of the process's memory allocator, for programs that own their process, and what is in effect.

Two settings, both measured at Qwen2.5-0.5B's shape in docs/performance.md ("Memory reuse"):

- glibc keeps what is freed (:func:`keep_freed_memory`), so a step reuses the previous step's memory instead of
  faulting it in again page by page;
- PyTorch backs tensors of 2 MB or more with transparent huge pages (its ``THP_MEM_ALLOC_ENABLE=1``, which it reads
  once, at its first allocation: it has to be in the environment before torch is imported, as ``grpokit``'s CLI
  puts it). :func:`huge_pages_in_use` says whether this process got it.
"""

from __future__ import annotations

import ctypes
import os
import sys

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
_HUGE_PAGES_FROM = 2**21  # PyTorch asks for huge pages for tensors of this many bytes or more


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of handing it back to the OS; True if applied.

    By default glibc serves big blocks with fresh mmaps and trims the heap top when enough is free,
    so every training step faults its large temporaries in again, page by page. With mmap off and no
    trimming, a step reuses the previous step's memory and the process keeps its high-water mark
    (docs/performance.md has the measurements).

    This changes the whole process's allocator, so grpokit never calls it on a library user's behalf:
    ``grpokit train``, ``eval`` and ``demo`` call it (on CPU), and a Python program that owns its process
    may call it once, before training. Linux with glibc only; a no-op elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # mallopt parameter numbers from malloc.h
    never = -1  # the threshold is a size_t: -1 is the largest, so the heap is never trimmed
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, never))


def huge_pages_in_use() -> bool:
    """Whether PyTorch in this process asks for transparent huge pages for its large CPU tensors (``HUGE_PAGES_ENV``
    was set when torch started). It then starts every CPU tensor on a page boundary, instead of 64 bytes' alignment,
    which a few fresh tensors show. Whether the kernel grants the pages is the system's setting
    (:func:`system_huge_pages`)."""
    import torch

    page = os.sysconf("SC_PAGE_SIZE")
    tensors = [torch.empty(_HUGE_PAGES_FROM, dtype=torch.uint8) for _ in range(4)]
    return all(t.data_ptr() % page == 0 for t in tensors)


def system_huge_pages() -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``), or None where unknown."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None
