"""What one Explore slider move crosses: `python scripts/count_slider_move.py [ROOT]` (default: this checkout).

Starts the explorer from ROOT with a profile hook on every thread, opens Explore in headless Chromium, and between
two signals moves seq_clip one step with the keyboard (a fragment rerun of seq_tis's column). Prints the app and
library modules whose functions ran during the move, and each call of the registry's `resolve` (a name, or a
composition handed back as is). Another checkout (a baseline) works too: its app and its seqis are the ones run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def serve(root: str, out: str, port: int) -> None:
    """The server, in this process: the hook records between SIGUSR1 and SIGUSR2, then writes `out`."""
    state = {"on": False, "calls": {}, "resolves": []}
    lock = threading.Lock()

    def hook(frame, event, arg):
        if not state["on"] or event != "call":
            return
        f = frame.f_code.co_filename
        if f.startswith(root) and "/.venv/" not in f and frame.f_code.co_name != "<module>":
            rel = os.path.relpath(f, root)
            with lock:
                state["calls"][rel] = state["calls"].get(rel, 0) + 1
                if frame.f_code.co_name == "resolve" and rel.endswith("dispatch.py"):
                    x = frame.f_locals.get("x")
                    state["resolves"].append(x if isinstance(x, str) else type(x).__name__)

    def start(*_):
        with lock:
            state["calls"].clear()
            state["resolves"].clear()
        state["on"] = True

    def stop(*_):
        state["on"] = False
        with lock, open(out, "w") as f:
            json.dump({"calls": state["calls"], "resolves": state["resolves"]}, f)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    threading.setprofile(hook)
    sys.setprofile(hook)
    os.chdir(root)
    sys.argv = ["streamlit", "run", "app", "--server.port", str(port), "--server.address", "127.0.0.1",
                "--server.headless", "true", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    from streamlit.web import cli

    cli.main()


def settle(page, timeout_s: float = 240) -> None:
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=timeout_s * 1000)
    quiet, end = 0, time.time() + timeout_s
    while time.time() < end and quiet < 6:
        quiet = 0 if page.locator('[data-testid="stStatusWidget"]').count() else quiet + 1
        page.wait_for_timeout(250)


def main() -> None:
    from bench_browser import CHROMIUM_ARGS, chromium
    from playwright.sync_api import sync_playwright

    root = str(Path(sys.argv[1]).resolve()) if len(sys.argv) > 1 else str(HERE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    env = {**os.environ, "PYTHONPATH": root, "SEQIS_WARM": "0"}
    proc = subprocess.Popen([sys.executable, __file__, "--serve", root, out, str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            settle(page)
            thumb = page.locator('[data-testid="stMain"] input[type="range"][aria-label="seq_clip"]').first
            thumb.focus()
            page.wait_for_timeout(500)
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.3)
            thumb.press("ArrowRight")
            page.wait_for_timeout(1500)
            settle(page)
            os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(1)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    with open(out) as f:
        d = json.load(f)
    app = sorted(k for k in d["calls"] if k.startswith("app/"))
    lib = sorted(k for k in d["calls"] if k.startswith("seqis/"))
    print(f"{len(app)} app modules whose functions ran: {', '.join(app)}")
    print(f"{len(lib)} library modules: {', '.join(lib)}")
    print(f"resolve calls: {d['resolves']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
