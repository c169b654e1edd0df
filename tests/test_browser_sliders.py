"""mis_po's trajectory-band sliders moved with the arrow keys (issue 43): every chart keeps drawing. Before, a draw
and the resize or the unmount of the same chart ran at once and the chart said "This chart could not be drawn:
Cannot read properties of undefined (reading '_redrawFromAutoMarginCount')" (4 of 4 tries) and the grid misaligned.

Skips without Playwright or a chromium, as tests/test_browser.py does.
"""

from __future__ import annotations

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser
SMALL = "ex.sc.gaussian.n_rollouts=64&ex.sc.gaussian.max_len=512"


@pytest.mark.parametrize("width", [900, 1600])
def test_the_trajectory_band_sliders_moved_with_the_keys_leave_every_chart_drawn(server, browser, width):  # noqa: F811
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/?{SMALL}&ex.est=mis_po,seq_tis")
    _settle(page, 240)
    _no_exceptions(page, "explore")
    for knob, keys in (("geo_mask_low", ["ArrowLeft"] * 6 + ["ArrowRight"] * 3),
                       ("geo_mask_high", ["ArrowRight"] * 6 + ["ArrowLeft"] * 3)):
        thumb = page.locator(f'[data-testid="stMain"] input[type="range"][aria-label="{knob}"]').first
        thumb.focus()
        for key in keys:  # quick presses: the fragment reruns overlap the charts' draws
            thumb.press(key)
            page.wait_for_timeout(0 if width == 900 else 60)
    _settle(page)
    page.wait_for_timeout(1500)
    _no_exceptions(page, "explore after the slider moves")
    broken = page.locator(".seqis-chart", has_text="could not be drawn")
    assert broken.count() == 0, broken.first.inner_text()
    assert not [e for e in errors if "_redrawFromAutoMarginCount" in e or "undefined" in e], errors
    drawn = page.evaluate("Array.from(document.querySelectorAll('.seqis-chart')).filter(c => c.__seqisDrawn)"
                          ".every(c => c.querySelector('.main-svg'))")
    assert drawn
    _shot(page, f"explore-sliders-{width}")
    page.close()
