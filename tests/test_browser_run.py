"""The Run page in headless Chromium (the server and browser of test_browser.py): the example run renders
its timelines without an exception, and clicking a step's button opens that step in Explore."""

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser


def test_the_run_page_renders_and_a_click_opens_the_step(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/run")
    _settle(page)
    _no_exceptions(page, "run")
    page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg', timeout=60_000)
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 2
    _shot(page, "run-wide")
    page.get_by_role("button", name="Open step 5 in Explore").click()
    page.wait_for_url(lambda url: "/run" not in url, timeout=60_000)
    _settle(page)
    _no_exceptions(page, "explore, opened from the run page")
    assert page.locator('[data-testid="stMain"] h1').first.inner_text().startswith("Explore")
    assert page.get_by_text("step_5.jsonl").count() > 0  # the sidebar names the batch it shows
    _shot(page, "run-step-in-explore")
    assert not errors, errors
    page.close()
