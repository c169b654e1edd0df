"""Presets against their frameworks' own code: TRL, OpenRLHF, SkyRL and AReaL, loaded from their pip wheels (make
test unzips them under .venv/frameworks, never installs them; absent, these tests skip), through the maintainer's
check (seqis/presets/check/), on random ragged batches with an empty rollout, zero advantages and tokens beyond
+-20. Then the cases at the edges: the +-20 clamp with mixed signs, float32 overflow. prime-rl, NeMo-RL, slime and
Miles ship no wheel: their presets are checked by hand-computed cases (test_presets.py), and by
`python -m seqis.presets check` on a checkout (docs/presets.md lists the last run).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from strategies import ulps_around

from seqis import Batch, run
from seqis.presets import PRESETS, presets_of
from seqis.presets.check import check, load, ragged_batch, seqis_gradient
from seqis.registry import needs_head

ROOT = Path(os.environ.get("SEQIS_FRAMEWORKS", Path(__file__).resolve().parents[1] / ".venv" / "frameworks"))
WHEELS = {"trl": "trl", "openrlhf": "openrlhf", "skyrl": "skyrl", "areal": "areal"}  # framework -> unzipped wheel
# what a wheel lacks (its release predates the code read): the row says "not in this checkout"
OLDER = {"skyrl/cispo_rollout": "skyrl 0.3.0 predates cispo_anchor (#1859)",
         "areal/kpop": "areal 1.0.4 predates the binary_kl metric (#1405)"}


def source(framework: str) -> Path:
    path = ROOT / WHEELS[framework]
    if not path.is_dir():
        pytest.skip(f"{path} is missing (make test unzips {framework}'s wheel there; offline it skips)")
    return path


@pytest.fixture(scope="module", params=sorted(WHEELS))
def checked(request):
    return request.param, check(request.param, source(request.param), seeds=2)


def test_every_preset_agrees_with_its_frameworks_code(checked):
    framework, rows = checked
    assert {r.key for r in rows} == set(presets_of(framework))
    for r in rows:
        if r.key in OLDER or needs_head(r.key):  # score centering is newer than every wheel checked here
            assert r.status == "not in this checkout", r
        else:
            assert r.status == "ok", r


def test_the_check_fails_a_preset_that_differs():
    """The same SkyRL code against a preset whose knob is off by a little: the check must say so."""
    ref = load("skyrl", source("skyrl"))
    batch = ragged_batch(0)
    cfg = PRESETS["skyrl/token_tis"].config
    theirs = ref.gradient(cfg.replace(token_tis_ratio_clip_high=2.2), batch)
    ours = seqis_gradient("skyrl/token_tis", batch, None, "token-mean")
    assert not torch.allclose(ours, theirs, rtol=ref.rtol, atol=ref.atol)


def _batch(rows: list[list[float]], adv: list[float], dtype=torch.float64, mu: float = math.log(0.5)) -> Batch:
    T = max(len(r) for r in rows)
    l = torch.tensor([r + [0.0] * (T - len(r)) for r in rows], dtype=dtype)
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])
    inference = torch.full_like(l, mu)
    inference = torch.where(l > -mu, -l - 0.01, inference)  # keep pi <= 1
    return Batch(trainer_logprobs=inference + l, inference_logprobs=inference,
                 advantages=torch.tensor(adv, dtype=dtype), loss_mask=mask)


def test_skyrl_product_mask_clamps_the_sum_at_20_not_each_token():
    # off_policy_correction_utils.py compute_sequence_mask: exp(clamp(sum l, +-20)). l = (+25, -20): SkyRL's sum is
    # 5, exp 148 > 2: the rollout is dropped (clamping 25 to 20 first would give a sum of 0, ratio 1, kept)
    batch = _batch([[25.0, -20.0], [0.1, 0.2]], [1.0, 1.0])
    theirs = load("skyrl", source("skyrl")).gradient(PRESETS["skyrl/product_mask"].config, batch)
    assert torch.all(theirs[0] == 0) and torch.all(theirs[1] != 0)
    torch.testing.assert_close(seqis_gradient("skyrl/product_mask", batch, None, "token-mean"), theirs)


def test_openrlhf_icepop_and_seq_mask_stay_finite_at_float32_overflow():
    # loss.py (0.11): coef = torch.where(keep, token_is, 0): a rejected token with exp(l) = inf in float32 (l = 100)
    # weighs 0 (before #1314 / #1339 it was inf * 0 = NaN); seqis gives the same 0
    ref = load("openrlhf", source("openrlhf"))
    batch = _batch([[100.0, 0.1], [0.2, -0.1]], [1.0, -1.0], dtype=torch.float32)
    for key in ("openrlhf/icepop", "openrlhf/seq-mask-tis"):
        theirs = ref.gradient(PRESETS[key].config, batch)
        assert torch.isfinite(theirs).all(), key
        assert float(theirs[0, 0]) == 0.0, key
        ours = seqis_gradient(key, batch, None, "token-mean")
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-8)


def test_trl_masks_and_truncations_at_their_exact_edge():
    # grpo_trainer.py _generate_and_score_completions: mask drops exp(l) > 3 (strictly). At l = log 3, TRL's
    # exp(l) is 3.0000000000000004 in float64: dropped; seqis keeps l <= log 3. Truncation agrees either way.
    ref = load("trl", source("trl"))
    edge = math.log(3.0)
    batch = _batch([[edge, edge - 1e-12], [edge + 1e-12, 0.0]], [1.0, 1.0])
    for key in ("trl/token_mask", "trl/token_truncate"):
        theirs = ref.gradient(PRESETS[key].config, batch)
        torch.testing.assert_close(seqis_gradient(key, batch, None, "token-mean"), theirs, rtol=1e-12, atol=0.0)


def test_areal_default_is_ppo_clip_on_the_sampler_and_zero_advantages_give_nothing():
    # functional.py ppo_actor_loss_fn with proximal = old = the sampler (use_decoupled_loss false): A > 0 keeps
    # r <= 1.2, A < 0 keeps r >= 0.8, and A = 0 contributes no gradient at all
    ref = load("areal", source("areal"))
    batch = _batch([[math.log(1.3), math.log(1.1)], [math.log(0.7), math.log(0.9)], [0.5, -0.5]], [1.0, -1.0, 0.0])
    theirs = ref.gradient(PRESETS["areal/default"].config, batch)
    assert torch.all(theirs[2] == 0) and float(theirs[0, 0]) == 0.0 and float(theirs[1, 0]) == 0.0
    torch.testing.assert_close(seqis_gradient("areal/default", batch, None, "token-mean"), theirs)
    out = run("areal/default", batch)
    assert out.masks["kept"].tolist() == [[False, True], [False, True], [True, True]]


def test_the_command_line_exits_by_what_it_found(tmp_path, capsys):
    from seqis.presets.__main__ import main

    assert main(["check", "trl", str(source("trl")), "--seeds", "1", "--key", "trl/opsm"]) == 0
    assert "trl/opsm" in capsys.readouterr().out
    assert main(["check", "trl", str(tmp_path)]) == 2  # no TRL there: one line saying so
    assert "trl/trainer/grpo_trainer.py is not under" in capsys.readouterr().err


def _at_edge(edge: float, dtype=torch.float32, mu: float = 0.0) -> Batch:
    """One-token rollouts on the dtype's values around log(edge) (log mu = 0: l is log pi to the last bit)."""
    l = torch.tensor(ulps_around(math.log(edge), 300, dtype), dtype=dtype)[:, None]
    return Batch(trainer_logprobs=l + mu, inference_logprobs=torch.full_like(l, mu),
                 advantages=torch.ones(len(l), dtype=dtype), loss_mask=torch.ones_like(l, dtype=torch.bool))


@pytest.mark.parametrize("key, cfg, edge", [
    # ppo_utils.py:793: ratio > 1 - eps_low and ratio < 1 + eps_high, ratio = exp(clamp(l)) in float32
    ("skyrl/rollout_is", None, 1.2), ("skyrl/rollout_is", None, 0.8),
    # off_policy_correction_utils.py:108, :114: a rollout with a token ratio > high or < low is dropped
    ("skyrl/outlier_token_mask", {"outlier_token_is_threshold_high": 3.0}, 3.0),
    # :243: exp(clamp(S)) > product_mask_high
    ("skyrl/product_mask", None, 2.0),
    # loss.py:238: (stat >= low) & (stat <= high) on stat = exp(l) (icepop) or exp(mean l) (seq-mask-tis)
    ("openrlhf/icepop", None, 5.0), ("openrlhf/icepop", None, 0.5), ("openrlhf/seq-mask-tis", None, 5.0),
])
def test_ratio_bands_decide_their_exact_edge_as_the_framework_does_in_float32(key, cfg, edge):
    # on the float32 values around the edge the framework's exp(l) against C and the composition (edge_space
    # "ratio", plain and fast) drop the same tokens; at 1.2 and 0.8 comparing l with log C would not
    framework = key.split("/")[0]
    ref = load(framework, source(framework))
    config = PRESETS[key].config if cfg is None else PRESETS[key].config.replace(**cfg)
    batch = _at_edge(edge)
    theirs = ref.gradient(config, batch)
    ours = seqis_gradient(key, batch, config, ref.agg(config))
    assert torch.equal(ours != 0, theirs != 0), key
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0.0)
    fast = Batch(batch.trainer_logprobs.clone().requires_grad_(True), batch.inference_logprobs, batch.advantages,
                 batch.loss_mask)
    run(key, fast, config, agg=ref.agg(config)).loss.backward()  # the fast evaluator, as the registry runs it
    assert torch.equal(fast.trainer_logprobs.grad != 0, theirs != 0), key
    if key == "skyrl/rollout_is":  # here (not at 2, 3, 5, 0.5) log space decides otherwise: l against log C
        l, log_edge = batch.trainer_logprobs[:, 0], torch.tensor(math.log(edge), dtype=torch.float32)
        in_log_space = (l < log_edge) if edge > 1 else (l > log_edge)
        assert not torch.equal(in_log_space, theirs[:, 0] != 0), key
