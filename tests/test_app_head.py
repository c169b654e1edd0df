"""Explore's and Compare's head corrections (app/ui/head_data.py; issue 42 item 6), on a hand-made batch with a head:
the generator of seqis.lab.head_lm with the sampler's top-32 as its head. The tables are checked against the library
run on a batch built with the smaller head directly, and against the formula's pieces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))

from ui import head_data  # noqa: E402

from seqis import Batch, run  # noqa: E402
from seqis.lab.centering import CORRECTIONS  # noqa: E402
from seqis.lab.head_lm import HeadLM, head_batch  # noqa: E402


def detached(batch: Batch) -> Batch:
    return Batch(batch.trainer_logprobs.detach(), batch.inference_logprobs, batch.advantages, batch.loss_mask,
                 topk_ids=batch.topk_ids, topk_inference_logprobs=batch.topk_inference_logprobs,
                 topk_trainer_logprobs=batch.topk_trainer_logprobs.detach())


@pytest.fixture(scope="module")
def draw():
    return HeadLM(vocab=256, positions=5, rollouts=4, mismatch=0.5).draw(1)


def test_the_head_cut_to_top_k_is_the_sampler_s_top_k(draw):
    big = detached(head_batch(draw, 32)[0])
    cut = head_data.top_k(big, 8)
    small = detached(head_batch(draw, 8)[0])
    assert torch.equal(cut.topk_ids, small.topk_ids)
    torch.testing.assert_close(cut.topk_trainer_logprobs, small.topk_trainer_logprobs)
    assert head_data.top_k(big, 64) is big and head_data.head_size(big) == 32
    with pytest.raises(ValueError, match="K must be >= 1"):
        head_data.top_k(big, 0)


@pytest.mark.parametrize("label", ["SC", "SC + TIS"])
def test_the_token_table_is_the_library_s_output_on_the_smaller_head(draw, label):
    comp = CORRECTIONS[label]
    big = detached(head_batch(draw, 32)[0])
    small, _ = head_batch(draw, 8)
    small = detached(small)
    leaf = small.topk_trainer_logprobs.clone().requires_grad_()
    again = Batch(small.trainer_logprobs, small.inference_logprobs, small.advantages, topk_ids=small.topk_ids,
                  topk_inference_logprobs=small.topk_inference_logprobs, topk_trainer_logprobs=leaf)
    out = run(comp, again)
    (g,) = torch.autograd.grad(out.loss, leaf)
    for j in range(4):
        table = head_data.token_table(big, comp, 8, j)
        assert list(table.position) == list(range(5))
        q = small.topk_inference_logprobs[j].exp().sum(-1)
        torch.testing.assert_close(torch.tensor(table["sampler tail 1 - Q_H"].to_numpy()), 1 - q)
        C = (-out.head_weights[j] * small.topk_trainer_logprobs[j]).sum(-1)
        torch.testing.assert_close(torch.tensor(table["C_t"].to_numpy()), C)
        torch.testing.assert_close(torch.tensor(table["largest coefficient |c_v|"].to_numpy()),
                                   out.head_weights[j].abs().amax(-1).double())
        torch.testing.assert_close(torch.tensor(table["SC's gradient (L1 over the head)"].to_numpy()),
                                   g[j].abs().sum(-1))
        # the formula's pieces: d loss / d log p_v = A / N c_v (token-mean), c_v = -head_weights
        torch.testing.assert_close(g[j], -out.head_weights[j] * small.advantages[j] / 20)
    slots = head_data.slot_table(big, comp, 8, 2, 3)
    assert list(slots["token id"]) == small.topk_ids[2, 3].tolist()
    torch.testing.assert_close(torch.tensor(slots["d loss / d log p_v"].to_numpy()), g[2, 3])


def test_a_batch_without_a_head_says_which_corrections_need_one(draw):
    bare = Batch(draw["log_p"][..., 0], draw["log_q"][..., 0], draw["advantages"])
    msg = head_data.needs_head_message(bare)
    assert "topk_ids, topk_inference_logprobs, topk_trainer_logprobs" in msg and "SC + TIS" in msg
    assert head_data.needs_head_message(detached(head_batch(draw, 4)[0])) is None
    from seqis.registry import resolve

    offered = head_data.centered_corrections()
    assert "lab: SC" in offered and "lab: none" not in offered
    for key, x in offered.items():  # every one asked of the registry has a centering part
        assert resolve(x).centering is not None, key


# ---------------------------------------------------------------------------------------------------------
# the pages: an uploaded file with a head, and a synthetic batch without one


def _upload(tmp_path, draw):
    from pages import APP
    from streamlit.testing.v1 import AppTest

    from seqis.io import save_batch

    path = tmp_path / "head.npz"
    save_batch(detached(head_batch(draw, 16)[0]), path, layout="padded")
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["ex.source"] = "upload"
    at.run()
    at.file_uploader[0].upload("head.npz", path.read_bytes()).run()
    next(b for b in at.button if b.key == "dg.open.explore").click().run()  # Diagnose first, then Explore
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_explore_shows_an_uploaded_head_s_corrections_with_k_as_a_knob(tmp_path, draw):
    at = _upload(tmp_path, draw)
    assert any(s.value == "The sampler's head: score centering" for s in at.subheader)
    assert at.slider(key="ex.head.k").value == 16
    tables = [t.value for t in at.table]
    per_token = next(t for t in tables if "C_t" in t.columns)
    head = next(t for t in tables if "coefficient c_v" in t.columns)
    assert len(head) == 16 and len(per_token) == 5
    at.slider(key="ex.head.k").set_value(4).run()
    assert not at.exception
    head = next(t.value for t in at.table if "coefficient c_v" in t.value.columns)
    assert len(head) == 4  # the head cut to the sampler's top 4
    at.switch_page("views/compare.py").run()  # Compare, on the same batch: the head corrections side by side
    assert not at.exception, [e.value for e in at.exception]
    side = next(t.value for t in at.table if "sc_correction" in t.value.columns)
    assert {"lab: SC", "lab: SC + TIS"} <= set(side.index) and set(side["K"]) == {"16"}


def test_explore_without_a_head_says_which_corrections_need_one():
    from pages import explore

    at = explore(**{"ex.sc.gaussian.head_k": "0"})  # a synthetic batch without its head
    assert any("has no sampler head" in i.value and "topk_ids" in i.value for i in at.info)
