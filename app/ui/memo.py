"""A bounded LRU for long runs that report progress, and the progress bar they report to.

The lab's Monte Carlo runs take seconds, and st.cache_data cannot drive a progress bar on a miss while
replaying nothing on a hit; they go through `memo`, a small LRU held in st.cache_resource, so a page passes
its ProgressSlot on a miss and gets the stored result at once on a hit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import streamlit as st


@st.cache_resource
def _memo_store() -> tuple[OrderedDict, threading.Lock, dict]:
    return OrderedDict(), threading.Lock(), {}  # results, their lock, key -> Event of a computation in flight


def memo(key: Hashable, compute: Callable[[], object], *, max_entries: int = 32):
    """compute() once per key (held in an LRU of max_entries shared by every session; a second caller of a key
    being computed waits for that result instead of computing it again). Treat the result as read-only."""
    store, lock, running = _memo_store()
    with lock:
        if key in store:
            store.move_to_end(key)
            return store[key]
        wait = running.get(key)
        if wait is None:
            running[key] = threading.Event()
    if wait is not None:
        wait.wait()
        with lock:
            if key in store:
                return store[key]
        return memo(key, compute, max_entries=max_entries)  # the other computation failed: try ourselves
    try:
        value = compute()
        with lock:
            store[key] = value
            store.move_to_end(key)
            while len(store) > max_entries:
                store.popitem(last=False)
        return value
    finally:
        with lock:
            running.pop(key).set()


class ProgressSlot:
    """A progress callback for the lab (fraction, message) that draws an st.progress bar in a placeholder
    on its first call, so a cached result shows no bar; `with` clears it when the run ends."""

    def __init__(self, label: str):
        self.label = label
        self.slot = st.empty()

    def __call__(self, fraction: float, message: str) -> None:
        self.slot.progress(min(max(float(fraction), 0.0), 1.0), text=f"{self.label}: {message}")

    def __enter__(self) -> ProgressSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.slot.empty()


def memo_has(key: Hashable) -> bool:
    """Whether `memo` holds a result for key (a page can then skip its progress bar or its Run button)."""
    store, lock, _ = _memo_store()
    with lock:
        return key in store
