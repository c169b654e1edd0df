"""Section `browser`: what a person waits for in the explorer, measured in headless Chromium (Playwright).

Per action: from the input event (its DOM timeStamp) to the later of the last websocket message it caused and
the end of the browser's rendering work (two animation frames after that message; long tasks). Streamlit's
running indicator only shows after 500 ms, so it cannot be the measure; the page counts as done when no message
and no long task came for 1.5 s and that indicator is down. Medians of many actions, each printed as a ratio to a
floor measured in the same run (a rerun in which nothing changed: the "r" shortcut on Explore), with the
machine's load average. Skips, saying why, without Playwright or a chromium.

Also runnable on another checkout (to measure a baseline): python scripts/bench_browser.py ROOT [--only ...].
A cold start, as a person meets it: `python scripts/bench_browser.py --fresh 5 --launcher streamlit,app` starts a
new server 5 times per launcher, interleaved (`streamlit run app`; `app` is `make run`'s `python -m app`) and
opens the page once on each as soon as it answers: the time to the first chart drawn, and to the page falling
quiet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seqis.bench._host import host_line

ORDER = 50
FIRST_LOADS = 5  # first loads after the server is up, each in a fresh browser context (the median is reported)
ROOT = Path(__file__).resolve().parents[1]
PORT = int(os.environ.get("SEQIS_BENCH_PORT", "8616"))

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]

# In the page: every websocket message's arrival, a rAF loop's frame times (a gap > 50 ms is busy main
# thread), long tasks, and the first input event after `arm()`.
PROBE = """
(() => {
  const B = window.__bench = {msgs: [], painted: [], longtasks: [], t0: null, armed: false, firstChart: null};
  // the first chart drawn (plotly's SVG inside the explorer's chart component), ms after the navigation began
  new MutationObserver((_, obs) => {
    if (B.firstChart === null && document.querySelector('.seqis-chart .main-svg')) {
      B.firstChart = performance.now(); obs.disconnect();
    }
  }).observe(document, {childList: true, subtree: true});
  B.arm = () => { B.armed = true; B.t0 = null; };
  const Orig = window.WebSocket;
  function Probed(...args) {
    const ws = new Orig(...args);
    ws.addEventListener('message', () => {
      const i = B.msgs.length;
      B.msgs.push(performance.now());
      requestAnimationFrame(() => requestAnimationFrame(() => { B.painted[i] = performance.now(); }));
    });
    return ws;
  }
  Probed.prototype = Orig.prototype;
  for (const k of ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED']) Probed[k] = Orig[k];
  window.WebSocket = Probed;
  for (const type of ['keydown', 'pointerdown', 'mousedown', 'click']) {
    document.addEventListener(type, e => { if (B.armed && B.t0 === null) { B.t0 = e.timeStamp; B.armed = false; } },
                              true);
  }
  try {
    new PerformanceObserver(l => {
      for (const e of l.getEntries()) B.longtasks.push([e.startTime, e.startTime + e.duration]);
    }).observe({entryTypes: ['longtask']});
  } catch (e) {}
})();
"""

# After the action: the quiet point and what came before it.
READ = """
(t0) => {
  const B = window.__bench;
  let n = 0, lastMsg = t0, painted = t0;
  B.msgs.forEach((t, i) => {
    if (t >= t0) { n += 1; lastMsg = Math.max(lastMsg, t); painted = Math.max(painted, B.painted[i] || t); }
  });
  const tasks = B.longtasks.filter(([a, b]) => b >= t0);
  const lastTask = tasks.length ? Math.max(...tasks.map(([a, b]) => b)) : t0;
  const longWork = tasks.reduce((s, [a, b]) => s + (b - Math.max(a, t0)), 0);
  return {now: performance.now(), n, lastMsg, lastBusy: Math.max(painted, lastTask), longWork};
}
"""


def chromium() -> str | None:
    for candidate in (os.environ.get("SEQIS_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def start_server(root: Path, port: int, python: str, launcher: str = "app") -> tuple[subprocess.Popen, float]:
    """The app from ROOT on 127.0.0.1:port as `make run` starts it (launcher "app": `python -m app`; a checkout
    without that launcher gets `streamlit run ROOT/app`) or as the design card says (launcher "streamlit":
    `streamlit run app`); returns the process and the seconds until /_stcore/health answers."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    launcher = ["-m", "app"] if launcher == "app" and (root / "app" / "__main__.py").exists() else \
        ["-m", "streamlit", "run", "app"]
    cmd = [python, *launcher, "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    with socket.socket() as s:  # a server still on the port would answer the health check in our place
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already in use: stop that server or pick another port")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited: {proc.stdout.read().decode(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("streamlit did not answer /_stcore/health")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server start_server started; kill it if it has not gone within 10 s (a live one keeps the port)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class Meter:
    """Measures actions on one page."""

    def __init__(self, page, results: dict[str, list[dict]] | None = None, quiet_ms: float = 1500,
                 timeout_s: float = 180):
        self.page, self.quiet_ms, self.timeout_s = page, quiet_ms, timeout_s
        self.results: dict[str, list[dict]] = {} if results is None else results  # action -> measurements

    def running(self) -> bool:
        """Streamlit's running indicator is up (it only shows after 500 ms of a run)."""
        return self.page.locator('[data-testid="stStatusWidgetRunningIcon"]').count() > 0

    def arm(self) -> None:
        self.page.evaluate("window.__bench.arm()")

    def wait(self, t0: float | None = None) -> dict:
        """Wait until no message and no busy frame for quiet_ms, then read the action's numbers."""
        deadline = time.time() + self.timeout_s
        if t0 is None:
            while time.time() < deadline:
                t0 = self.page.evaluate("window.__bench.t0")
                if t0 is not None:
                    break
                self.page.wait_for_timeout(20)
        while time.time() < deadline:
            r = self.page.evaluate(READ, t0)
            if r["n"] == 0 and r["now"] - t0 > 30_000:
                raise TimeoutError("no websocket message within 30 s of the input: the action did nothing")
            quiet = r["now"] - max(r["lastMsg"], r["lastBusy"]) > self.quiet_ms
            if r["n"] > 0 and quiet and not self.running():
                # A long task that was running when this read was asked for is reported to the page only after
                # the read: let the page deliver what it owes (a frame and a task), then decide again.
                self.page.evaluate("() => new Promise(ok => requestAnimationFrame(() => setTimeout(ok, 0)))")
                again = self.page.evaluate(READ, t0)
                if max(again["lastMsg"], again["lastBusy"]) > max(r["lastMsg"], r["lastBusy"]):
                    continue
                end = max(r["lastMsg"], r["lastBusy"])
                return dict(total=(end - t0) / 1000, data=(r["lastMsg"] - t0) / 1000, msgs=r["n"],
                            long_work=r["longWork"] / 1000)
            self.page.wait_for_timeout(100)
        running = self.running()
        raise TimeoutError(f"the page did not fall quiet ({r}, running indicator: {running})")

    def record(self, name: str, r: dict) -> dict:
        self.results.setdefault(name, []).append(r)
        print(f"  {name}: {r['total']:.3f} s (data {r['data']:.3f} s, {r['msgs']} messages, "
              f"long tasks {r['long_work']:.3f} s)", flush=True)
        return r


def slider(page, label: str):
    return page.locator(f'[data-testid="stMain"] input[type="range"][aria-label="{label}"]')


def move(meter: Meter, name: str, thumb, key: str = "ArrowRight") -> None:
    thumb.focus()
    meter.arm()
    thumb.press(key)
    meter.record(name, meter.wait())


def floor(meter: Meter, page) -> None:
    page.locator('[data-testid="stMain"] h1').first.click()  # focus out of any widget
    meter.arm()
    page.keyboard.press("r")
    meter.record("floor: rerun, nothing changed", meter.wait())


def pick(meter: Meter, page, name: str, container: str, label: str, option: str) -> None:
    """Open a selectbox by its label and pick an option; measured from the click on the option."""
    box = page.locator(f'{container} input[role="combobox"][aria-label="{label}"]').first
    box.click()
    opt = page.locator('[role="option"]').filter(has_text=option).first
    opt.wait_for(timeout=10_000)
    meter.arm()
    opt.click()
    meter.record(name, meter.wait())


EXAMPLES = ("gaussian_s0.05.parquet", "catastrophic.jsonl", "policy_lag_k8_verl.npz",
            "long_context_16k_prime_rl.safetensors", "precision_tiny_lm_bf16.parquet")
SCENARIOS = ("drift", "catastrophic", "precision", "policy_lag", "gaussian")


def bench_sliders(meter, page, url, moves):
    """Explore slider moves at 256 x 4096, four estimators: fresh values each time."""
    for knob in ("seq_clip", "geo_mask_high", "token_mask_high"):
        thumbs = slider(page, knob)
        for i in range(thumbs.count()):
            for _ in range(moves):
                move(meter, "Explore slider move (256 x 4096, 4 estimators)", thumbs.nth(i))
    floor(meter, page)


def bench_token_clip(meter, page, url, moves):
    thumbs = slider(page, "token_clip")
    for _ in range(4):
        move(meter, "geo_mask token_clip move", thumbs.first)
    floor(meter, page)


def bench_picker(meter, page, url, moves):
    """Explore with "my framework" picked (verl's bypass_pg_geo_rs_token_tis, a fifth column beside the four seed
    estimators at 256 x 4096): the preset's own slider, then a seed estimator's, with the picker on."""
    page.goto(f"{url}/?ex.fw=verl&ex.fw.verl=verl%2Fbypass_pg_geo_rs_token_tis")
    meter.wait(0.0)
    for _ in range(moves * 2):
        move(meter, "Explore preset knob move (picker + 4 estimators)", slider(page, "rollout_is_threshold").first)
    for _ in range(moves):
        move(meter, "Explore seq_clip move with the picker on", slider(page, "seq_clip").first)
    floor(meter, page)
    page.goto(url)
    meter.wait(0.0)


def bench_scenarios(meter, page, url, moves):
    for scenario in SCENARIOS * 2:
        pick(meter, page, "scenario switch", '[data-testid="stSidebar"]', "Scenario", scenario)


def bench_examples(meter, page, url, moves):
    meter.arm()
    page.locator('[data-testid="stRadio"] label').filter(has_text="Example").first.click()
    meter.record("switch to examples", meter.wait())
    for ex in EXAMPLES * 2:
        pick(meter, page, "example switch", '[data-testid="stApp"]', "Example batch", ex)
    page.goto(url)
    meter.wait(0.0)


def bench_learn(meter, page, url, moves):
    for i in range(6):
        page.goto(f"{url}/learn")
        meter.wait(0.0)
        b = page.locator('[data-testid="stMain"] [data-testid="stButton"] button:visible').nth(i)
        b.wait_for(state="visible", timeout=120_000)
        b.scroll_into_view_if_needed()
        meter.arm()
        b.click()
        meter.record("Learn preset -> Explore", meter.wait())
    page.goto(url)
    meter.wait(0.0)


def bench_bias_variance(meter, page, url, moves):
    for _ in range(3):
        page.goto(url)
        meter.wait(0.0)
        link = page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Bias & variance")
        meter.arm()
        link.click()
        meter.record("Bias & variance open", meter.wait())
    for seed in (1, 2):
        box = page.locator('[data-testid="stSidebar"] input[aria-label="seed"]').first
        box.fill(str(seed))
        run = page.locator('[data-testid="stSidebar"] button').filter(has_text="Run").first
        meter.arm()
        run.click()
        meter.record("Bias & variance run (new seed)", meter.wait())
    page.goto(url)
    meter.wait(0.0)


SECTIONS = {"slider": bench_sliders, "clip": bench_token_clip, "picker": bench_picker, "scenario": bench_scenarios,
            "example": bench_examples, "learn": bench_learn, "bv": bench_bias_variance}


def first_chart(page) -> float | None:
    """Seconds from the navigation's start to the first chart drawn (None: none drawn)."""
    ms = page.evaluate("window.__bench.firstChart")
    return None if ms is None else ms / 1000


def fresh_starts(root: Path, port: int, python: str, launchers: list[str], n: int) -> dict[str, list[dict]]:
    """n cold starts per launcher, interleaved (an A/B on the same load): a new server each time, the page opened
    once in a new browser as soon as it answers."""
    from playwright.sync_api import sync_playwright

    results: dict[str, list[dict]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        for i, launcher in ((i, la) for i in range(n) for la in launchers):
            print(f"fresh server {i + 1} of {n} ({launcher}), load average {os.getloadavg()}; {host_line()}",
                  flush=True)
            proc, up = start_server(root, port, python, launcher)
            try:
                ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
                ctx.add_init_script(PROBE)
                page = ctx.new_page()
                meter = Meter(page, results)
                page.goto(f"http://127.0.0.1:{port}")
                r = meter.wait(0.0)
                chart = first_chart(page)
                meter.record(f"{launcher}: server up (s until /_stcore/health)",
                             dict(total=up, data=up, msgs=0, long_work=0))
                meter.record(f"{launcher}: first chart after open (fresh server)",
                             dict(r, total=chart if chart is not None else float("nan")))
                meter.record(f"{launcher}: first load after open (fresh server)", r)
                ctx.close()
            finally:
                stop_server(proc)
        browser.close()
    return results


def measure(root: Path, port: int, python: str, only: list[str], moves: int, launcher: str = "app"
            ) -> dict[str, list[dict]]:
    """Start the app from root, run the sections in `only`, return action -> measurements."""
    from playwright.sync_api import sync_playwright

    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()}; {host_line()}", flush=True)
    proc, up = start_server(root, port, python, launcher)
    url = f"http://127.0.0.1:{port}"
    print(f"server up in {up:.1f} s", flush=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
            results: dict[str, list[dict]] = {}
            ctx = None
            for _ in range(FIRST_LOADS):  # a fresh browser context each: nothing cached, as a first visit
                if ctx is not None:
                    ctx.close()
                ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
                ctx.add_init_script(PROBE)
                page = ctx.new_page()
                meter = Meter(page, results)  # the last page stays for the sections
                page.goto(url)
                r = meter.wait(0.0)
                meter.record("first chart (fresh browser)", dict(r, total=first_chart(page) or float("nan")))
                meter.record("first load (fresh browser)", r)
            for _ in range(3):
                floor(meter, page)
            for name in only:
                try:
                    SECTIONS[name](meter, page, url, moves)
                except Exception as e:  # a section that fails says so; the others still run
                    print(f"section {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    page.goto(url)
                    meter.wait(0.0)
                print(f"load average {os.getloadavg()}", flush=True)
            for _ in range(3):
                page.goto(url)
                meter.record("warm load (new session)", meter.wait(0.0))
            floor(meter, page)
            browser.close()
    finally:
        stop_server(proc)
    return meter.results


def report(results: dict[str, list[dict]]) -> None:
    floors = results.get("floor: rerun, nothing changed")
    floor_s = statistics.median(r["total"] for r in floors) if floors else float("nan")
    print("\n| action | n | median s | max s | x floor | data s | messages |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rs in results.items():
        med = statistics.median(r["total"] for r in rs)
        print(f"| {name} | {len(rs)} | {med:.3f} | {max(r['total'] for r in rs):.3f} | {med / floor_s:.2f} | "
              f"{statistics.median(r['data'] for r in rs):.3f} | {statistics.median(r['msgs'] for r in rs):.0f} |")
    print(f"\nload average at the end {os.getloadavg()}")


def run(device: str, quick: bool) -> None:
    print("\n## Browser: input to last message and drawn, headless Chromium, 256 x 4096 first view")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        print("skipped: playwright is not installed (pip install -e '.[test]')")
        return
    if chromium() is None:
        print("skipped: no chromium found (make browser installs Debian's; or set SEQIS_CHROMIUM)")
        return
    only = ["slider", "scenario"] if quick else list(SECTIONS)
    report(measure(ROOT, PORT, sys.executable, only, 1 if quick else 3))


def main() -> None:
    ap = argparse.ArgumentParser(description="the browser section on any checkout (e.g. a baseline)")
    ap.add_argument("root", type=Path, nargs="?", default=ROOT)
    ap.add_argument("--port", type=int, default=PORT)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--moves", type=int, default=3, help="slider moves per slider")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--launcher", default="app",
                    help="app: python -m app (make run); streamlit: streamlit run app; with --fresh a comma list "
                         "(interleaved)")
    ap.add_argument("--fresh", type=int, default=0, help="only this many cold starts, a new server each")
    args = ap.parse_args()
    if args.fresh:
        report(fresh_starts(args.root, args.port, args.python, args.launcher.split(","), args.fresh))
    else:
        launcher = args.launcher.split(",")[0]
        report(measure(args.root, args.port, args.python, args.only.split(","), args.moves, launcher))


if __name__ == "__main__":
    main()
