"""`memo`: a bounded LRU shared by every session for the lab's long runs, and the progress bar they report to.

The lab's Monte Carlo runs take seconds, and st.cache_data cannot drive a progress bar on a miss while
replaying nothing on a hit; they go through `memo`, a small LRU held in st.cache_resource, so a page passes
its ProgressSlot on a miss and gets the stored result at once on a hit. The quick per-section bridges use
st.cache_resource itself: a dict-lookup LRU here saved 1-8 ms of a rerun whose sections all hit (a slider move's
bridge work is 35-100 ms on a quiet machine, a second under load; docs/explorer.md), too little to keep a second cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import streamlit as st


class Store:
    """A bounded LRU shared by every session and thread; a second caller of a key being computed waits for that
    result instead of computing it again."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.values: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        self.running: dict = {}  # key -> Event of a computation in flight

    def get(self, key: Hashable, compute: Callable[[], object]):
        with self.lock:
            if key in self.values:
                self.values.move_to_end(key)
                return self.values[key]
            wait = self.running.get(key)
            if wait is None:
                self.running[key] = threading.Event()
        if wait is not None:
            wait.wait()
            with self.lock:
                if key in self.values:
                    return self.values[key]
            return self.get(key, compute)  # the other computation failed: try ourselves
        try:
            value = compute()
            with self.lock:
                self.values[key] = value
                while len(self.values) > self.max_entries:
                    self.values.popitem(last=False)
            return value
        finally:
            with self.lock:
                self.running.pop(key).set()

    def __contains__(self, key: Hashable) -> bool:
        with self.lock:
            return key in self.values

    def clear(self) -> None:
        with self.lock:
            self.values.clear()


@st.cache_resource
def _memo_store() -> Store:
    return Store(32)


def memo(key: Hashable, compute: Callable[[], object]):
    """compute() once per key (held in one LRU of 32 entries shared by every session and page; a second caller of
    a key being computed waits for that result instead of computing it again). Treat the result as read-only."""
    return _memo_store().get(key, compute)


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
    return key in _memo_store()
