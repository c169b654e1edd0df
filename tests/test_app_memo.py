"""ui.memo.cached: the section caches Explore uses instead of st.cache_resource. A key is the call's arguments
however they are passed, without those named with a leading underscore; the LRU keeps max_entries; two threads
asking for the same key compute it once."""

import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui.memo import cached  # noqa: E402


def counted(max_entries: int):
    calls = []

    @cached(max_entries)
    def f(a, b=1, _payload=None):
        calls.append((a, b, _payload))
        return (a, b)

    return f, calls


def test_a_key_is_the_arguments_however_passed_without_underscored_ones():
    f, calls = counted(4)
    assert f(1) == f(1, 1) == f(a=1, b=1) == f(1, _payload=b"x") == (1, 1)
    assert calls == [(1, 1, None)]
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

    @cached(4)
    def slow(a):
        calls.append(a)
        time.sleep(0.2)
        return a

    out = []
    threads = [threading.Thread(target=lambda: out.append(slow(7))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [7, 7, 7] and calls == [7]
