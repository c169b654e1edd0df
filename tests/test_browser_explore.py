"""Explore and Compare in a real browser, for what only a browser shows: a knob moved with the keyboard (a fragment
rerun) reaches the files the download buttons save; on the rollout maps the colour key, the notes and the band
labels never overlap and a map's header is never cut, at 900 and 1600 px with six estimators; tables fit or scroll
in their own box (never cut); numbers print in the page's format (a chi-square of 1e+24 in scientific notation,
no number of ten digits with commas, none below 0); and refused uploads say what is wrong with the file.

Skips without Playwright or a chromium, as tests/test_browser.py does.
"""

from __future__ import annotations

import re

import pytest
from test_browser import _no_exceptions, _settle, _shot, browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser
SMALL = "ex.sc.gaussian.n_rollouts=64&ex.sc.gaussian.max_len=512"
SIX = "ex.est=seq_tis,seq_mis,geo_mask,mis_po,pg,token_tis"

# per rollout map: the boxes (x0, y0, x1, y1, in page px) of its chart, header, notes, band labels and colour key
BOXES = """() => Array.from(document.querySelectorAll('.seqis-chart')).slice(0, N).map(c => {
  const box = n => { const r = n.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const notes = Array.from(c.querySelectorAll('g.annotation')).map(a => [a.textContent, box(a)]);
  const title = c.querySelector('.gtitle'), sub = c.querySelector('.gtitle-subtitle');
  const key = c.querySelector('g.legend') || c.querySelector('g.colorbar');
  return {chart: box(c), title: title ? box(title) : null, subtitle: sub ? box(sub) : null,
          subtitle_text: sub ? sub.textContent : '', notes, key: key ? box(key) : null};
})"""


def overlap(a, b) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def maps(page, n: int) -> list[dict]:
    page.wait_for_function(f"document.querySelectorAll('.seqis-chart .main-svg').length >= {n}", timeout=90_000)
    page.wait_for_timeout(500)
    return page.evaluate(BOXES.replace("N", str(n)))


def open_page(browser, url: str, width: int, where: str, height: int = 1000):  # noqa: F811
    """A page at url, settled, with no exception element (a tall window draws every chart: a chart far below the
    visible part waits to be scrolled near)."""
    page = browser.new_page(viewport={"width": width, "height": height}, accept_downloads=True)
    page.goto(url)
    _settle(page, 240)  # the other tests' sessions may still hold the server's cores
    _no_exceptions(page, where)
    return page


def download(page, label: str) -> str:
    with page.expect_download(timeout=60_000) as d:
        page.locator('[data-testid="stMain"] button').filter(has_text=label).first.click()
    return open(d.value.path(), encoding="utf-8").read()


def test_a_knob_moved_with_the_keyboard_reaches_the_downloads(server, browser):  # noqa: F811
    page = open_page(browser, f"{server}/?{SMALL}", 1600, "explore")
    thumb = page.locator('[data-testid="stMain"] input[type="range"][aria-label="seq_clip"]').first
    thumb.focus()
    for _ in range(5):  # 2 -> 2.5 -> 3 -> 4 -> 5 -> 6
        thumb.press("ArrowRight")
        page.wait_for_timeout(200)
    _settle(page)
    # Streamlit's binding (bind="query-params") writes the move into the URL as the slider shows it; the URL, opened
    # afresh, draws the slider there
    assert re.search(r"[?&]ex\.seq_tis\.seq_clip=6(&|$)", page.url), page.url
    again = open_page(browser, page.url, 1600, "explore from the moved slider's URL")
    moved = again.locator('[data-testid="stMain"] [data-testid="stSlider"]').filter(has_text="seq_clip").first
    assert moved.locator('[data-testid="stSliderThumbValue"]').first.inner_text().strip() == "6"
    again.close()
    toml = download(page, "Download seq_tis")
    assert "sequence_clip_high = 6.0" in toml
    csv = download(page, "Metrics CSV")
    row = next(line for line in csv.splitlines() if line.startswith("metric,seq_tis,is_clipped,"))
    cell = page.locator('[data-testid="stTable"]').first.locator("tr", has_text="is_clipped").locator("td").first
    assert float(row.rsplit(",", 1)[1]) == pytest.approx(float(cell.inner_text()), rel=1e-3, abs=1e-9)
    # the export's code, drawn when its popover opens (a move redraws no button and no code): these knobs
    page.locator('[data-testid="stMain"] button').filter(has_text="Show seq_tis").first.click()
    code = page.locator('[data-testid="stPopoverBody"] [data-testid="stCode"]')
    code.wait_for(timeout=30_000)
    assert "sequence_clip_high = 6.0" in code.inner_text()
    page.close()


def advice_line(page, name: str) -> str:
    """The advice's line on `name` ("`name` keeps 97% of the tokens, accepts ...")."""
    text = page.locator('[data-testid="stExpander"]').filter(has_text="What this means").inner_text()
    return next(line for line in text.splitlines() if line.startswith(f"{name} keeps"))


def test_the_open_advice_follows_a_knob_and_a_closed_one_waits(server, browser):  # noqa: F811
    """Closed (a scenario's start), the advice is not drawn, and a move does not draw it; opened (a page rerun),
    it reads the knobs, and a move (a fragment rerun) redraws it with the library's numbers."""
    from seqis import ESTIMATORS, run_many
    from seqis.diagnosis.summaries import effective_batch
    from seqis.samplers.scenarios import make_batch

    page = open_page(browser, f"{server}/?{SMALL}", 1600, "explore")
    advice = page.locator('[data-testid="stExpander"]').filter(has_text="What this means")
    assert "Start with" not in advice.inner_text()
    thumb = page.locator('[data-testid="stMain"] input[type="range"][aria-label="geo_mask_high"]').first  # seq_mis's
    thumb.focus()
    thumb.press("ArrowLeft")
    _settle(page)
    assert "Start with" not in advice.inner_text()
    advice.locator("summary").click()
    page.locator('[data-testid="stExpander"] [data-testid="stMarkdownContainer"]').filter(
        has_text="Start with").first.wait_for(timeout=30_000)
    _settle(page)
    before = advice_line(page, "seq_mis")
    thumb.focus()
    for _ in range(6):  # seq_mis's gate's top edge down to 1.0: rollouts above it are rejected
        thumb.press("ArrowLeft")
        page.wait_for_timeout(200)
    _settle(page)
    after = advice_line(page, "seq_mis")
    high = float(re.search(r"ex\.seq_mis\.geo_mask_high=([0-9.]+)", page.url).group(1))
    cfg = ESTIMATORS["seq_mis"].config(geo_mask_high=high)
    eff = effective_batch(run_many([("seq_mis", cfg)], make_batch("gaussian", n_rollouts=64, max_len=512,
                                                                  seed=0))["seq_mis"])
    assert after != before, (before, after)
    assert f"keeps {eff['tokens_kept_frac']:.0%} of the tokens, accepts {eff['rollouts_kept_frac']:.0%}" in after
    page.close()


def test_the_page_asks_no_other_host_and_a_knob_move_fetches_no_file(server, browser):  # noqa: F811
    # found: the favicon as a material icon was fetched from fonts.gstatic.com on every run (the explorer runs
    # offline, and a person's browser told Google of each move), and the export snippet's download button, given
    # its text, made the browser fetch that text from /media after every knob move
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.goto(f"{server}/?{SMALL}")
    _settle(page, 240)
    _no_exceptions(page, "explore")
    thumb = page.locator('[data-testid="stMain"] input[type="range"][aria-label="seq_clip"]').first
    before = len(asked)
    thumb.focus()
    for _ in range(3):
        thumb.press("ArrowRight")
        page.wait_for_timeout(300)
    _settle(page)
    moved = asked[before:]
    assert "ex.seq_tis.seq_clip=" in page.url  # the moves ran
    other = [u for u in asked if not u.startswith((server, "data:", "blob:"))]
    assert not other, other
    assert not [u for u in moved if "/media/" in u], moved
    page.close()


@pytest.mark.parametrize("width", [900, 1600])
@pytest.mark.parametrize("color", ["reward", "group_id"])  # a legend of its values; a colour bar
def test_the_maps_colour_key_notes_and_band_labels_never_overlap(server, browser, width, color):  # noqa: F811
    page = open_page(browser, f"{server}/?{SMALL}&{SIX}&ex.color={color}", width, "explore, coloured", 6000)
    for m in maps(page, 6):
        chart = m["chart"]
        assert m["title"] and m["title"][2] <= chart[2] + 1, m  # the header: whole, inside its chart
        assert m["subtitle"] and m["subtitle"][2] <= chart[2] + 1 and "rejected" in m["subtitle_text"], m
        texts = [(t, b) for t, b in m["notes"] if t.strip()]
        for i, (ta, a) in enumerate(texts):
            for tb, b in texts[i + 1:]:
                assert not overlap(a, b), (ta, tb, width)
            if m["key"] is not None:
                assert not overlap(a, m["key"]), (ta, "colour key", width)
    _shot(page, f"explore-colour-{color}-{width}")
    page.close()


def test_band_labels_stay_apart_where_the_bands_are_close(server, browser):  # noqa: F811
    # on the catastrophic batch a map's S/T axis spans a wide range: mis_po's trajectory band [0.996, 1.001] is
    # a few px tall, and its labels printed on top of each other
    url = f"{server}/?ex.scenario=catastrophic&ex.sc.catastrophic.n_rollouts=64&ex.sc.catastrophic.max_len=512" \
          f"&ex.est=mis_po,geo_mask"
    page = open_page(browser, url, 900, "explore, catastrophic")
    (mis_po, _) = maps(page, 2)
    labels = [(t, b) for t, b in mis_po["notes"] if t in ("1.001", "0.996")]
    assert len(labels) == 2, mis_po["notes"]
    assert not overlap(labels[0][1], labels[1][1]), labels
    page.close()


def _cells(page) -> list[str]:
    return page.evaluate("() => Array.from(document.querySelectorAll('[data-testid=\"stMain\"] td, "
                         "[data-testid=\"stMain\"] th')).map(c => c.innerText)")


def test_numbers_print_in_the_pages_format(server, browser):  # noqa: F811
    url = f"{server}/?ex.scenario=catastrophic&ex.sc.catastrophic.n_rollouts=64&ex.sc.catastrophic.max_len=512"
    page = open_page(browser, url, 1600, "explore, catastrophic")
    cells = _cells(page)
    long = [c for c in cells if re.search(r"\d{1,3}(,\d{3}){3,}", c)]
    assert not long, long  # a billion and more prints as 1e+09, not with commas
    row = page.locator('[data-testid="stTable"]').filter(has_text="chi2_seq").locator("tr", has_text="chi2_seq")
    assert re.fullmatch(r"\d\.\d+e\+\d+", row.locator("td").first.inner_text().strip()), row.inner_text()
    chi2 = [r for r in page.locator("tr", has_text="chi2").all_inner_texts()]
    assert chi2 and not any(re.search(r"chi2\S*\s+-", r) for r in chi2), chi2  # never below 0
    page.close()


@pytest.mark.parametrize("width", [900, 1600])
def test_tables_fit_or_scroll_never_cut(server, browser, width):  # noqa: F811
    for url in (f"{server}/?{SMALL}&ex.est=seq_tis,seq_mis,geo_mask,mis_po,pg,token_tis,icepop,max_mask",
                f"{server}/compare?{SMALL}&cmp.picks=verl/decoupled_token_is,trl/sequence_mask,prime-rl/default,"
                "nemo-rl/tis,skyrl/geo_mask"):
        page = open_page(browser, url, width, url, 4000)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stTable\"]').length >= 3",
                               timeout=240_000)
        boxes = page.evaluate("""() => Array.from(document.querySelectorAll('[data-testid="stTable"]')).map(t => {
            const table = t.querySelector('table'), box = table.parentElement;
            return {table: table.scrollWidth, box: box.clientWidth, overflow: getComputedStyle(box).overflowX,
                    outer: t.getBoundingClientRect().right, main:
                    document.querySelector('[data-testid="stMain"]').getBoundingClientRect().right};
        })""")
        assert boxes, url
        for b in boxes:
            assert b["table"] <= b["box"] + 1 or b["overflow"] in ("auto", "scroll"), b  # fits, or scrolls
            assert b["outer"] <= b["main"] + 1, b  # its box stays inside the page
        _shot(page, f"tables-{width}-{'compare' if 'compare' in url else 'explore'}")
        page.close()


def test_refused_uploads_say_what_is_wrong_with_the_file(server, browser, tmp_path):  # noqa: F811
    import pandas as pd

    from seqis.io import save_batch
    from seqis.samplers.scenarios import make_batch

    save_batch(make_batch("gaussian", n_rollouts=12, max_len=40, seed=2), tmp_path / "b.parquet")
    good = (tmp_path / "b.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(good[: len(good) // 2])
    (tmp_path / "renamed.parquet").write_bytes(b"\x80\x04K\x01." * 20)
    df = pd.read_parquet(tmp_path / "b.parquet")
    values = [list(v) for v in df["trainer_logprobs"]]
    values[2][5] = float("nan")
    df["trainer_logprobs"] = values
    df.to_parquet(tmp_path / "nan.parquet")
    page = open_page(browser, f"{server}/?ex.source=upload&{SMALL}", 1600, "explore, upload")
    for name, said in (("cut.parquet", "cut.parquet: is truncated"),
                       ("renamed.parquet", "renamed.parquet: is a Python pickle"),
                       ("nan.parquet", "row 2, token 5: column 'trainer_logprobs' is null or NaN")):
        page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(tmp_path / name))
        _settle(page)
        error = page.locator('[data-testid="stAlertContentError"]').first.inner_text()
        assert said in error, error
        assert "Column mapping" not in error, error  # not a column problem: no mapping hint
        _no_exceptions(page, name)
    page.close()


def test_compare_shows_three_frameworks_presets(server, browser):  # noqa: F811
    page = open_page(browser, f"{server}/compare?{SMALL}", 1600, "compare")
    main = page.locator('[data-testid="stMain"]')
    main.get_by_text("Where they disagree on this batch", exact=True).wait_for(timeout=240_000)
    for name in ("decoupled_token_is", "sequence_mask", "default"):
        assert main.get_by_text(name, exact=False).count()
    assert main.get_by_text("Where they disagree on this batch", exact=True).count()
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stCode\"]').length >= 3", timeout=240_000)
    assert page.locator('[data-testid="stCode"]').count() >= 3  # each column's exported config
    text = download(page, "Download trl_sequence_mask")
    assert "GRPOConfig(" in text
    _shot(page, "compare-wide")
    page.close()


@pytest.mark.parametrize("width", [900, 1600])
def test_the_weights_legend_and_titles_never_overlap_with_eight_estimators(server, browser, width):  # noqa: F811
    est = "seq_tis,seq_mis,geo_mask,mis_po,pg,token_tis,icepop,max_mask"
    page = open_page(browser, f"{server}/?{SMALL}&ex.est={est}", width, "explore, eight", 9000)
    page.wait_for_function("Array.from(document.querySelectorAll('.seqis-chart')).some(c => "
                           "c.textContent.includes('what survives') && c._fullLayout)", timeout=240_000)
    got = page.evaluate("""() => {
      const c = Array.from(document.querySelectorAll('.seqis-chart'))
        .find(c => c.textContent.includes('what survives'));
      const box = n => { const r = n.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
      return {chart: box(c), legend: box(c.querySelector('g.legend')),
              texts: Array.from(c.querySelectorAll('g.annotation, g.xtick text, g.ytick text, g.x2tick text, '
                                                    + 'g.y2tick text')).map(n => [n.textContent, box(n)]),
              plots: Array.from(c.querySelectorAll('g.cartesianlayer > g.subplot > .bglayer rect, '
                                                   + 'rect.nsewdrag')).map(box)};
    }""")
    legend = got["legend"]
    for text, b in got["texts"]:
        assert not overlap(legend, b), (text, width)
    for b in got["plots"]:
        assert not overlap(legend, b), ("a plot", width)
    labels = [(t, b) for t, b in got["texts"] if t.strip()]
    for i, (ta, a) in enumerate(labels):  # tick labels and titles: none on another
        for tb, b in labels[i + 1:]:
            assert not overlap(a, b), (ta, tb, width)
    cut = [(t, b) for t, b in labels if b[2] > got["chart"][2] + 1]
    assert not cut, (cut, got["chart"], width)  # nothing cut at the chart's right edge
    page.close()


COUNT_DRAWS = """() => { const P = window.Plotly, react = P.react;
  P.react = function (node, ...rest) {
    node.__draws = (node.__draws || 0) + 1;
    return react.call(this, node, ...rest);
  };
}"""
DRAWS = """() => Array.from(document.querySelectorAll('.seqis-chart')).map(n => ({
  draws: n.__draws || 0, heatmap: !!(n.data && n.data.some(t => t.type === 'heatmap')),
  title: (n.layout && n.layout.title && n.layout.title.text) || ''}))"""


def test_a_knob_move_redraws_the_charts_it_changes_and_no_other(server, browser):  # noqa: F811
    # a rerun sends every chart of the fragment again; one whose figure did not change (the heatmap shades what
    # seq_tis drops, and seq_mis moved) is neither parsed nor drawn again: a Plotly.react of a 256 x 128 heatmap
    # is tens of ms of the browser's main thread
    page = open_page(browser, f"{server}/?{SMALL}", 1600, "explore", height=6000)  # every chart near: all drawn
    page.wait_for_function("document.querySelectorAll('.seqis-chart .main-svg').length >= 7", timeout=90_000)
    page.evaluate(COUNT_DRAWS)
    thumb = page.locator('[data-testid="stMain"] input[type="range"][aria-label="geo_mask_high"]').first
    thumb.focus()
    thumb.press("ArrowRight")
    _settle(page)
    assert "ex.seq_mis.geo_mask_high=" in page.url  # the move ran (seq_mis's is the first such knob)
    charts = page.evaluate(DRAWS)
    heat = [c for c in charts if c["heatmap"]]
    assert len(heat) == 1 and heat[0]["draws"] == 0, charts
    moved = [c for c in charts if c["title"] == "<b>seq_mis</b>"]
    assert len(moved) == 1 and moved[0]["draws"] >= 1, charts  # its band moved: drawn again
    page.close()
