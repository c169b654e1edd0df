"""The README's picture: `python scripts/screenshot.py [OUT]` (default docs/screenshot.png).

Starts the explorer from this checkout on a free loopback port, opens Explore in headless Chromium (Debian's, at
/usr/bin/chromium) at 1600 x 1180, waits for the charts and saves the page as a PNG.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent.parent
CHROMIUM = ("--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking "
            "--disable-component-update --disable-sync --no-first-run").split()


def main(out: str = str(HERE / "docs" / "screenshot.png")) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app", "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true",
                               "--browser.gatherUsageStats", "false"], cwd=HERE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM)
            page = browser.new_page(viewport={"width": 1600, "height": 1180})
            page.goto(f"http://127.0.0.1:{port}/", timeout=180_000)
            page.wait_for_selector(".js-plotly-plot", timeout=180_000)
            page.wait_for_timeout(10_000)  # every visible chart drawn
            page.screenshot(path=out)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
