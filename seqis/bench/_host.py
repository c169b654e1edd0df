"""This host's single-core speed, printed in every benchmark's header: these machines' hosts differ 2-4x in it
between sessions and within one, and the explorer's server and browser follow it, so an absolute figure
(docs/speed.md, the README) is quoted with it and a figure read on another host can be set beside them. No torch
here."""

from __future__ import annotations

import time


def host_loop_s(n: int = 10_000_000) -> float:
    """Seconds a pure-Python loop of n integer adds takes."""
    t0 = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - t0


def host_line() -> str:
    """The header's note of it."""
    return f"host: a Python loop of 10M adds took {host_loop_s():.2f} s"
