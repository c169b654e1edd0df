"""A real two-node Ray cluster on this machine's loopback, for tests/test_runs_cluster.py: started with Ray's own
`ray start` (a head, then a node joining it), each from a folder of its own, and stopped by the test that
started it, every process of it ended.

- Token auth, as Ray 2.60 asks of a node that joins: RAY_AUTH_MODE=token and a token from
  `ray get-auth-token --generate`, under a HOME of the cluster's own (the token file is ~/.ray/auth_token).
- Loopback only: Ray's servers listen on 127.0.0.1 when that is the node's address, but `ray start` swaps a
  loopback --node-ip-address or --address for the machine's outward address (ray._private.services.
  resolve_ip_for_localhost) and its servers then listen on every interface. So each `ray start` runs as Ray's
  CLI with that one function keeping 127.0.0.1 as it is (`_CLI`), and a driver gets
  RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, Ray's switch for a loopback address, which only `ray start` of a joining
  node refuses. On a real cluster none of this applies: the nodes have addresses of their own.
- Stopping: `ray stop` ends every Ray process of the machine, other people's too, so it is not used. Each
  `ray start` runs as the leader of a new session, which every process it starts (GCS, raylet, agents,
  workers) stays in; `stop()` ends the processes of those sessions, by id, and waits until none is left.
- Each node's environment puts tests/cluster_hook on PYTHONPATH: its sitecustomize logs which files the
  node's processes open (which node read which step) and can make files unreadable on one node only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOOK = Path(__file__).resolve().parent / "cluster_hook"
_CLI = ("import sys, ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "
        "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sessions() -> dict[int, tuple[int, str]]:
    """pid -> (session id, state) of every process on the machine (from /proc: no name matching)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
            found[int(entry)] = (int(fields[3]), fields[0])
    return found


class LoopbackCluster:
    """`ray start --head` and `ray start --address` on 127.0.0.1, one CPU each, in a temporary folder.
    unreadable: paths the joining node cannot open (tests/cluster_hook)."""

    def __init__(self, unreadable: tuple[str, ...] = (), watch: str = "/"):
        # a short root: Ray's socket paths live under it and a unix socket path has ~107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="seqis-ray-", dir="/tmp"))
        self.home, self.temp = self.root / "home", self.root / "ray"
        self.home.mkdir()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.opened = {"head": self.root / "head.opened", "node": self.root / "node.opened"}
        self.unreadable, self.watch = unreadable, watch
        self._leaders: list[int] = []  # the `ray start` processes: each one's pid is its session's id

    def env(self, **extra: str) -> dict[str, str]:
        """The environment every process of this cluster gets (a driver's too)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HOME=str(self.home), RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0", **extra)
        return env

    def _node_env(self, name: str, **extra: str) -> dict[str, str]:
        path = os.pathsep.join([str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])])
        return self.env(PYTHONPATH=path, SEQIS_TEST_OPENED=str(self.opened[name]), SEQIS_TEST_WATCH=self.watch,
                        **extra)

    def _ray_start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        cwd = self.root / name  # a folder of its own, not the repository
        cwd.mkdir()
        with open(self.root / f"{name}.log", "wb") as log:
            p = subprocess.Popen([sys.executable, "-c", _CLI, "start", *args], cwd=cwd, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self._leaders.append(p.pid)
        return p

    def _wait(self, name: str, p: subprocess.Popen) -> None:
        if p.wait(timeout=120) != 0:
            raise RuntimeError(f"ray start ({name}) failed: {(self.root / f'{name}.log').read_text()[-3000:]}")

    def start(self) -> LoopbackCluster:
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"], env=self.env(),
                       cwd=self.root, check=True, capture_output=True, timeout=60)
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", f"--temp-dir={self.temp}", "--disable-usage-stats"]
        head = self._ray_start("head", ["--head", f"--port={self.port}", "--include-dashboard=false", *common],
                               self._node_env("head"))
        deadline = time.monotonic() + 120
        while head.poll() is None and time.monotonic() < deadline:  # the node may join once the GCS listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.2)
        node = self._ray_start("node", [f"--address={self.address}", *common],
                               self._node_env("node", SEQIS_TEST_UNREADABLE=os.pathsep.join(self.unreadable)))
        self._wait("head", head)
        self._wait("node", node)
        return self

    def driver_env(self, **extra: str) -> dict[str, str]:
        """A driver's environment: the cluster's address, its token, loopback kept."""
        return self.env(RAY_ADDRESS=self.address, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **extra)

    def processes(self) -> list[int]:
        """This cluster's live processes (zombies, already ended, left out)."""
        return [pid for pid, (sid, state) in _sessions().items() if sid in self._leaders and state != "Z"]

    def stop(self, grace: float = 2.0) -> None:
        """End every process of the cluster's sessions (SIGTERM, then SIGKILL after `grace` s), wait for them, and
        remove the cluster's folder."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.processes():
                shutil.rmtree(self.root, ignore_errors=True)
                return
        raise RuntimeError(f"processes of the test cluster still running: {self.processes()}")

    def read_on(self, name: str) -> list[str]:
        """The files under `watch` that the node's processes opened, in order."""
        path = self.opened[name]
        return path.read_text().split() if path.exists() else []


def scan_on(cluster: LoopbackCluster, args: list[str], *, cwd: Path = REPO,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m seqis scan ARGS --engine ray` from `cwd`, as a user types it, with RAY_ADDRESS set."""
    return subprocess.run([sys.executable, "-m", "seqis", "scan", *args, "--engine", "ray"], cwd=cwd,
                          env=cluster.driver_env(), capture_output=True, text=True, timeout=timeout)


_DRIVER = """
import json, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from seqis.runs.cli import main


@ray.remote(num_cpus=1)
class Hold:
    def ready(self):
        return True


for runtime_env, scans, on_node in json.loads(sys.argv[1]):
    ray.init(log_to_driver=False, runtime_env=runtime_env or None)
    alive = [n for n in ray.nodes() if n["Alive"]]
    head = next(n["NodeID"] for n in alive if "node:__internal_head__" in n["Resources"])
    node = next(n["NodeID"] for n in alive if n["NodeID"] != head)
    if on_node:
        hold = Hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
        ray.get(hold.ready.remote())  # the head's one CPU is taken: every task of the scans runs on the joining node
        print("on node", node, flush=True)
    for args in scans:
        print("exit", main([*args, "--engine", "ray"]), flush=True)
    ray.shutdown()
"""


def scan_on_node(cluster: LoopbackCluster, jobs: list[tuple[dict, list[list[str]], bool]], *, cwd: Path = REPO,
                 timeout: float = 300) -> tuple[subprocess.CompletedProcess, str | None]:
    """Scans in one driver process: for each (runtime_env, scans, on_node) of `jobs`, a Ray job with that
    runtime_env that, with on_node, holds the head's one CPU with an idle actor so that every task runs on the
    joining node, then runs `seqis scan ARGS --engine ray` for each ARGS of scans (printing "exit N" after each).
    Returns the finished process and the joining node's id (None when no job ran on it)."""
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(jobs)], cwd=cwd, env=cluster.driver_env(),
                          capture_output=True, text=True, timeout=timeout)
    node = next((line.split()[-1] for line in done.stdout.splitlines() if line.startswith("on node ")), None)
    return done, node
