"""The Lessons page in headless Chromium (the server and browser of test_browser.py): a student walks all seven
screens with Next, clicks every Reveal, and each screen draws its chart with no exception; the same walk in
presenter mode on a projector's 1280 x 720. SEQIS_SHOTS=/some/dir saves a screenshot of every screen, before and
after its reveal."""

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

N_SCREENS = 7


def _walk(page, name: str) -> list[str]:
    """From the current screen to the last with Next, revealing each; the titles seen."""
    titles = []
    for n in range(N_SCREENS):
        _settle(page, timeout_s=240)  # the lag screen trains on a cold server
        _no_exceptions(page, f"{name} screen {n}")
        titles.append(page.locator('[data-testid="stMain"] h1').first.inner_text())
        chart = page.locator('.seqis-chart').first
        chart.scroll_into_view_if_needed()
        chart.locator('.main-svg').first.wait_for(timeout=60_000)  # plotly drew it
        assert page.locator('.seqis-chart').count() == 1, f"{name} screen {n}: one chart"
        _shot(page, f"lessons-{name}-{n}")
        page.get_by_role("button", name="Reveal").first.click()
        _settle(page, timeout_s=120)
        _no_exceptions(page, f"{name} screen {n}, revealed")
        page.locator('.seqis-chart .main-svg').first.wait_for(timeout=60_000)
        alert = page.locator('[data-testid="stAlertContainer"]', has_text="Answer")
        assert alert.count(), f"{name} screen {n}: no answer after Reveal"
        _shot(page, f"lessons-{name}-{n}-revealed")
        if n < N_SCREENS - 1:
            page.get_by_role("button", name="Next").first.click()
            page.wait_for_url(f"**step={n + 2}**", timeout=30_000)  # steps count from 1
    return titles


def test_a_student_walks_every_screen_and_reveals_every_answer(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/lessons?step=1")
    titles = _walk(page, "wide")
    assert len(set(titles)) == N_SCREENS and all(t.endswith("?") for t in titles), titles
    assert not errors, errors
    page.close()


def test_presenter_mode_on_a_projector(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{server}/lessons?step=1&present=1")
    _walk(page, "projector")
    assert not page.locator('[data-testid="stSidebar"]').is_visible()  # nothing but the screen
    assert "present=1" in page.url
    page.close()
