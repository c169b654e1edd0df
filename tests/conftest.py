"""Shared test setup: GPU tests skip without CUDA, and say so; the app does not warm its caches in the
background (SEQIS_WARM=0: the tests open pages, and the warm-up would compete with them for the cores)."""

import os

import pytest
import torch

os.environ.setdefault("SEQIS_WARM", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
