"""Whole runs on a real Ray cluster, not a Ray started inside the test: two nodes on this machine's loopback, each
started by `ray start` from a folder of its own (tests/ray_cluster.py), scanned by drivers that connect to it.

- The example run by a path relative to the repository, as a user types it (`python -m seqis scan
  assets/runs/prime_rl_example --engine ray` with RAY_ADDRESS set): every row as the local engine's, both nodes
  reading steps, the progress bar drawn step by step with no line of Ray's between.
- A step one node cannot read (tests/cluster_hook: opening that one file fails on the joining node as a file
  without read permission does; the head's CPU is held, so every task runs there): a line in the summary naming
  the file and the node, the other steps' rows as the local engine's. A run that node cannot read at all, and
  workers that cannot import seqis: one message each, never Ray's traceback.

- No RAY_ADDRESS on a machine that is part of a cluster: the scan joins that cluster, as Ray does.

The cluster starts once for the module (~20 s on a loaded 2-core machine) and is stopped at the end, every one of
its processes ended (a test of the fixture's teardown).
"""

import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

pytest.importorskip("ray.data")
from ray_cluster import REPO, LoopbackCluster, scan_on, scan_on_node  # noqa: E402

from seqis.runs import read_scan, scan  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the cluster's teardown reads /proc")]

EXAMPLE = "assets/runs/prime_rl_example"  # relative to the repository, as a user would type it
ESTIMATORS = "seq_tis,mis_po"  # two corrections: the workers' work stays small
BLIND = "token_exports/step_3/rank_1.jsonl"  # the file of run "one" that the joining node cannot open


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two copies of the example run: "one" (a file of step 3 unreadable on the joining node) and "all"."""
    root = tmp_path_factory.mktemp("cluster_runs")
    for name in ("one", "all"):
        shutil.copytree(REPO / EXAMPLE, root / name)
    return root


@pytest.fixture(scope="module")
def cluster(runs):
    c = LoopbackCluster(unreadable=(str(runs / "one" / BLIND), str(runs / "all")), watch=str(REPO / EXAMPLE))
    try:
        yield c.start()
    finally:
        c.stop()
    assert c.processes() == []


def local_scan(path):
    return scan(path, ESTIMATORS.split(","), by="env_name", workers=1)


def test_a_relative_path_on_two_nodes_gives_the_local_engines_rows(cluster, tmp_path):
    out = tmp_path / "scan.parquet"
    done = scan_on(cluster, [EXAMPLE, "--out", str(out), "--estimators", ESTIMATORS], cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    on_ray, local = read_scan(out), local_scan(REPO / EXAMPLE)
    pd.testing.assert_frame_equal(on_ray, local, check_exact=True)
    assert on_ray.attrs["path"] == local.attrs["path"] == str(REPO / EXAMPLE)  # made absolute by the driver
    assert on_ray.attrs["summary"]["scanned"] == 8 and on_ray.attrs["summary"]["failed"] == []
    for node in ("head", "node"):  # both nodes read steps (each has one CPU, and two tasks start at once)
        assert any(re.search(r"/step_\d+/rank_\d+\.jsonl$", p) for p in cluster.read_on(node)), node
    # the terminal: which Ray, then the bar redrawn once per step; nothing of Ray's own in between
    parts = [p.strip() for p in re.split(r"[\r\n]", done.stderr) if p.strip()]
    assert parts[0] == f"engine ray: the cluster at {cluster.address} (RAY_ADDRESS)"
    assert [re.search(r"\] (\d+)/8 steps", p).group(1) for p in parts[1:]] == [str(k) for k in range(1, 9)]


@pytest.fixture(scope="module")
def on_the_blind_node(cluster, runs, tmp_path_factory):
    """One driver process (outside the repository): every task on the joining node, the run with one file it
    cannot open, then the run it cannot open at all; then, as a job whose workers (on either node) cannot import
    seqis, the first run again."""
    out = tmp_path_factory.mktemp("blind")
    scans = {name: [str(runs / run), "--out", str(out / f"{name}.parquet"), "--estimators", ESTIMATORS]
             for name, run in (("one", "one"), ("all", "all"), ("no_seqis", "one"))}
    done, node = scan_on_node(cluster, [({}, [scans["one"], scans["all"]], True),
                                        ({"env_vars": {"SEQIS_TEST_NO_SEQIS": "1"}}, [scans["no_seqis"]], False)],
                              cwd=out)
    assert done.returncode == 0 and node is not None, done.stderr[-3000:]
    exits = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("exit ")]
    return done, node, exits, out


def test_a_step_one_node_cannot_read_is_a_line_of_the_summary_and_the_scan_goes_on(on_the_blind_node, runs):
    done, node, exits, out = on_the_blind_node
    assert exits[0] == 1  # the CLI's status when a step could not be read
    df = read_scan(out / "one.parquet")
    [line] = df.attrs["summary"]["failed"]
    assert line.startswith("step 3: rank_1.jsonl: cannot be read (Permission denied): ")
    assert f"Ray node {node[:8]} (127.0.0.1) cannot open {runs / 'one' / BLIND}, which this machine reads" in line
    assert "storage every node mounts at the same path" in line
    assert f"NOT READ: {line}" in done.stdout
    local = local_scan(runs / "one")
    pd.testing.assert_frame_equal(df, local[local["step"] != 3].reset_index(drop=True), check_exact=True)
    assert "Traceback" not in done.stderr and "UserCodeException" not in done.stderr


def test_a_run_no_worker_can_read_is_one_message(on_the_blind_node, runs):
    done, node, exits, out = on_the_blind_node
    assert exits[1] == 2 and not (out / "all.parquet").exists()
    [message] = [line for line in done.stderr.splitlines() if line.startswith("python -m seqis scan: no Ray")]
    assert message.startswith("python -m seqis scan: no Ray worker could read any of the 8 steps to scan, which "
                              f"this machine reads (the first: step 0: rank_0.jsonl: cannot be read (Permission "
                              f"denied): Ray node {node[:8]} (127.0.0.1) cannot open {runs / 'all'}/")
    assert "storage every node mounts at the same path" in message and "runtime_env" in message
    assert done.stdout.count("NOT READ") == 1  # run "one"'s step 3: none for this run, one message instead


def test_workers_that_cannot_import_seqis_are_one_message(on_the_blind_node):
    done, _, exits, out = on_the_blind_node
    assert exits[2] == 2 and not (out / "no_seqis.parquet").exists()
    assert "python -m seqis scan: the Ray workers cannot import seqis: seqis must be importable on every node" \
        in done.stderr
    assert "runtime_env={'py_modules': [seqis]}" in done.stderr
    assert "Traceback" not in done.stderr and "RaySystemError" not in done.stderr


def test_without_ray_address_a_scan_joins_the_cluster_this_machine_is_part_of(cluster):
    # Ray's default: the cluster of the last `ray start` on this machine (its address file, under RAY_TMPDIR/ray
    # here), as in a KubeRay pod; seqis asks for a local Ray of its own only when there is none
    code = ("import ray\nfrom seqis.runs.engines import connect\nconnect(2)\n"
            "print(len([n for n in ray.nodes() if n['Alive']]), ray.cluster_resources()['CPU'])")
    env = cluster.env(RAY_TMPDIR=str(cluster.root), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cluster.root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["2", "2.0"]  # both nodes, one CPU each (a Ray of its own: 1 node, 2 CPUs)
