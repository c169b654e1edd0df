"""Explore's and Compare's head corrections in a real browser (issue 42 item 6): an uploaded vLLM-style JSONL file
with the sampler's top-16 head shows the score-centering section (K a slider, per token the head masses and what SC
adds, one token's head coefficients) and Compare score centering as a column and the centered corrections side by
side; the synthetic batch without a head says which corrections need one. SEQIS_SHOTS=folder keeps the screenshots.
Skips without Playwright or a chromium."""

from __future__ import annotations

import pytest
from test_browser import SMALL, _no_exceptions, _open, _settle, _shot, browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser


def _head_file(tmp_path):
    """A vLLM-style JSONL file: per rollout the sampled tokens' log-probs, an advantage, and per position the
    sampler's top-16 as {token_id: logprob} (vLLM's top_logprobs) beside the trainer's log-probs of those ids."""
    import json

    from seqis.lab.head_lm import HeadLM, head_batch

    batch, _ = head_batch(HeadLM(vocab=256, positions=12, rollouts=8, mismatch=0.5).draw(0), 16)
    ids, logq, logp, _ = batch.head()
    path = tmp_path / "head.jsonl"
    with path.open("w") as f:
        for j in range(batch.shape[0]):
            f.write(json.dumps({
                "trainer_logprobs": batch.trainer_logprobs[j].tolist(),
                "inference_logprobs": batch.inference_logprobs[j].tolist(), "advantages": float(batch.advantages[j]),
                "topk_logprobs": [{str(int(i)): float(v) for i, v in zip(ids[j, t], logq[j, t])} for t in range(12)],
                "topk_trainer_logprobs": logp[j].detach().tolist()}) + "\n")
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
    assert page.get_by_text("score centering: sc_correction", exact=False).count()  # a column beside the others
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


def test_the_sidebar_takes_explores_batch_to_compare(server, browser):  # noqa: F811
    # Streamlit's sidebar navigation kept only some of the batch's knobs in the URL: Compare then showed the default
    # batch, not Explore's (state.keep_view restores the held batch's knobs on arrival)
    page = _open(browser, f"{server}/?{SMALL}", "explore, small")
    assert page.get_by_text("64 rollouts x 512 positions", exact=False).count()
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text="Compare").first.click()
    _settle(page)
    _no_exceptions(page, "compare after the sidebar")
    assert page.get_by_text("ESS 64 of 64", exact=False).count(), "Compare does not show Explore's 64 rollouts"
    assert "ex.sc.gaussian.n_rollouts=64" in page.url
    page.close()
