"""Explore's and Compare's head corrections in a real browser (issue 42 item 6): an uploaded file with the sampler's
top-16 head shows the score-centering section (K a slider, per token the head masses and what SC adds, one token's
head coefficients) and Compare the centered corrections side by side; the synthetic batch without a head says which
corrections need one. SEQIS_SHOTS=folder keeps the screenshots. Skips without Playwright or a chromium."""

from __future__ import annotations

import pytest
from test_browser import SMALL, _no_exceptions, _open, _settle, _shot, browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser


def _head_file(tmp_path):
    from seqis import Batch
    from seqis.io import save_batch
    from seqis.lab.head_lm import HeadLM, head_batch

    batch, _ = head_batch(HeadLM(vocab=256, positions=12, rollouts=8, mismatch=0.5).draw(0), 16)
    path = tmp_path / "head.npz"
    save_batch(Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages,
                     topk_ids=batch.topk_ids, topk_inference_logprobs=batch.topk_inference_logprobs,
                     topk_trainer_logprobs=batch.topk_trainer_logprobs.detach()), path, layout="padded")
    return path


def test_an_uploaded_head_shows_its_corrections_in_explore_and_compare(server, browser, tmp_path):  # noqa: F811
    page = _open(browser, f"{server}/?ex.source=upload&{SMALL}", "explore, upload")
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(_head_file(tmp_path)))
    _settle(page)
    page.get_by_role("button", name="Open this batch in Explore").click()
    _settle(page)
    _no_exceptions(page, "explore with a head")
    section = page.get_by_text("The sampler's head: score centering", exact=True)
    section.scroll_into_view_if_needed()
    assert page.get_by_text("coefficient c_v", exact=False).count()
    assert page.get_by_text("SC's gradient (L1 over the head)", exact=False).count()
    _shot(page, "explore-head-upload")
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Compare").first.click()  # the same session
    _settle(page)
    _no_exceptions(page, "compare with a head")
    page.get_by_text("Head corrections side by side", exact=True).scroll_into_view_if_needed()
    assert page.get_by_text("sc_sampler_head_mass", exact=False).count()
    _shot(page, "compare-head-upload")
    page.close()


def test_a_batch_without_a_head_says_which_corrections_need_one(server, browser):  # noqa: F811
    page = _open(browser, f"{server}/?{SMALL}&ex.sc.gaussian.head_k=0", "explore without a head")  # no head
    note = page.get_by_text("has no sampler head", exact=False)
    note.scroll_into_view_if_needed()
    assert note.count()
    _shot(page, "explore-no-head")
    page.close()
