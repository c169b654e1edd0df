"""A randomised session in headless Chromium (the server and browser of test_browser.py): two sessions at once
take turns at random widget actions on every page (buttons, select boxes, sliders, radios, checkboxes, number
inputs, page switches), with uploads of good and broken files in between (a valid batch, one with other column
names, random bytes, a cut-off parquet, a pickle, a batch without loss tokens, one with NaN log-probs, a scan
parquet and a damaged one). The session must end with no exception element on any page, and the server's
memory must stay bounded: its resident set after the session at most MEMORY_BOUND above what it was after one
visit of every page. It reports how many actions and uploads it tried, and the memory, at the end of the run.

Seeded (SEQIS_RANDOM_SEED, default 0) so a failure can be replayed; SEQIS_RANDOM_ACTIONS sets the length.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from test_browser import SMALL, _settle, browser, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PATHS = ["", "lessons", "compare", "bias-variance", "length-thresholds", "training", "diagnose", "run", "learn"]
ACTIONS = int(os.environ.get("SEQIS_RANDOM_ACTIONS", "60"))  # the few hundred: SEQIS_RANDOM_ACTIONS=300
SEED = int(os.environ.get("SEQIS_RANDOM_SEED", "0"))
UPLOAD_EVERY = 6  # an upload every this many actions (60: each of the ten files once)
CHECK_EVERY = 10  # both sessions settle and are checked for an exception every this many actions
ACT_MS = 2_000  # an element not actionable by then went away in a rerun: the action counts as stale
MEMORY_BOUND = 1 << 30  # bytes of resident-set growth allowed over the session (the caches are bounded)
# small work per page, as a shared link would set it: a small batch, a short training run
LIGHT = {"": SMALL, "training": "tr.H=32&tr.steps=25&tr.B=32&tr.seeds=1", "diagnose": "dg.source=batch&" + SMALL}
SKIP_BUTTONS = ("Deploy", "Stop", "Clear", "Download")  # the menu, and buttons that leave the page or save files


def _rss(pid: int) -> int:
    """The process's resident set (and its children's: the app may start helpers), bytes, from /proc."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _files(folder: Path) -> dict[str, tuple[Path, bool]]:
    """name -> (path, whether the app should accept it) for the uploads."""
    import torch

    from seqis import Batch
    from seqis.io import save_batch
    from seqis.runs import scan
    from seqis.runs.example import write_prime_rl_run
    from seqis.samplers.scenarios import make_batch

    b = make_batch("catastrophic", seed=4, n_rollouts=24, max_len=64)
    out = {}
    save_batch(b, folder / "good.parquet")
    out["good.parquet"] = (folder / "good.parquet", True)
    save_batch(b, folder / "odd.npz", columns={"trainer_logprobs": "lp_train", "inference_logprobs": "lp_vllm"})
    out["odd.npz"] = (folder / "odd.npz", False)  # until its columns are mapped
    (folder / "noise.safetensors").write_bytes(random.Random(SEED).randbytes(3000))
    out["noise.safetensors"] = (folder / "noise.safetensors", False)
    raw = (folder / "good.parquet").read_bytes()
    (folder / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    out["cut.parquet"] = (folder / "cut.parquet", False)
    (folder / "batch.pt").write_bytes(pickle.dumps({"x": io.BytesIO}))  # a pickle: refused, never run
    out["batch.pt"] = (folder / "batch.pt", False)
    save_batch(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, torch.zeros(b.shape, dtype=torch.bool)),
               folder / "prompts.jsonl")
    out["prompts.jsonl"] = (folder / "prompts.jsonl", False)
    (folder / "nan.json").write_text('[{"trainer_logprobs": [-0.1, NaN], "inference_logprobs": [-0.1, -0.2], '
                                     '"advantages": 1.0}]')
    out["nan.json"] = (folder / "nan.json", False)
    write_prime_rl_run(folder / "run", steps=3, ranks=1, rollouts_per_rank=4, max_len=12, incident=(1, "code"))
    scan(folder / "run", ["seq_tis"], by="env_name", out=folder / "scan.parquet", workers=1)
    out["scan.parquet"] = (folder / "scan.parquet", True)
    (folder / "badscan.parquet").write_bytes((folder / "scan.parquet").read_bytes()[:300])
    out["badscan.parquet"] = (folder / "badscan.parquet", False)
    return out


class Session:
    """One browser page (its own Streamlit session) and the random actions it takes."""

    def __init__(self, context, base: str, rng: random.Random, tried: Counter):
        self.page, self.base, self.rng, self.tried = context.new_page(), base, rng, tried
        self.page.set_default_timeout(15_000)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def goto(self, path: str) -> None:
        query = LIGHT.get(path, "")
        self.page.goto(f"{self.base}/{path}" + (f"?{query}" if query else ""))
        self.tried["page visits"] += 1

    def _visible(self, selector: str, skip: tuple[str, ...] = ()):
        """The visible, enabled elements matching selector in the page's main area (one round trip)."""
        full = f'[data-testid="stMain"] {selector}'
        found = self.page.evaluate(
            """([sel, skip]) => Array.from(document.querySelectorAll(sel)).map((el, i) => {
                 const r = el.getBoundingClientRect(), text = el.innerText || '';
                 const off = el.disabled || el.getAttribute('aria-disabled') === 'true';
                 const shown = r.width > 0 && r.height > 0 && !off;
                 return shown && !skip.some(s => text.includes(s)) ? i : -1; }).filter(i => i >= 0)""",
            [full, list(skip)])
        loc = self.page.locator(full)
        return [loc.nth(i) for i in found]

    # action -> the elements it acts on (in the page's main area)
    TARGETS = {"button": "button", "select": 'input[role="combobox"]', "slider": '[role="slider"]',
               "radio": '[data-testid="stRadio"] label',
               "check": '[data-testid="stCheckbox"] label, [data-testid="stToggle"] label',
               "number": '[data-testid="stNumberInput"] input'}
    WEIGHTS = {"button": 3, "select": 4, "slider": 4, "radio": 2, "check": 2, "number": 2, "page": 1}

    def act(self) -> str:
        """One random action; returns what it was (an action that found nothing to act on counts as a look)."""
        kind = self.rng.choices(list(self.WEIGHTS), weights=list(self.WEIGHTS.values()))[0]
        try:
            if kind == "page":
                self.goto(self.rng.choice(PATHS))
                return kind
            targets = self._visible(self.TARGETS[kind], SKIP_BUTTONS if kind == "button" else ())
            if not targets:
                return kind
            target = self.rng.choice(targets)
            if kind == "slider":
                target.focus(timeout=ACT_MS)
                for _ in range(self.rng.randint(1, 3)):
                    target.press(self.rng.choice(["ArrowLeft", "ArrowRight", "Home", "End", "PageUp"]), timeout=ACT_MS)
            elif kind == "number":
                target.fill(str(self.rng.choice([0, 1, 3, 7, 64, -5, 10**9, 2.5])), timeout=ACT_MS)
                target.press("Enter", timeout=ACT_MS)
            else:
                target.click(timeout=ACT_MS)
                if kind == "select":  # the open list: one of its options, or away
                    options = self.page.locator('[role="option"]')
                    n = options.count()
                    if n:
                        options.nth(self.rng.randrange(min(n, 40))).click(timeout=ACT_MS)
                    else:
                        self.page.keyboard.press("Escape")
        except Exception as e:  # an element that went away mid-action (a rerun redrew it): a person retries
            self.tried["stale elements"] += 1
            return f"{kind} (stale: {type(e).__name__})"
        return kind

    def upload(self, files: dict[str, tuple[Path, bool]], name: str) -> str:
        path, _ = files[name]
        # a fresh visit each time (an uploader already on the page may go in the rerun a last action started)
        if "scan" in name:  # the Run page's upload takes a scan parquet; Explore's and Diagnose's a batch
            self.page.goto(f"{self.base}/run?run.source=upload")
        else:
            where = self.rng.choice(["?", "diagnose?dg.source=batch&"])
            self.page.goto(f"{self.base}/{where}ex.source=upload&{SMALL}")
        _settle(self.page, timeout_s=120)
        self.page.locator('[data-testid="stFileUploader"] input[type="file"]').first.set_input_files(str(path))
        self.tried["uploads"] += 1
        return f"upload {name}"

    def check_upload(self, files: dict[str, tuple[Path, bool]], name: str) -> None:
        """A broken file is refused where it was dropped, by an error naming it; a good one brings no error."""
        try:
            _settle(self.page, timeout_s=60)
        except AssertionError:
            self.tried["runs still going at a check"] += 1
            return
        errors = [e for e in self.page.locator('[data-testid="stAlertContentError"]').all_inner_texts() if name in e]
        _, good = files[name]
        assert bool(errors) != good, f"upload {name}: {'an error' if good else 'no error naming it'}: {errors}"
        self.tried["uploads refused" if errors else "uploads accepted"] += 1

    def check(self, history: list[str]) -> None:
        """Settled (or still running after a while: that is no exception), and no exception element."""
        try:
            _settle(self.page, timeout_s=60)
        except AssertionError:
            self.tried["runs still going at a check"] += 1
        errors = self.page.locator('[data-testid="stException"]')
        if errors.count():
            raise AssertionError(f"exception after {history[-6:]} at {self.page.url}:\n"
                                 f"{errors.first.inner_text()[:2000]}")


def _server_pid(base: str) -> int:
    """The pid of the process listening on the server's port (test_browser's fixture keeps the Popen to itself)."""
    port = int(base.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
        except OSError:
            pass
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process listens on port {port}")


def test_two_random_sessions_end_without_an_exception_and_with_bounded_memory(server, browser,  # noqa: F811
                                                                                tmp_path, summary):
    files = _files(tmp_path)
    pid = _server_pid(server)
    rng = random.Random(SEED)
    tried: Counter = Counter()
    contexts = [browser.new_context(viewport={"width": w, "height": 900}) for w in (1600, 900)]
    sessions = [Session(c, server, random.Random(rng.random()), tried) for c in contexts]
    started = time.perf_counter()
    for s, paths in zip(sessions, (PATHS, PATHS[:1])):  # every page once: the baseline holds what a first visit loads
        for path in paths:
            s.goto(path)
            s.check([f"first visit of /{path}"])
    baseline, warm = _rss(pid), time.perf_counter() - started
    history: list[str] = []
    uploads = iter(rng.sample(sorted(files), len(files)) * (ACTIONS // UPLOAD_EVERY // len(files) + 1))
    spent: Counter = Counter()  # seconds per phase, for the report
    for i in range(ACTIONS):
        s = sessions[i % 2]  # two users at once: each acts while the other's run may still be going
        t0 = time.perf_counter()
        if i % UPLOAD_EVERY == UPLOAD_EVERY - 1:  # every file, good and broken, in a shuffled order
            name = next(uploads)
            history.append(s.upload(files, name))
            s.check_upload(files, name)
            s.check(history)
            spent["uploads"] += time.perf_counter() - t0
        else:
            history.append(s.act())
            tried["actions"] += 1
            s.page.wait_for_timeout(rng.choice([30, 100, 300]))  # an impatient user: runs are cut short
            spent["actions"] += time.perf_counter() - t0
        if i % CHECK_EVERY == CHECK_EVERY - 1:
            t0 = time.perf_counter()
            for other in sessions:
                other.check(history)
            spent["checks"] += time.perf_counter() - t0
    for s in sessions:
        s.check(history)
    after = _rss(pid)
    seconds = time.perf_counter() - started
    kinds = Counter(h.split(" ")[0] for h in history)
    summary.append(f"random session (seed {SEED}): {tried['actions']} actions ({dict(kinds)}), {tried['uploads']} "
                   f"uploads ({tried['uploads accepted']} accepted, {tried['uploads refused']} refused), "
                   f"{tried['page visits']} page visits, {tried['stale elements']} stale elements, in {seconds:.0f} s ("
                   + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()) + f", first visits {warm:.0f} s); "
                   f"server RSS {baseline / 2**20:.0f} MB after the first visits -> {after / 2**20:.0f} MB after the "
                   f"session (bound: +{MEMORY_BOUND / 2**20:.0f} MB)")
    page_errors = [e for s in sessions for e in s.errors]
    for c in contexts:
        c.close()
    assert after - baseline <= MEMORY_BOUND, (baseline, after)
    assert not page_errors, page_errors[:5]
