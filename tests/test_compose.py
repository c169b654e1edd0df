"""The composable correction's parts by hand: each with the arithmetic in comments, and every validation error.

One rollout of a few tokens unless said otherwise; float64, inference log-probs -1, so the log-ratios are
exactly the numbers written.
"""

import math

import pytest
import torch

from seqis import Batch, Composition, Criterion, Penalty, Weight, run, run_many

D = torch.float64


def rollouts(ls, adv, inference=-1.0):
    """A batch whose log-ratios are exactly `ls` (one list per rollout, same length), advantages `adv`."""
    l = torch.tensor(ls, dtype=D)
    q = torch.full_like(l, inference)
    return Batch((q + l).requires_grad_(), q, torch.tensor(adv, dtype=D))


def grad(out, batch):
    (g,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return g


def test_dppo_drops_by_probability_difference_on_the_advantage_side():
    # prime-rl's default: drop when A > 0 and pi - mu > 0.2, or A <= 0 and pi - mu < -0.2; weight rho_t.
    # mu = e^-1 = 0.368 on every token. Rollout 0 (A = +1): l = 0.5 -> pi = e^-0.5 = 0.607, pi - mu = 0.239 > 0.2:
    # dropped; l = -1 -> pi - mu = 0.135 - 0.368 = -0.233, not tested when A > 0: kept with weight e^-1.
    # Rollout 1 (A = -1): the same tokens; l = 0.5 passes the low side, l = -1 (-0.233 < -0.2) is dropped.
    dppo = Composition(Weight("token"), (Criterion("prob_diff", high=0.2, advantage="positive"),
                                         Criterion("prob_diff", low=-0.2, advantage="non-positive")))
    b = rollouts([[0.5, -1.0], [0.5, -1.0]], [1.0, -1.0])
    out = run(dppo, b)
    assert out.masks["kept"].tolist() == [[False, True], [True, False]]
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, math.exp(-1)], [math.exp(0.5), 0.0]], dtype=D))
    s = out.scalars()
    assert s["is_token_masked"] == 0.5 and s["is_traj_masked"] == 0.0 and s["is_masked"] == 0.5


def test_the_penalty_adds_its_gradient_beside_the_policy_gradient():
    # kl_tau * l^2 over every loss token, / N (token-mean): with l = (0.5, -1), A = 2, no criteria, weight 1:
    # d loss / d log pi_t = -1 * 2 / 2 + 1e-3 * 2 l_t / 2 = -1 + 1e-3 * l_t -> (-0.9995, -1.001)
    b = rollouts([[0.5, -1.0]], [2.0])
    out = run(Composition(penalty=Penalty(1e-3)), b)
    torch.testing.assert_close(grad(out, b), torch.tensor([[-1 + 0.5e-3, -1 - 1e-3]], dtype=D))
    assert out.weights.tolist() == [[1.0, 1.0]]  # the policy-gradient coefficient alone
    assert out.scalars()["penalty"] == pytest.approx(1e-3 * (0.25 + 1.0) / 2)
    # k3 as the penalty: f'(l) = rho - 1 = e^l - 1
    out = run(Composition(penalty=Penalty(0.1, "k3")), b)
    torch.testing.assert_close(grad(out, b), torch.tensor([[-1 + 0.1 * math.expm1(0.5) / 2,
                                                           -1 + 0.1 * math.expm1(-1.0) / 2]], dtype=D))


def test_self_normalised_sequence_weights_have_mean_one_over_valid_rollouts():
    # S = 0.2 and -0.4: weights e^0.2 = 1.221, e^-0.4 = 0.670, mean 0.946: normalised 1.291, 0.709
    b = rollouts([[0.1, 0.1], [-0.2, -0.2]], [1.0, 1.0])
    out = run(Composition(Weight("sequence", self_normalize=True)), b)
    w = [math.exp(0.2), math.exp(-0.4)]
    mean = sum(w) / 2
    torch.testing.assert_close(out.weights[:, 0], torch.tensor([w[0] / mean, w[1] / mean], dtype=D))


def test_self_normalised_token_weights_count_every_loss_token():
    # min(rho, 1.5) on l = (0.6, 0, -0.5): 1.5, 1, 0.607; mean 1.036 over the three loss tokens
    b = rollouts([[0.6, 0.0, -0.5]], [1.0])
    out = run(Composition(Weight("token", clip=1.5, self_normalize=True)), b)
    w = [1.5, 1.0, math.exp(-0.5)]
    torch.testing.assert_close(out.weights[0], torch.tensor(w, dtype=D) / (sum(w) / 3))


def test_the_log_ratio_clamp_bounds_the_weight_after_aggregating_and_the_criteria_per_token():
    # l = (30, -25): verl clamps S = 5 (not the clamped sum 20 - 20 = 0) for a sequence weight: e^5; the k3
    # criterion sees the per-token clamped l = 20: k3 = e^20 - 21 > 1e6 -> the rollout is dropped by max k3
    b = rollouts([[30.0, -25.0]], [1.0])
    out = run(Composition(Weight("sequence"), log_ratio_clamp=20.0), b)
    torch.testing.assert_close(out.weights, torch.full((1, 2), math.exp(5.0), dtype=D))
    out = run(Composition(Weight("token"), log_ratio_clamp=20.0), b)  # e^20 and e^-20, not e^30 and e^-25
    torch.testing.assert_close(out.weights, torch.tensor([[math.exp(20.0), math.exp(-20.0)]], dtype=D))
    capped = Composition(criteria=(Criterion("k3", "max", high=1e6),), log_ratio_clamp=20.0)
    assert not run(capped, b).masks["kept"].any()
    loose = Composition(criteria=(Criterion("k3", "max", high=1e9),), log_ratio_clamp=20.0)  # e^20 - 21 = 4.9e8
    assert run(loose, b).masks["kept"].all()


def test_a_rollout_rule_on_the_advantage_sign_drops_whole_rollouts_or_signed_tokens():
    # OPSM: drop a rollout with A < 0 whose mean k1 = -mean(l) exceeds 0.1. Rollout 0: mean l = -0.3 (k1 0.3),
    # A = -1: dropped; rollout 1: the same l, A = +1: kept.
    opsm = Composition(criteria=(Criterion("k1", "mean", high=0.1, advantage="negative"),))
    b = rollouts([[-0.3, -0.3], [-0.3, -0.3]], [-1.0, 1.0])
    out = run(opsm, b)
    assert out.masks["kept"].tolist() == [[False, False], [True, True]]
    assert out.masks["traj_masked"].tolist() == [[True, True], [False, False]]
    # per-token advantages: only the tokens with A < 0 of a failing rollout go
    q = torch.full((1, 2), -1.0, dtype=D)
    bt = Batch((q - 0.3).requires_grad_(), q, torch.tensor([[-1.0, 1.0]], dtype=D))
    assert run(opsm, bt).masks["kept"].tolist() == [[False, True]]


def test_k2_sum_and_min_ratio_criteria():
    # k2 = l^2 / 2: rollout (0.3, 0.4) sums 0.045 + 0.08 = 0.125 <= 0.13 kept; (0.5, 0.1) sums 0.13: on the edge,
    # kept (inclusive); (0.6, 0) sums 0.18: dropped. min rho >= e^-1: l = -1.2 drops its rollout.
    b = rollouts([[0.3, 0.4], [0.5, 0.1], [0.6, 0.0], [0.0, -1.2]], [1.0, 1.0, 1.0, 1.0])
    out = run(Composition(criteria=(Criterion("k2", "sum", high=0.13), Criterion("ratio", "min", low=math.exp(-1)))),
              b)
    assert out.rollouts["accepted"].tolist() == [True, True, False, False]


def test_run_many_keys_a_composition_by_itself_and_refuses_a_cfg_with_it():
    b = rollouts([[0.1, 0.2]], [1.0])
    comp = Composition(Weight("geometric", clip=2.0))
    outs = run_many(["geo_is", comp], b)
    assert set(outs) == {"geo_is", comp}
    torch.testing.assert_close(outs[comp].weights, outs["geo_is"].weights)
    from seqis import ESTIMATORS

    with pytest.raises(ValueError, match="a Composition carries its own knobs"):
        run(comp, b, ESTIMATORS["geo_is"].config())


def test_every_estimator_describes_itself_in_words():
    from seqis import ESTIMATORS
    from seqis.registry import resolve

    assert resolve("mis_po").describe() == ("weight 1; drop tokens with ratio outside [0.5, 2]; "
                                            "drop rollouts by mean with ratio outside [0.996, 1.001]")
    assert resolve("seq_tis").describe() == "sequence weight truncated at 2"
    for name in ESTIMATORS:
        assert resolve(name).describe()


@pytest.mark.parametrize("make, message", [
    (lambda: Weight("tokens"), "Weight.level must be one of 'none', 'token', 'sequence', 'geometric', 'prefix'"),
    (lambda: Weight("token", clip=0.0), "Weight.clip must be > 0.0, got 0.0"),
    (lambda: Weight("token", clip=math.nan), "Weight.clip must be a number, got nan"),
    (lambda: Weight("token", clip_low=-1.0), "Weight.clip_low must be >= 0.0, got -1.0"),
    (lambda: Weight("token", clip=1.0, clip_low=2.0), "Weight.clip_low must be below Weight.clip, got 2.0 >= 1.0"),
    (lambda: Weight("token", band=(2.0, 1.0)), r"Weight.band low must be below high, got \(2.0, 1.0\)"),
    (lambda: Weight("token", band=[0.5, 2.0]), "Weight.band must be a \\(low, high\\) tuple or None"),
    (lambda: Weight(clip=2.0), "Weight.level 'none' takes no clip, band or self_normalize"),
    (lambda: Weight("token", self_normalize=1), "Weight.self_normalize must be True or False, got 1"),
    (lambda: Criterion("kl"), "Criterion.statistic must be one of 'ratio', 'k1', 'k2', 'k3', 'prob_diff'"),
    (lambda: Criterion(agg="median", high=2.0), "Criterion.agg must be one of 'token', 'sum', 'mean', 'max', 'min'"),
    (lambda: Criterion(), "Criterion on ratio needs a low or a high edge, got neither"),
    (lambda: Criterion(low=-1.0), "Criterion.low must be >= 0.0, got -1.0"),
    (lambda: Criterion(low=2.0, high=1.0), "Criterion.low must be below Criterion.high, got 2.0 >= 1.0"),
    (lambda: Criterion(high=2.0, advantage="pos"), "Criterion.advantage must be one of 'positive', 'negative'"),
    (lambda: Penalty(math.inf), "Penalty.coef must be finite, got inf"),
    (lambda: Penalty(0.1, "l1"), "Penalty.statistic must be one of 'squared_log_ratio', 'k3'"),
    (lambda: Composition(weight="token"), "Composition.weight must be a Weight, got str"),
    (lambda: Composition(criteria=[Criterion(high=2.0)]), "Composition.criteria must be a tuple of Criterion"),
    (lambda: Composition(penalty=0.1), "Composition.penalty must be a Penalty or None, got float"),
    (lambda: Composition(log_ratio_clamp=0.0), "Composition.log_ratio_clamp must be > 0.0, got 0.0"),
    (lambda: Composition(adv_tau=math.inf), "Composition.adv_tau must be finite, got inf"),
])
def test_validation_names_the_field_and_why(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unbiased_is_read_from_the_composition():
    import math

    from seqis import ESTIMATORS
    from seqis.presets import PRESETS
    from seqis.registry import resolve

    assert resolve("seq_is").unbiased
    assert resolve("seq_tis", ESTIMATORS["seq_tis"].config(seq_clip=math.inf)).unbiased  # an open clip is plain IS
    assert not resolve("seq_tis").unbiased  # truncated
    assert [n for n in ESTIMATORS if resolve(n).unbiased] == ["seq_is"]
    assert not any(resolve(k).unbiased for k in PRESETS)  # every framework's correction trades some bias
