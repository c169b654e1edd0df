"""From columns to a Batch: the layout (rows, padded, packed), the roles, and every refusal of bad values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.types import Batch
from . import head
from .columns import (
    ALIASES,
    LOGPROB_TOLERANCE,
    BatchFormatError,
    _Const,
    _Dense,
    _is_number,
    _Objects,
    _Ragged,
    _short,
    _Unusable,
)
from .readers import _Source

# ---------------------------------------------------------------------------------------------------------
# from columns to a Batch


@dataclass
class _Layout:
    kind: str  # "rows", "padded" or "packed"
    lengths: torch.Tensor  # (B,) int64, tokens per rollout
    ref: str  # the trainer column's name, for messages
    shape: tuple = ()  # the trainer column's shape (padded, packed)
    pos: torch.Tensor | None = field(default=None, repr=False)  # (B, T) bool, position < length

    @property
    def B(self) -> int:
        return self.lengths.numel()

    @property
    def T(self) -> int:
        return int(self.lengths.max()) if self.B else 0


def _first(bad: torch.Tensor) -> tuple[int, int]:
    """(row, token) of the first True in a (B, T) bool tensor."""
    i = int(torch.argmax(bad.reshape(-1).view(torch.uint8)))
    return divmod(i, bad.shape[1])


def _resolve(names: list[str], columns: dict | None) -> dict[str, str | None]:
    given: dict[str, str] = {}
    for k, v in (columns or {}).items():
        if k in ALIASES:
            given[k] = v
        elif isinstance(v, str) and v in ALIASES:  # {"my_lp": "trainer_logprobs"} works too
            given[v] = k
        else:
            raise BatchFormatError(f"columns={columns!r}: {k!r} is not a role; roles: {', '.join(ALIASES)}")
    present = set(names)
    roles = {}
    for role, aliases in ALIASES.items():
        if role in given:
            if given[role] not in present:
                raise BatchFormatError(f"column {given[role]!r} (given for {role}) is not in the file; "
                                       f"columns present: {_listing(names)}")
            roles[role] = given[role]
        elif role in present:  # seqis's own name wins over the frameworks'
            roles[role] = role
        else:  # a column mapped to another role is not a candidate here
            found = [a for a in aliases if a in present and a not in given.values()]
            if len(found) > 1:
                raise BatchFormatError(f"columns {found[0]!r} and {found[1]!r} are both a {_role(role)} column, as "
                                       f"two frameworks name it (pass columns={{'{role}': <name>}} to say which)")
            roles[role] = found[0] if found else None
    return roles


def _role(role: str) -> str:
    return role.replace("_", " ")


def _listing(names) -> str:
    names = list(names)
    s = ", ".join(repr(n) for n in names[:30])
    return (s + f", ... ({len(names)} in all)" if len(names) > 30 else s) or "(none)"


def _looked(role: str) -> str:
    return " / ".join(repr(a) for a in ALIASES[role])


def _missing(role: str, names) -> BatchFormatError:
    looked = ", ".join(repr(a) for a in ALIASES[role])
    return BatchFormatError(f"no {_role(role)} column: looked for {looked} (pass "
                            f"columns={{'{role}': <name>}} for another name); columns present: {_listing(names)}")


def _numbers(col, name: str) -> torch.Tensor:
    """A column that must be numbers, as a tensor."""
    if isinstance(col, _Dense):
        return col.tensor
    if isinstance(col, _Objects):
        for r, v in enumerate(col.values):
            if not _is_number(v):
                raise BatchFormatError(f"row {r}: column '{name}' "
                                       + ("is null" if v is None else f"holds a non-numeric value {_short(v)}"))
        return torch.tensor([float(v) for v in col.values], dtype=torch.float64)
    if isinstance(col, _Const):
        raise BatchFormatError(f"column '{name}' is a single value {_short(col.value)}, not numbers")
    if isinstance(col, _Unusable):
        raise BatchFormatError(col.reason if name in col.reason else f"column '{name}' {col.reason}")
    raise BatchFormatError(f"column '{name}' holds one list per row; expected one number per rollout")


def _layout(src: _Source, roles: dict, tl, tl_name: str) -> _Layout:
    if isinstance(tl, _Ragged):
        return _Layout("rows", tl.lengths, tl_name)
    t = _numbers(tl, tl_name)
    if t.numel() == 0:
        if t.dim() == 2 and t.shape[0] > 0:
            raise BatchFormatError(f"no tokens: column '{tl_name}' has shape {tuple(t.shape)}")
        raise BatchFormatError(f"no rollouts: column '{tl_name}' is empty")
    split = roles["seq_lens"] or roles["position_ids"]
    if t.dim() == 2 and not (t.shape[0] == 1 and split):
        B, T = t.shape
        return _Layout("padded", torch.full((B,), T, dtype=torch.int64), tl_name, tuple(t.shape))
    if t.dim() not in (1, 2):
        raise BatchFormatError(f"column '{tl_name}' has shape {tuple(t.shape)}; expected one list per row, "
                               f"[B, T] or a packed 1-D micro-batch")
    if not split:
        raise BatchFormatError(
            f"column '{tl_name}' is 1-D ({t.numel()} values) but there is no 'position_ids' or 'seq_lens' "
            f"to split it into rollouts (a single rollout? store it as one row: [{{...}}] or shape [1, T])")
    N = t.numel()
    s = _numbers(_get(src, split), split)
    if s.is_floating_point() or s.dtype == torch.bool:
        raise BatchFormatError(f"column '{split}' must hold integers, got {str(s.dtype).replace('torch.', '')}")
    s = s.reshape(-1).to(torch.int64)
    if split == roles["seq_lens"]:
        if (s < 0).any():
            raise BatchFormatError(f"row {int(torch.argmax((s < 0).view(torch.uint8)))}: column '{split}' is negative")
        if int(s.sum()) != N:
            raise BatchFormatError(f"column '{split}' sums to {int(s.sum())} but '{tl_name}' has {N} tokens")
        lengths = s
    else:
        if s.numel() != N:
            raise BatchFormatError(f"column '{split}' has {s.numel()} values but '{tl_name}' has {N}")
        if N and int(s[0]) != 0:
            raise BatchFormatError(f"column '{split}' must start at 0 (each rollout restarts at 0), got {int(s[0])}")
        start = s == 0  # (N,)
        step_ok = start[1:] | (s[1:] == s[:-1] + 1)  # (N - 1,)
        if not bool(step_ok.all()):
            i = int(torch.argmax((~step_ok).view(torch.uint8))) + 1
            raise BatchFormatError(f"column '{split}' jumps from {int(s[i - 1])} to {int(s[i])} at token {i}: "
                                   f"positions restart at 0 for each rollout and count up by 1")
        starts = torch.nonzero(start).flatten()  # (B,)
        lengths = torch.diff(starts, append=torch.tensor([N]))
    return _Layout("packed", lengths, tl_name, tuple(t.shape))


EXTRAS = {"entropy": (torch.float32, float("nan")), "token_ids": (torch.int64, -1)}  # name: dtype, past the end


def _positions(lay: _Layout):
    """Set lay.pos, the (B, T) positions inside each rollout; None when every rollout fills T."""
    if lay.B and not bool((lay.lengths == lay.T).all()):
        lay.pos = torch.arange(lay.T)[None, :] < lay.lengths[:, None]  # (B, T)


def _tokens(col, name: str, lay: _Layout) -> torch.Tensor:
    """A token-level column as a (B, T) tensor, zero past each rollout's end."""
    B, T = lay.B, lay.T
    if isinstance(col, _Dense) and lay.kind == "rows" and col.tensor.dim() == 2 and col.tensor.shape[0] == B:
        n = col.tensor.shape[1]  # a padded column next to ragged ones: rows of n values each
        col = _Ragged(col.tensor.reshape(-1), torch.full((B,), n, dtype=torch.int64), col.owned)
    if isinstance(col, _Ragged):
        if lay.kind == "packed" or col.lengths.numel() != B:
            what = f"{col.lengths.numel()} rows" if lay.kind != "packed" else "one list per row"
            raise BatchFormatError(f"column '{name}' has {what} but '{lay.ref}' has "
                                   + (f"{B} rows" if lay.kind != "packed" else f"shape {lay.shape}"))
        if lay.kind == "padded" and bool((col.lengths != T).any()):
            r = int(torch.argmax((col.lengths != T).view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{name}' has {int(col.lengths[r])} values but '{lay.ref}' "
                                   f"has {T}")
        differ = col.lengths != lay.lengths  # (B,)
        if lay.kind == "rows" and bool(differ.any()):
            r = int(torch.argmax(differ.view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{name}' has {int(col.lengths[r])} values but '{lay.ref}' "
                                   f"has {int(lay.lengths[r])}")
        flat, owned = col.values, col.owned
    else:
        t = _numbers(col, name)
        if lay.kind == "padded":
            if tuple(t.shape) != lay.shape:
                raise BatchFormatError(f"column '{name}' has shape {tuple(t.shape)} but '{lay.ref}' has "
                                       f"shape {lay.shape}")
            return t if col.owned else t.clone()
        if lay.kind == "rows" or t.numel() != int(lay.lengths.sum()) or t.dim() > 2 or (
                t.dim() == 2 and t.shape[0] != 1):
            raise BatchFormatError(f"column '{name}' has shape {tuple(t.shape)} but '{lay.ref}' has "
                                   + (f"{B} rows of lists" if lay.kind == "rows" else f"shape {lay.shape}"))
        flat, owned = t.reshape(-1), col.owned
    if lay.pos is None:  # every row is full: a reshape
        out = flat.view(B, T)
        return out if owned else out.clone()
    out = torch.zeros(B, T, dtype=flat.dtype)  # (B, T)
    return out.masked_scatter_(lay.pos, flat)


def _float(x: torch.Tensor, text: bool) -> torch.Tensor:
    """Log-probs and advantages as float32, or float64 when a binary file stores float64."""
    return x.to(torch.float64 if x.dtype == torch.float64 and not text else torch.float32)


def _check_finite_tokens(x: torch.Tensor, mask: torch.Tensor, name: str, logprob: bool):
    bad = torch.isfinite(x).logical_not_().logical_and_(mask)  # (B, T), in place: no extra temporaries
    if bool(bad.any()):
        r, t = _first(bad)
        raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {float(x[r, t])} on a loss token")
    if logprob:
        pos = (x > LOGPROB_TOLERANCE).logical_and_(mask)  # (B, T)
        if bool(pos.any()):
            r, t = _first(pos)
            raise BatchFormatError(f"row {r}, token {t}: column '{name}' is {float(x[r, t]):.6g} on a loss token; "
                                   f"a log-probability is at most 0 (up to {LOGPROB_TOLERANCE:g} for rounding)")


def require_loss_tokens(batch: Batch) -> None:
    """BatchFormatError when no token of the batch carries loss: nothing to estimate or diagnose."""
    if not bool(batch.loss_mask.any()):
        B = batch.shape[0]
        raise BatchFormatError(f"no loss tokens: the loss mask is 0 on every token of its {B} rollout"
                               f"{'s' if B != 1 else ''} (prompts or padding only); nothing to estimate or diagnose")


def check_batch(batch: Batch, names: dict[str, str] | None = None) -> None:
    """Refuse a Batch that load_batch would refuse if it came from a file, with the loader's messages: no
    rollouts or positions, no loss tokens, a log-prob that is not finite or above LOGPROB_TOLERANCE on a loss
    token, an advantage that is not finite where it counts. names: field -> the name to cite (default: the
    field's own). Raises BatchFormatError (a ValueError)."""
    names = names or {}
    B, T = batch.shape
    tl_name = names.get("trainer_logprobs", "trainer_logprobs")
    if B == 0:
        raise BatchFormatError(f"no rollouts: '{tl_name}' is empty")
    if T == 0:
        raise BatchFormatError(f"no loss tokens: every rollout in '{tl_name}' is empty")
    require_loss_tokens(batch)
    m = batch.loss_mask
    for role in ("trainer_logprobs", "inference_logprobs"):
        _check_finite_tokens(getattr(batch, role).detach(), m, names.get(role, role), logprob=True)
    adv, adv_name = batch.advantages.detach(), names.get("advantages", "advantages")
    if adv.dim() == 2:
        _check_finite_tokens(adv, m, adv_name, logprob=False)
    else:
        bad = m.any(-1) & ~torch.isfinite(adv)  # (B,) rollouts with a loss token
        if bool(bad.any()):
            r = int(torch.argmax(bad.view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{adv_name}' is {float(adv[r])}")


def _get(src: _Source, name: str):
    try:
        return src.load(name)
    except BatchFormatError:
        raise
    except Exception as e:  # a reader's own error on a damaged file
        raise BatchFormatError(f"column '{name}' could not be read ({type(e).__name__}: {e})") from None


def _scalar(v):
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple, dict)):
        try:
            return json.dumps(v, default=str)
        except (TypeError, ValueError, RecursionError):
            pass
    return str(v)


def _metadata_column(col, lay: _Layout) -> list | None:
    B = lay.B
    if isinstance(col, _Dense):
        t = col.tensor
        if t.is_floating_point() and t.dtype != torch.float64:
            t = t.to(torch.float64)
        if t.dim() == 0:
            return [t.item()] * B
        if tuple(t.shape) in ((B,), (B, 1)):
            return t.reshape(B).tolist()
        return None
    if isinstance(col, _Objects) and len(col.values) == B:
        return [_scalar(v) for v in col.values]
    if isinstance(col, _Const):
        return [_scalar(col.value)] * B
    return None


def _assemble(src: _Source, columns: dict | None) -> Batch:
    names = src.names
    seen = set()
    for n in names:
        if n in seen:
            raise BatchFormatError(f"column '{n}' appears twice")
        seen.add(n)
    roles = _resolve(names, columns)
    for req in ("trainer_logprobs", "inference_logprobs"):
        if roles[req] is None:
            raise _missing(req, names)
    adv_name, reward_name, gid_name = roles["advantages"], roles["reward"], roles["group_id"]
    if adv_name is None and (reward_name is None or gid_name is None):
        if reward_name is not None:
            raise BatchFormatError(f"column '{reward_name}' needs a group column to form GRPO groups (advantage "
                                   f"= reward - group mean): looked for {_looked('group_id')}; columns present: "
                                   f"{_listing(names)}")
        raise BatchFormatError(f"no advantages: looked for {_looked('advantages')}, or {_looked('reward')} with "
                               f"{_looked('group_id')} (pass columns={{'advantages': <name>}} for another name); "
                               f"columns present: {_listing(names)}")

    tl_name, il_name, mask_name = roles["trainer_logprobs"], roles["inference_logprobs"], roles["loss_mask"]
    tl_col = _get(src, tl_name)
    lay = _layout(src, roles, tl_col, tl_name)
    _positions(lay)
    B, T = lay.B, lay.T
    if B == 0:
        raise BatchFormatError(f"no rollouts: column '{tl_name}' is empty")
    if T == 0:
        raise BatchFormatError(f"no loss tokens: every rollout in column '{tl_name}' is empty")

    # the mask first (small), then each log-prob column padded and checked before the next is read
    if mask_name is not None:
        m = _tokens(_get(src, mask_name), mask_name, lay)  # (B, T)
        if m.dtype != torch.bool:
            notbin = (m != 0) & (m != 1)  # (B, T), NaN included
            if lay.pos is not None:
                notbin &= lay.pos
            if bool(notbin.any()):
                r, t = _first(notbin)
                raise BatchFormatError(f"row {r}, token {t}: column '{mask_name}' is {m[r, t].item()}; a mask holds "
                                       f"0/1 or true/false")
            m = m != 0
        loss_mask = m if lay.pos is None else m & lay.pos
    else:
        loss_mask = lay.pos.clone() if lay.pos is not None else torch.ones(B, T, dtype=torch.bool)
    if roles["sample_mask"] is not None:  # NeMo-RL's loss reads token_mask * sample_mask: a 0 drops the rollout
        loss_mask = loss_mask & _rollout_mask(_get(src, roles["sample_mask"]), roles["sample_mask"], B)[:, None]

    trainer = _float(_tokens(tl_col, tl_name, lay), src.text)  # (B, T)
    del tl_col
    _check_finite_tokens(trainer, loss_mask, tl_name, logprob=True)
    inference = _float(_tokens(_get(src, il_name), il_name, lay), src.text)  # (B, T)
    _check_finite_tokens(inference, loss_mask, il_name, logprob=True)
    valid = loss_mask.any(-1)  # (B,) rollouts with a loss token

    metadata: dict[str, list] = {}
    if adv_name is not None:
        advantages = _advantages(_get(src, adv_name), adv_name, lay, loss_mask, valid, src.text)
    else:
        reward = _numbers(_get(src, reward_name), reward_name)
        gid = _get(src, gid_name)
        advantages = _from_rewards(reward, gid, reward_name, gid_name, lay).to(trainer.dtype)
        metadata[reward_name] = reward.reshape(-1).tolist()
        metadata[gid_name] = _metadata_column(gid, lay)

    used = {roles[r] for r in ("trainer_logprobs", "inference_logprobs", "loss_mask", "sample_mask", "advantages",
                               "position_ids", "seq_lens")}
    topk = head.read(lambda name: _get(src, name), names, lay.lengths, T, lay.kind)  # the sampler's head, if any
    used |= set(head.present(names).values())
    extras = {}
    for name, (dtype, fill) in EXTRAS.items():  # per-token extras the views read, when the file has them per token
        if name in names and name not in used:
            try:
                x = _tokens(_get(src, name), name, lay).to(dtype)  # (B, T)
            except BatchFormatError:  # not per token (e.g. one entropy per rollout): metadata below, if anything
                continue
            extras[name] = x if lay.pos is None else x.masked_fill_(~lay.pos, fill)
            used.add(name)
    for name in names:
        if name in used or name in metadata or src.skip_extra(name, B):
            continue
        values = _metadata_column(_get(src, name), lay)
        if values is not None:
            metadata[name] = values
    try:
        return Batch(trainer, inference, advantages, loss_mask, metadata, extras=extras, **topk)
    except ValueError as e:
        raise BatchFormatError(str(e)) from None


def _rollout_mask(col, name: str, B: int) -> torch.Tensor:
    """A per-rollout 0/1 column as a (B,) bool tensor."""
    m = _numbers(col, name)
    if tuple(m.shape) not in ((B,), (B, 1)):
        raise BatchFormatError(f"column '{name}' has shape {tuple(m.shape)}; expected one 0/1 per rollout ({B})")
    m = m.reshape(B)
    if m.dtype == torch.bool:
        return m
    notbin = (m != 0) & (m != 1)  # (B,), NaN included
    if bool(notbin.any()):
        r = int(torch.argmax(notbin.view(torch.uint8)))
        raise BatchFormatError(f"row {r}: column '{name}' is {m[r].item()}; a mask holds 0/1 or true/false")
    return m != 0


def _advantages(col, name, lay: _Layout, loss_mask, valid, text) -> torch.Tensor:
    B, T = lay.B, lay.T
    per_rollout = False
    if not isinstance(col, _Ragged):
        t = _numbers(col, name)
        per_rollout = tuple(t.shape) in ((B,), (B, 1)) and not (lay.kind == "packed" and t.numel() == lay.shape[-1]
                                                                 and t.numel() != B)
        if lay.kind == "padded" and tuple(t.shape) == (B, 1) and T == 1:
            per_rollout = False
        if per_rollout:
            adv = _float(t.reshape(B), text)  # (B,)
            bad = valid & ~torch.isfinite(adv)
            if bool(bad.any()):
                r = int(torch.argmax(bad.view(torch.uint8)))
                raise BatchFormatError(f"row {r}: column '{name}' is {float(adv[r])}")
            return adv
        if lay.kind == "rows" and t.dim() == 1:
            raise BatchFormatError(f"column '{name}' has {t.numel()} values but '{lay.ref}' has {B} rows")
    adv = _float(_tokens(col, name, lay), text)  # (B, T)
    _check_finite_tokens(adv, loss_mask, name, logprob=False)
    return adv


def _from_rewards(reward, gid_col, reward_name, gid_name, lay: _Layout) -> torch.Tensor:
    B = lay.B
    if tuple(reward.shape) not in ((B,), (B, 1)):
        raise BatchFormatError(f"column '{reward_name}' has shape {tuple(reward.shape)}; expected one reward per "
                               f"rollout ({B})")
    reward = reward.reshape(B).to(torch.float64)  # (B,)
    if not bool(torch.isfinite(reward).all()):
        r = int(torch.argmax((~torch.isfinite(reward)).view(torch.uint8)))
        raise BatchFormatError(f"row {r}: column '{reward_name}' is {float(reward[r])}")
    if isinstance(gid_col, _Dense) and tuple(gid_col.tensor.shape) in ((B,), (B, 1)):
        g = gid_col.tensor.reshape(B)
        if g.is_floating_point() and not bool(torch.isfinite(g).all()):
            r = int(torch.argmax((~torch.isfinite(g)).view(torch.uint8)))
            raise BatchFormatError(f"row {r}: column '{gid_name}' is {float(g[r])}")
        _, inverse = torch.unique(g, return_inverse=True)  # (B,)
    elif isinstance(gid_col, _Objects) and len(gid_col.values) == B:
        ids: dict = {}
        for r, v in enumerate(gid_col.values):
            if not isinstance(v, (str, int, float, bool)):
                raise BatchFormatError(f"row {r}: column '{gid_name}' is {_short(v)}; a group id is a number or text")
        inverse = torch.tensor([ids.setdefault(v, len(ids)) for v in gid_col.values], dtype=torch.int64)
    else:
        what = _col_desc(gid_col)
        raise BatchFormatError(f"column '{gid_name}' {what}; expected one group id per rollout ({B})")
    n = int(inverse.max()) + 1
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, torch.ones(B, dtype=torch.float64))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, inverse, reward) / count  # (groups,)
    return reward - mean[inverse]  # (B,)


def _col_desc(col) -> str:
    if isinstance(col, _Dense):
        return f"has shape {tuple(col.tensor.shape)}"
    if isinstance(col, _Objects):
        return f"has {len(col.values)} values"
    if isinstance(col, _Ragged):
        return "holds one list per row"
    if isinstance(col, _Unusable):
        return col.reason
    return "is a single value"


