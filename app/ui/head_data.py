"""The sampler's head in Explore and Compare: which corrections need it, the head cut to the sampler's top K, and per
token what score centering does (its head coefficients, the tail mass, what it adds to the gradient).

Generic on `Batch.has_head`: whatever made the batch (a scenario, a generator, a file with vLLM's top-k log-probs).
Which corrections need a head is asked of the registry (a correction's composition has a `centering` part), never
read off a name; the lab's four (seqis.lab.centering.CORRECTIONS) are offered beside the registry's.

Per token t of a rollout (loss tokens), for one correction with a centering part, A_t the advantage, s_t the
aggregation's normaliser (token-mean: 1 / N):

    base weight      the weight on the sampled token (EstimatorOutput.weights)
    Q_H, P_H         the sampler's and the trainer's mass on the head; tail = 1 - Q_H (the sampler's)
    |c_v| max        the head's largest coefficient (one token's every c_v: slot_table)
    C_t              sum over the head of c_v log p_v (verl's sc_correction, per token)
    SC's gradient    d loss / d log p_v = s_t adv_tau A_t c_v on each head token v: its L1 sum over the head here
"""

from __future__ import annotations

import math
import weakref

import pandas as pd
import torch

from seqis import ESTIMATORS, PRESETS, run
from seqis.core.types import Batch
from seqis.lab.centering import CORRECTIONS
from seqis.registry import lacking, resolve

HEAD_FIELDS = ", ".join(Batch.HEAD)


def centered_corrections() -> dict[str, object]:
    """label -> correction: every registry estimator and preset whose composition has a centering part (asked of
    the registry), then the lab's score-centered compositions under their names."""
    out = {key: key for key in (*ESTIMATORS, *PRESETS) if resolve(key).centering is not None}
    for label, comp in CORRECTIONS.items():
        if comp.centering is not None:
            out[f"lab: {label}"] = comp
    return out


def needs_head_message(batch: Batch) -> str | None:
    """None when the batch has a head; otherwise which corrections need one, and the fields that carry it."""
    if batch.has_head:
        return None
    names = [k for k, v in centered_corrections().items() if isinstance(v, str)]
    listed = ", ".join(f"`{n}`" for n in names) if names else "none in the registry yet"
    return (f"This batch has no sampler head ({HEAD_FIELDS}): score centering cannot run on it. The corrections "
            f"that need one: {listed}; and any composition with a `Centering` part (the lab's: "
            f"{', '.join(k for k, v in CORRECTIONS.items() if v.centering is not None)}). Export the sampler's "
            "top-k log-probs (vLLM's `logprobs=K`, verl's `topk_log_probs`) and the trainer's log-probs of those "
            "tokens to see them.")


def offered(batch: Batch) -> tuple[dict[str, object], dict[str, tuple]]:
    """(the corrections that need a head and that this batch can run, label -> correction; those it cannot, label
    -> the head fields it lacks: an exact variant reads topk_support too)."""
    corrections = centered_corrections()
    lacks = {label: lacking(c, batch) for label, c in corrections.items()}
    return ({label: c for label, c in corrections.items() if not lacks[label]},
            {label: fields for label, fields in lacks.items() if fields})


def warm(batch: Batch, page: str = "explore") -> None:
    """What a page's head section computes on a first view at the whole head (Explore: its first correction's
    evaluation; Compare: every correction's row): the warm-up's call, so the page finds it done."""
    runs, _ = offered(batch) if batch.has_head else ({}, {})
    if runs and page == "explore":
        _centered(batch, next(iter(runs.values())), head_size(batch))
    elif runs:
        summary(batch, runs, head_size(batch))


def head_size(batch: Batch) -> int:
    return int(batch.topk_ids.shape[-1]) if batch.has_head else 0


def top_k(batch: Batch, K: int) -> Batch:
    """The batch with its head cut to the sampler's K most likely tokens at each position (slots ordered by the
    sampler's log-prob; an empty slot counts as -inf). K >= the head's size: the batch as it is."""
    if not batch.has_head:
        raise ValueError(f"top_k needs a batch with the sampler's head ({HEAD_FIELDS})")
    if int(K) < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if int(K) >= head_size(batch):
        return batch
    ids, logq, logp, support = batch.head()
    ranked = torch.where(ids >= 0, logq.detach(), -math.inf).sort(dim=-1, descending=True, stable=True)
    order = ranked.indices[..., : int(K)]  # (B, T, K) the sampler's K most likely slots
    take = lambda x: None if x is None else x.gather(-1, order)
    return Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, batch.loss_mask,
                 metadata=batch.metadata, extras=batch.extras, topk_ids=take(ids), topk_inference_logprobs=take(logq),
                 topk_trainer_logprobs=take(logp), topk_support=take(support))


# the last evaluations, by (id(batch), correction, K): the page's tables and its reruns read one evaluation of
# the whole batch in float64 (a second or two each; the explorer's batches are cached objects: one id while they
# live, checked through a weak reference); _rows keeps Compare's small per-correction rows, many more of them
_memo: dict = {}
_rows: dict = {}
MEMO, ROWS = 8, 256


def _memoized(store: dict, limit: int, batch: Batch, key: tuple, compute):
    hit = store.get((id(batch), *key))
    if hit is not None and hit[0]() is batch:
        return hit[1]
    value = compute()
    store[(id(batch), *key)] = (weakref.ref(batch), value)
    while len(store) > limit:
        store.pop(next(iter(store)))
    return value


def _centered(batch: Batch, correction, K: int):
    """The correction on the batch with its head cut to top K, the head's trainer log-probs a float64 leaf:
    (cut batch, its output, (B, T, K) d loss / d log p_v, what score centering adds to each head token); the last
    MEMO kept."""
    return _memoized(_memo, MEMO, batch, (correction, int(K)), lambda: _evaluate_centered(batch, correction, int(K)))


def _evaluate_centered(batch: Batch, correction, K: int):
    cut = top_k(batch.to("cpu"), K)
    ids, logq, logp, support = cut.head()
    leaf = logp.detach().double().clone().requires_grad_()
    b = Batch(cut.trainer_logprobs.detach(), cut.inference_logprobs, cut.advantages, cut.loss_mask, topk_ids=ids,
              topk_inference_logprobs=logq, topk_trainer_logprobs=leaf, topk_support=support)
    out = run(correction, b)
    (g_head,) = torch.autograd.grad(out.loss, leaf)
    return b, out, g_head


def token_table(batch: Batch, correction, K: int, rollout: int) -> pd.DataFrame:
    """One row per loss token of the rollout: position, l_t, base weight, Q_H, P_H, tail, the largest |c_v|, C_t and
    the L1 of what score centering adds to the gradient over the head (token-mean loss, the head cut to top K)."""
    cut, out, g_head = _centered(batch, correction, K)
    tl = cut.trainer_logprobs
    ids, logq, logp, _ = cut.head()
    j = int(rollout)
    m = cut.loss_mask[j]
    filled = (ids[j] >= 0) & m[:, None]
    q = torch.where(filled, logq[j].double().exp(), 0.0).sum(-1)
    p = torch.where(filled, logp[j].detach().double().exp(), 0.0).sum(-1)
    C = (torch.where(filled, -out.head_weights[j].double() * logp[j].detach().double(), 0.0)).sum(-1)
    pos = torch.nonzero(m).flatten()
    frame = pd.DataFrame({
        "position": pos.numpy(),
        "log-ratio l": (tl[j] - cut.inference_logprobs[j]).double()[pos].numpy(),
        "base weight": out.weights[j].double()[pos].numpy(),
        "sampler head mass Q_H": q[pos].numpy(),
        "trainer head mass P_H": p[pos].numpy(),
        "sampler tail 1 - Q_H": (1 - q[pos]).numpy(),
        "largest coefficient |c_v|": torch.where(filled, out.head_weights[j].double().abs(), 0.0).amax(-1)[pos].numpy(),
        "C_t": C[pos].numpy(),
        "SC's gradient (L1 over the head)": g_head[j].abs().sum(-1)[pos].numpy(),
    })
    return frame


def slot_table(batch: Batch, correction, K: int, rollout: int, position: int) -> pd.DataFrame:
    """One row per head slot of one token: the token id, q_v, p_v, the coefficient c_v (head_weights = -c_v) and
    what score centering adds to d loss / d log p_v there."""
    cut, out, g_head = _centered(batch, correction, K)
    ids, logq, logp, _ = cut.head()
    j, t = int(rollout), int(position)
    filled = ids[j, t] >= 0
    return pd.DataFrame({
        "token id": ids[j, t][filled].numpy(),
        "sampler q_v": logq[j, t].double().exp()[filled].numpy(),
        "trainer p_v": logp[j, t].detach().double().exp()[filled].numpy(),
        "coefficient c_v": (-out.head_weights[j, t].double())[filled].numpy(),
        "d loss / d log p_v": g_head[j, t][filled].numpy(),
    })


def summary(batch: Batch, corrections: dict[str, object], K: int) -> pd.DataFrame:
    """One row per correction at head size K: verl's metrics (sc_correction, the head masses), the sampler's mean
    tail mass, and the L1 of what score centering adds to the gradient over the head, summed over the batch."""
    return pd.DataFrame({label: _memoized(_rows, ROWS, batch, (x, int(K)), lambda x=x: _summary_row(batch, x, K))
                         for label, x in corrections.items()}).T


def _summary_row(batch: Batch, x, K: int) -> dict[str, float]:
    _, out, g_head = _evaluate_centered(batch, x, int(K))
    s = out.scalars()
    return {"K": min(int(K), head_size(batch)), "sc_correction": s["sc_correction"],
            "sc_sampler_head_mass": s["sc_sampler_head_mass"], "sc_train_head_mass": s["sc_train_head_mass"],
            "sampler tail 1 - Q_H": 1 - s["sc_sampler_head_mass"],
            "SC's gradient (L1, whole batch)": float(g_head.abs().sum())}
