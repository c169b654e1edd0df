"""ui.runtime.memo's Store, the LRU behind `memo` (the lab's long runs): a key is computed once, the LRU keeps
max_entries and lets the least recently used go first, two threads asking for the same key compute it once, and a
failed computation leaves the key for the next caller."""

import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui.runtime.memo import Store  # noqa: E402


def counted(max_entries: int):
    calls = []
    store = Store(max_entries)

    def f(a, b=1):
        return store.get((a, b), lambda: calls.append((a, b)) or (a, b))

    return f, calls


def test_a_key_is_computed_once():
    f, calls = counted(4)
    assert f(1) == f(1, 1) == f(1) == (1, 1)
    assert calls == [(1, 1)]
    f(1, 2)
    assert len(calls) == 2


def test_the_least_recently_used_key_goes_first():
    f, calls = counted(2)
    f(1), f(2), f(1), f(3)  # 2 is the least recently used when 3 arrives
    f(1)
    assert len(calls) == 3
    f(2)
    assert len(calls) == 4


def test_two_threads_asking_for_one_key_compute_it_once():
    calls = []
    store = Store(4)

    def slow():
        calls.append(7)
        time.sleep(0.2)
        return 7

    out = []
    threads = [threading.Thread(target=lambda: out.append(store.get("k", slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [7, 7, 7] and calls == [7]


def test_a_failed_computation_leaves_the_key_for_the_next_caller():
    store = Store(4)

    def boom():
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        store.get("k", boom)
    assert "k" not in store and store.get("k", lambda: 3) == 3
