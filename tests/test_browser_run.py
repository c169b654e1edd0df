"""The Run page in headless Chromium (the server and browser of test_browser.py): the example run renders
its timelines without an exception; a click on a timeline point opens that step in Diagnose (its batch, one
button from Explore), and coming back to the run page does not open it again; a step's button opens it in
Explore; an uploaded scan (set_input_files on the uploader) shows its incident and timelines. Screenshots
at 1600 and 900 px wide with SEQIS_SHOTS=DIR."""

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

WIDTHS = (1600, 900)

# the centre of point `index` of the trace named `name` in the page's first plotly chart (viewport pixels)
POINT = """
([name, index]) => {
  const gd = document.querySelector('.seqis-chart');
  const trace = gd.data.findIndex(t => t.name === name);
  const marker = gd.querySelectorAll('.scatterlayer .trace')[trace].querySelectorAll('.points path')[index];
  const box = marker.getBoundingClientRect();
  return [box.x + box.width / 2, box.y + box.height / 2, gd.calcdata[trace][index].x];
}
"""


def _run_page(browser, server, width: int, query: str = ""):  # noqa: F811
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.goto(f"{server}/run{query}")
    _settle(page)
    _no_exceptions(page, f"run, {width} px")
    return page


def _heading(page) -> str:
    return page.locator('[data-testid="stMain"] h1').first.inner_text()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_click_on_a_timeline_point_opens_its_step_in_diagnose(server, browser, width):  # noqa: F811
    page = _run_page(browser, server, width)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.wait_for_selector('.seqis-chart .main-svg', timeout=60_000)
    assert page.locator('.seqis-chart').count() == 2  # too few steps for the early warning's chart
    assert page.get_by_text("Click a point to open its step in Diagnose").count()
    _shot(page, f"run-{width}")
    chart = page.locator('.seqis-chart').first
    chart.scroll_into_view_if_needed()
    _shot(page, f"run-timeline-{width}")
    x, y, step = page.evaluate(POINT, ["math", 3])  # an ordinary point: step 3 of the math environment
    page.mouse.move(x, y)
    page.wait_for_timeout(300)  # plotly finds the point under the pointer on hover
    page.mouse.click(x, y)
    page.wait_for_url(lambda url: "/run" not in url, timeout=60_000)
    _settle(page)
    _no_exceptions(page, "diagnose, opened by a click on the run's timeline")
    assert _heading(page).startswith("Diagnose")
    assert page.get_by_text(f"step_{step}.jsonl").count() > 0  # the clicked step's batch
    assert page.get_by_role("button", name="Open this batch in Explore").count()  # Explore: one click on
    _shot(page, f"run-click-diagnose-{width}")
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Run").first.click()  # back: the click is spent
    _settle(page)
    page.wait_for_timeout(1000)
    _settle(page)
    assert _heading(page).startswith("Run"), "returning to the run page opened the clicked step again"
    assert not errors, errors
    page.close()


def test_a_steps_button_opens_it_in_explore(server, browser):  # noqa: F811
    page = _run_page(browser, server, 1600)
    page.get_by_role("button", name="Open step 5 in Explore").click()
    page.wait_for_url(lambda url: "/run" not in url, timeout=60_000)
    _settle(page)
    _no_exceptions(page, "explore, opened from the run page")
    assert _heading(page).startswith("Explore")
    assert page.get_by_text("step_5.jsonl").count() > 0  # the sidebar names the batch it shows
    _shot(page, "run-step-in-explore")
    page.close()


def test_an_uploaded_scan_shows_its_incident_and_timelines(server, browser, tmp_path):  # noqa: F811
    from seqis.runs import scan
    from seqis.runs.example import write_prime_rl_run

    write_prime_rl_run(tmp_path / "run", steps=4, ranks=1, rollouts_per_rank=6, envs=("a", "b"), incident=(2, "b"))
    out = tmp_path / "scan.parquet"
    scan(tmp_path / "run", ["seq_tis", "mis_po"], by="env_name", out=out, workers=1)
    page = _run_page(browser, server, 1600, "?run.source=upload")
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(out))
    page.wait_for_selector('.seqis-chart .main-svg', timeout=60_000)
    _settle(page)
    _no_exceptions(page, "run, an uploaded scan")
    assert page.get_by_text("4 steps (0 to 3), 2 groups, 2 corrections").count()
    assert page.locator('.seqis-chart').count() == 2  # too few steps for the early warning's chart
    assert page.get_by_text("Step 2 · b · bad: catastrophic_tokens").count()  # the incident, first
    _shot(page, "run-upload")
    page.close()


def test_the_picker_offers_the_runs_under_the_roots_and_refuses_a_typed_path_outside(server, browser):  # noqa: F811
    """The server reads its start folder (the repository) and assets/ (it listens on loopback, no roots set):
    the Run folder picker lists the example run; picking it scans it; a path typed into the picker that leads
    out (../../etc) is refused with the one message."""
    page = _run_page(browser, server, 1600, "?run.source=folder")
    picker = page.locator('[data-testid="stSelectbox"]').filter(has_text="Run folder on the server")
    picker.locator("input").click()
    page.get_by_role("option", name="assets/runs/prime_rl_example").click()
    page.wait_for_selector('.seqis-chart .main-svg', timeout=60_000)
    _settle(page)
    _no_exceptions(page, "run, a run picked")
    assert page.get_by_text("8 steps (0 to 7)").count()
    assert "run.path=assets%2Fruns%2Fprime_rl_example" in page.url  # the pick travels in the link
    _shot(page, "run-picker")
    picker.locator("input").click()
    picker.locator("input").fill("../../etc")
    page.keyboard.press("Enter")
    _settle(page)
    page.get_by_text("no run folder by that name in the folders this server reads").wait_for(timeout=30_000)
    assert page.locator('.seqis-chart').count() == 0
    _shot(page, "run-picker-refused")
    page.close()


@pytest.fixture
def growing_run(tmp_path):
    """(staged steps, the run folder they land in): the run inside the folder the server was started in (the
    repository: the folder it reads when it listens on loopback with no roots set), under its ignored build/."""
    import shutil
    import uuid

    from test_browser import ROOT

    from seqis.runs.example import write_prime_rl_run

    staged = tmp_path / "staged"
    write_prime_rl_run(staged, steps=5, ranks=1, rollouts_per_rank=6, envs=("a", "b"), incident=(4, "b"))
    run = ROOT / "build" / f"test-follow-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    try:
        yield staged, run
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_follow_shows_steps_as_they_land_without_reloading_the_page(server, browser, growing_run):  # noqa: F811
    """Follow on a run folder that grows: each step that lands shows (the latest step line, the table) without a
    page load, an incident at a step that landed while following is marked new, and the latest step opens in
    Diagnose with one click. Screenshots with Follow on at 1600 and 900 px."""
    import shutil
    from urllib.parse import quote

    from test_browser import ROOT

    staged, run = growing_run
    for step in range(3):
        shutil.copytree(staged / f"step_{step}", run / f"step_{step}")
    where = quote(str(run.relative_to(ROOT)))
    query = f"?run.source=folder&run.path={where}&run.estimators=seq_tis&run.follow=true&run.every=2"
    for width in WIDTHS:
        page = _run_page(browser, server, width, query)
        page.wait_for_selector('.seqis-chart .main-svg', timeout=60_000)
        page.get_by_text("Latest: step").first.wait_for(timeout=60_000)
        _shot(page, f"run-follow-{width}")
        page.close()
    page = _run_page(browser, server, 1600, query)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.get_by_text("Latest: step 2").wait_for(timeout=60_000)
    page.evaluate("window.__seqisNoReload = true")  # gone if the page loads again
    for step in (3, 4):
        shutil.copytree(staged / f"step_{step}", run / f"step_{step}")
        page.get_by_text(f"Latest: step {step}").wait_for(timeout=60_000)  # a few looks, no action of ours
    assert page.evaluate("window.__seqisNoReload === true"), "the page loaded again instead of updating in place"
    _no_exceptions(page, "run, following")
    assert page.get_by_text("5 steps (0 to 4)").count()
    # step 4's incident landed while following: its line carries the badge (the incidents table's "new" column
    # header is a hidden <th> of the grid's accessible copy, found first in the page's order on some runs)
    badge = page.locator('[data-testid="stMarkdownContainer"]').get_by_text("new", exact=True)
    badge.first.wait_for(timeout=30_000)
    assert page.get_by_text("Step 4 · b · bad: catastrophic_tokens").count()
    _shot(page, "run-follow-new-incident")
    page.get_by_role("button", name="Diagnose").first.click()  # the latest step's own button comes first
    page.wait_for_url(lambda url: "/run" not in url, timeout=60_000)
    _settle(page)
    _no_exceptions(page, "diagnose, the latest step of a followed run")
    assert _heading(page).startswith("Diagnose")
    assert page.get_by_text("step_4.jsonl").count() > 0
    assert not errors, errors
    page.close()
