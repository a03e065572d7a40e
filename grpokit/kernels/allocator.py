"""An opt-in change of the process's memory allocator, for programs that own their process."""

from __future__ import annotations

import ctypes
import sys


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
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**30))
