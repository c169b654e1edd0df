"""The Lessons page in headless Chromium (the server and browser of test_browser.py): a student walks every screen
with Next, clicks every Reveal, and each screen draws its chart with no exception; a lecturer walks them in
presenter mode on a projector's 1280 x 720 with the keys alone (R reveals, the right arrow or PageDown goes on, the
left arrow or PageUp back), and on every screen, before and after Reveal, "Lesson N of M", the question, the chart
and Back / Next are in the viewport without scrolling, with the answer's first lines, and a new screen opens at the
top. SEQIS_SHOTS=/some/dir saves a screenshot of every screen (the whole page wide; the viewport on the projector).
"""

import os
from pathlib import Path

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

N_SCREENS = 11
W, H = 1280, 720


def _walk(page, name: str) -> list[str]:
    """From the current screen to the last with Next, revealing each; the titles seen."""
    titles = []
    for n in range(N_SCREENS):
        _settle(page, timeout_s=240)  # the lag screen trains on a cold server
        _no_exceptions(page, f"{name} screen {n + 1}")
        titles.append(page.locator('[data-testid="stMain"] h1').first.inner_text())
        chart = page.locator('.seqis-chart').first
        chart.scroll_into_view_if_needed()
        chart.locator('.main-svg').first.wait_for(timeout=60_000)  # plotly drew it
        assert page.locator('.seqis-chart').count() == 1, f"{name} screen {n + 1}: one chart"
        _shot(page, f"lessons-{name}-{n + 1}")
        page.get_by_role("button", name="Grade" if n == N_SCREENS - 1 else "Reveal").first.click()
        _settle(page, timeout_s=120)
        _no_exceptions(page, f"{name} screen {n + 1}, revealed")
        page.locator('.seqis-chart .main-svg').first.wait_for(timeout=60_000)
        alert = page.locator('[data-testid="stAlertContainer"]', has_text="Answer")
        assert alert.count(), f"{name} screen {n + 1}: no answer after Reveal"
        _shot(page, f"lessons-{name}-{n + 1}-revealed")
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


def _in_view(page, locator, what: str) -> None:
    """The element's top and bottom lie within the viewport, nothing covering its top (Streamlit's header)."""
    locator.first.wait_for(timeout=60_000)
    box = locator.first.bounding_box()
    assert box is not None, what
    top, bottom = box["y"], box["y"] + box["height"]
    assert 0 <= top and bottom <= H, f"{what} at y = {top:.0f}..{bottom:.0f}"
    on_top = page.evaluate("([x, y]) => document.elementFromPoint(x, y)?.closest('[data-testid=\"stHeader\"]') == null",
                           [box["x"] + 4, box["y"] + box["height"] / 2])
    assert on_top, f"{what}: covered by the header"


def _scroll_top(page) -> float:
    return page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollTop")


def _view_shot(page, name: str) -> None:
    folder = os.environ.get("SEQIS_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"))  # the viewport: what the room sees


def _fold(page, n: int, revealed: bool) -> None:
    """What a projector must show without scrolling on screen n (from 1)."""
    where = f"screen {n}{' revealed' if revealed else ''}"
    caption = page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]', has_text=f"Lesson {n} of")
    _in_view(page, caption, f"{where}: Lesson {n} of {N_SCREENS}")
    _in_view(page, page.locator('[data-testid="stMain"] h1'), f"{where}: the question")
    chart = page.locator('.seqis-chart .main-svg')
    chart.first.wait_for(timeout=60_000)
    assert chart.first.bounding_box()["y"] < H / 2, f"{where}: the chart starts in the upper half"
    if n < N_SCREENS:
        _in_view(page, page.locator('[class*="st-key-ls-next-"] button'), f"{where}: Next")
    if revealed:
        answer = page.locator('[data-testid="stAlertContainer"]', has_text="Answer")
        answer.first.wait_for(timeout=60_000)
        assert answer.first.bounding_box()["y"] + 60 <= H, f"{where}: the answer's first lines below the fold"


def test_a_lecturer_walks_the_projector_view_with_the_keys(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": W, "height": H})
    page.goto(f"{server}/lessons?step=1&present=1")
    for n in range(1, N_SCREENS + 1):
        _settle(page, timeout_s=240)
        _no_exceptions(page, f"projector screen {n}")
        assert f"step={n}" in page.url
        page.wait_for_timeout(400)  # the scroll to the top runs after the new screen's layout
        assert _scroll_top(page) == 0, f"screen {n} opened scrolled down"
        _fold(page, n, revealed=False)
        _view_shot(page, f"projector-{n:02d}")
        if n == N_SCREENS:  # the quiz: Grade is its Reveal, and its summary is the answer
            break
        page.locator("body").press("r")
        _settle(page, timeout_s=120)
        _no_exceptions(page, f"projector screen {n}, revealed")
        _fold(page, n, revealed=True)
        _view_shot(page, f"projector-{n:02d}-revealed")
        page.locator('[data-testid="stMain"]').evaluate("m => { m.scrollTop = 400; }")  # a lecturer scrolled down
        page.locator("body").press("ArrowRight" if n % 2 else "PageDown")
        page.wait_for_url(f"**step={n + 1}**", timeout=30_000)
    page.locator("body").press("ArrowLeft")
    page.wait_for_url(f"**step={N_SCREENS - 1}**", timeout=30_000)
    _settle(page)
    page.locator("body").press("PageUp")
    page.wait_for_url(f"**step={N_SCREENS - 2}**", timeout=30_000)
    assert not page.locator('[data-testid="stSidebar"]').is_visible()  # nothing but the screen
    assert "present=1" in page.url
    page.close()
