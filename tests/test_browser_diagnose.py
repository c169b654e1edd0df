"""The Diagnose page in headless Chromium (the server and browser of test_browser.py): for each fault asset
of the tiny transformer, every finding's chart renders without an exception, and the expected finding leads."""

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

ASSETS = {  # asset -> the title of the finding that must lead
    "tiny_lm_top_p0.9.parquet": "Sampler truncation",
    "tiny_lm_top_k20.parquet": "Sampler truncation",
    "tiny_lm_temperature0.7.parquet": "Temperature mismatch",
    "tiny_lm_off_by_one.parquet": "Token misalignment",
    "tiny_lm_kernel_bug.parquet": "Catastrophic tokens",
    "tiny_lm_fp16.parquet": "Precision noise",
    "precision_tiny_lm_bf16.parquet": "Precision noise",
    "tiny_lm_math_temperature0.7.parquet": "only in env = math",  # the scan's group finding, first (issue 43)
}


def test_every_fault_asset_renders_each_findings_chart(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for asset, lead in ASSETS.items():
        page.goto(f"{server}/diagnose?dg.source=batch&ex.source=asset&ex.asset={asset}")
        _settle(page, timeout_s=180)
        _no_exceptions(page, asset)
        cards = page.locator('[data-testid="stMarkdownContainer"]', has_text="· ")
        first = page.locator('[data-testid="stMain"]').get_by_text(lead).first
        assert first.count(), f"{asset}: no {lead} finding"
        charts = page.locator('.seqis-chart')
        try:  # a finding's chart and the worst rollout; under load the second may arrive after the page settles
            page.wait_for_function("document.querySelectorAll('.seqis-chart').length >= 2",
                                   timeout=60_000)
        except Exception:  # the assertion below says how many there were
            pass
        for i in range(charts.count()):  # a chart far below the viewport draws when scrolled near, as a person would
            charts.nth(i).scroll_into_view_if_needed()
            charts.nth(i).locator('.main-svg').first.wait_for(timeout=60_000)
        assert charts.count() >= 2, f"{asset}: {charts.count()} charts"  # a finding's chart and the worst rollout
        assert cards.count() >= 1
        _shot(page, f"diagnose-{asset.split('.parquet')[0]}")
    assert not errors, errors
    page.close()
