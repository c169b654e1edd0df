"""Shared test setup: GPU tests skip without CUDA, and say so; the app does not warm its caches in the
background (SEQIS_WARM=0: the tests open pages, and the warm-up would compete with them for the cores); under
`make test` (SEQIS_HYPOTHESIS=full) hypothesis draws the same examples on every run (derandomized: a clean
clone's run repeats the one that passed here; plain `pytest` keeps exploring with fresh seeds); lines a test
leaves with the `summary` fixture (how many inputs a fuzz tried) are printed at the end of the run."""

import os

import pytest
import torch
from hypothesis import settings

os.environ.setdefault("SEQIS_WARM", "0")
settings.register_profile("full", derandomize=True, print_blob=True)


def pytest_configure(config):
    if os.environ.get("SEQIS_HYPOTHESIS") == "full" and config.getoption("hypothesis_seed", None) is None:
        settings.load_profile("full")  # --hypothesis-seed=N explores at full size instead
    config.seqis_summary = []


def pytest_terminal_summary(terminalreporter, config):
    for line in getattr(config, "seqis_summary", []):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def summary(request) -> list[str]:
    """Append a line to print at the end of the run, whatever the capture (make test runs pytest -q)."""
    return request.config.seqis_summary


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray inside this process (two CPUs), shared by the tests that scan with engine="ray" (~10 s to
    start); a cluster of its own: address="local" ignores a RAY_ADDRESS the caller has set."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory) -> str:
    """One inductor cache for the run's compiles (tests/test_compiled.py), kept beside pytest's temporary folders so
    that the next run finds its graphs too (a cold compile is 15-25 s a graph on a 2-core host); a cache the caller
    set (TORCHINDUCTOR_CACHE_DIR) is used instead. One folder per CPU capability: inductor's cache is not keyed by
    it, and a run with ATEN_CPU_CAPABILITY=avx2 would otherwise read the graphs compiled for AVX-512."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        capability = torch.backends.cpu.get_cpu_capability().lower()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.getbasetemp().parent
                                                    / f"inductor-cache-{capability}")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
