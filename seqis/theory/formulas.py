"""Closed forms under valid importance-sampling noise, to overlay on the lab's and the app's curves.

The model (Li & Liu, part 2): every loss token's log-ratio l_t = log pi(y_t) - log mu(y_t) is an
independent draw of N(-s^2/2, s^2). The mean -s^2/2 makes it a valid IS model: E_mu[rho] = 1. Then

    per-token KL(mu || pi) = s^2 / 2,      per-token chi2 = e^(s^2) - 1,
    log w = S = sum of T log-ratios ~ N(-T s^2 / 2, T s^2),      S / T ~ N(-s^2 / 2, s^2 / T).

Everything below follows from these two Gaussians (Phi is the standard normal CDF):

- A product band [a, b] on w accepts Phi((log b + T s^2/2) / (s sqrt T)) - Phi((log a + T s^2/2) / (s sqrt T)),
  which tends to 0 as T grows: the spread of log w grows like sqrt T.
- A geometric band [a, b] on exp(S / T) accepts Phi((log b + s^2/2) / (s / sqrt T)) - (same at a), which
  tends to 1 if -s^2/2 (minus the per-token KL) lies inside (log a, log b), else to 0: a geometric band
  is a per-token KL threshold that gets sharper with length. MIS-PO's [0.996, 1.001] keeps long
  rollouts iff the per-token KL is below -log 0.996 = 0.004 nats.
- The untruncated sequence weight has Var(w) = e^(T s^2) - 1 and normalised ESS e^(-T s^2).
- Truncating at C (sigma^2 = T s^2, c = log C):
      E[min(w, C)]     = Phi((c - sigma^2/2) / sigma) + C (1 - Phi((c + sigma^2/2) / sigma))
      E[min(w, C)^2]   = e^(sigma^2) Phi((c - 3 sigma^2/2) / sigma) + C^2 (1 - Phi((c + sigma^2/2) / sigma))
      E[w 1(w <= C)]   = Phi((c - sigma^2/2) / sigma)
  The kept mass falls towards 0 as T grows: truncation quietly shrinks long rollouts' gradients.
- Deterministic drift rho_t = r (Li's illustration; not a valid IS model since E_mu[rho] != 1):
  w = r^T, which crosses C at T = log C / log r, while the geometric ratio stays exactly r.
- One catastrophic token with l = -L among on-policy tokens passes a geometric lower bound a iff
  L / T <= -log a: long rollouts dilute catastrophes.

Huang's bit chain (H independent bits, pi(1) = p, mu(1) = q, reward 1[sum >= k]) has exact answers too:
the true gradient per token is p (1 - p) P(Bin(H - 1, p) = k - 1); token IS replaces P_pi by P_mu in it;
naive PG gives q (1 - p) P_mu(S >= k - 1) - (1 - q) p P_mu(S >= k), S ~ Bin(H - 1, q). With the additive reward
(sum of the bits) token IS is unbiased: its bias needs a reward that couples tokens. Sequence TIS's bias and
variance against its clip C are exact sums over the count of ones (`bitchain_seq_tis_error`), and the chi2 in
Li's C* = sqrt(2 (1 + chi2)) is the whole rollout's, E_mu[w^2] - 1 (`bitchain_chi2`).

Functions take floats or numpy arrays (broadcast together, vectorised over T) and return the same:
a float when every input is a scalar, else a numpy array. The bit-chain functions take scalars.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "phi",
    "chi2_from_s",
    "kl_from_s",
    "s_from_kl",
    "product_band_acceptance",
    "geo_band_acceptance",
    "token_band_acceptance",
    "max_band_acceptance",
    "seq_tis_moments",
    "seq_tis_best_clip",
    "seq_mis_product_mean",
    "seq_mis_product_moments",
    "seq_weight_variance",
    "seq_weight_quantile",
    "geo_ratio_quantile",
    "ess_seq",
    "catastrophic_min_length",
    "mis_po_kl_cutoff",
    "drift_weight",
    "drift_crossing",
    "bitchain_true_gradient",
    "bitchain_token_is_mean",
    "bitchain_naive_pg_mean",
    "bitchain_chi2",
    "bitchain_seq_tis_error",
]


def _out(x, *inputs):
    """A float when every input is a scalar, else a float64 numpy array."""
    x = np.asarray(x, dtype=np.float64)
    return float(x) if all(np.ndim(a) == 0 for a in inputs) else x


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _log(x) -> np.ndarray:
    """log of band edges and clips: log 0 = -inf, log inf = inf, without warnings."""
    with np.errstate(divide="ignore"):
        return np.log(_f(x))


def phi(x):
    """Phi(x), the standard normal CDF (torch.special.ndtr: accurate in both tails, no scipy)."""
    return _out(torch.special.ndtr(torch.as_tensor(_f(x))).numpy(), x)


def _exp_times_phi(a, z) -> np.ndarray:
    """e^a Phi(z) in log space: e^(a + log Phi(z)), finite where e^a alone overflows (a long rollout's e^(T s^2))."""
    log_phi = torch.special.log_ndtr(torch.as_tensor(_f(z))).numpy()
    with np.errstate(over="ignore"):  # inf where the product itself is past e^709
        return np.exp(_f(a) + log_phi)


def _normal_mass(lo_z, hi_z) -> np.ndarray:
    """P(lo_z <= Z <= hi_z) for standard normal Z, taking the upper tails when both ends are positive
    (Phi(hi) - Phi(lo) would cancel to 0 there)."""
    lo_z, hi_z = np.broadcast_arrays(_f(lo_z), _f(hi_z))
    upper = _f(phi(-lo_z)) - _f(phi(-hi_z))
    lower = _f(phi(hi_z)) - _f(phi(lo_z))
    return np.clip(np.where(lo_z > 0, upper, lower), 0.0, 1.0)


def _z(edge_log, mean, sd) -> np.ndarray:
    """(edge - mean) / sd with edges possibly +-inf and sd possibly 0 (then +-inf by the sign)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (edge_log - mean) / sd
    return np.where(np.isnan(z), 0.0, z)


# ---------------------------------------------------------------------------------------------------------
# the noise scale


def chi2_from_s(s):
    """Per-token chi2(pi || mu) = e^(s^2) - 1."""
    return _out(np.expm1(_f(s) ** 2), s)


def kl_from_s(s):
    """Per-token KL(mu || pi) = s^2 / 2."""
    return _out(_f(s) ** 2 / 2, s)


def s_from_kl(kl):
    """The noise scale s with per-token KL(mu || pi) = kl: s = sqrt(2 kl)."""
    return _out(np.sqrt(2 * _f(kl)), kl)


# ---------------------------------------------------------------------------------------------------------
# acceptance of bands


def product_band_acceptance(T, s, low, high):
    """P(low <= w <= high) with log w ~ N(-T s^2/2, T s^2):
    Phi((log high + T s^2/2) / (s sqrt T)) - Phi((log low + T s^2/2) / (s sqrt T)).
    Tends to 0 as T grows. s = 0.05, [0.5, 2]: T = 16: 0.999, 256: 0.577, 1024: 0.248, 4096: 0.049."""
    T, s = _f(T), _f(s)
    mean, sd = -T * s**2 / 2, s * np.sqrt(T)
    return _out(_normal_mass(_z(_log(low), mean, sd), _z(_log(high), mean, sd)), T, s, low, high)


def geo_band_acceptance(T, s, low, high):
    """P(low <= exp(S/T) <= high) with S/T ~ N(-s^2/2, s^2/T):
    Phi((log high + s^2/2) / (s / sqrt T)) - Phi((log low + s^2/2) / (s / sqrt T)).
    Tends to 1 if -s^2/2 lies inside (log low, log high), else to 0. MIS-PO's [0.996, 1.001] at s = 0.05:
    T = 16: 0.159, 64: 0.311, 256: 0.576, 1024: 0.886, 4096: 0.998."""
    T, s = _f(T), _f(s)
    mean, sd = -(s**2) / 2, s / np.sqrt(T)
    return _out(_normal_mass(_z(_log(low), mean, sd), _z(_log(high), mean, sd)), T, s, low, high)


def token_band_acceptance(s, low, high):
    """P(low <= rho_t <= high) for one token: Phi((log high + s^2/2) / s) - Phi((log low + s^2/2) / s)."""
    return geo_band_acceptance(1.0, s, low, high)


def max_band_acceptance(T, s, low, high):
    """P(every one of T tokens has low <= rho_t <= high) = token_band_acceptance(s, low, high)^T:
    the max criterion (verl's veto, max_mask) rejects more as T grows, whatever the band."""
    return _out(_f(token_band_acceptance(s, low, high)) ** _f(T), T, s, low, high)


# ---------------------------------------------------------------------------------------------------------
# weights: untruncated, truncated, masked


def seq_weight_variance(T, s):
    """Var(w) of the untruncated sequence weight: e^(T s^2) - 1 (s = 0.05, T = 100: 0.284)."""
    with np.errstate(over="ignore"):  # inf past e^709: the variance is that large
        return _out(np.expm1(_f(T) * _f(s) ** 2), T, s)


def seq_weight_quantile(T, s, z):
    """The sequence weight w = exp(S) at z standard deviations of log w: exp(-T s^2 / 2 + z s sqrt T). z = 0 is the
    median, e^(-T s^2 / 2): below E[w] = 1 and sinking with length (s = 0.05, T = 4096: 0.006), while the spread
    of log w grows like s sqrt T."""
    return _out(np.exp(-_f(T) * _f(s) ** 2 / 2 + _f(z) * _f(s) * np.sqrt(_f(T))), T, s, z)


def geo_ratio_quantile(T, s, z):
    """The geometric ratio exp(S / T) at z standard deviations: exp(-s^2 / 2 + z s / sqrt T), which settles at
    e^(-s^2 / 2) = e^(-KL) as T grows."""
    return _out(np.exp(-_f(s) ** 2 / 2 + _f(z) * _f(s) / np.sqrt(_f(T))), T, s, z)


def ess_seq(T, s):
    """Normalised effective sample size of the sequence weights, (E w)^2 / E[w^2] = e^(-T s^2)
    (s = 0.05, T = 100: 0.779)."""
    return _out(np.exp(-_f(T) * _f(s) ** 2), T, s)


def _sigma_c(T, s, C):
    sigma = np.maximum(np.sqrt(_f(T)) * _f(s), 1e-300)
    return sigma, _log(C)


def seq_tis_moments(T, s, C):
    """(mean, variance) of min(w, C), sigma^2 = T s^2, c = log C:
    E[min(w, C)]   = Phi((c - sigma^2/2) / sigma) + C (1 - Phi((c + sigma^2/2) / sigma))
    E[min(w, C)^2] = e^(sigma^2) Phi((c - 3 sigma^2/2) / sigma) + C^2 (1 - Phi((c + sigma^2/2) / sigma))
    s = 0.05, T = 256, C = 2: mean 0.885, variance 0.328. C = inf gives (1, e^(sigma^2) - 1)."""
    sigma, c = _sigma_c(T, s, C)
    s2 = sigma**2
    C = _f(C)
    finite = np.isfinite(C)
    tail = np.where(finite, _f(phi(-(np.where(finite, c, 0.0) + s2 / 2) / sigma)), 0.0)  # P(w > C)
    Cf = np.where(finite, C, 0.0)
    mean = _f(phi((c - s2 / 2) / sigma)) + Cf * tail
    second = _exp_times_phi(s2, (c - 3 * s2 / 2) / sigma) + Cf**2 * tail
    return _out(mean, T, s, C), _out(second - mean**2, T, s, C)


def seq_tis_best_clip(chi2):
    """Li's best clip for seq TIS, C* = sqrt(2 (1 + chi2)), where chi2 = E_mu[w^2] - 1 is the chi-square divergence
    of the whole rollout (the sequence weight w's, not one token's): 1.41 as chi2 -> 0, 2 at chi2 = 1. Under the
    Gaussian model 1 + chi2 = e^(T s^2) grows with length, so C* does too (s = 0.05, T = 256: chi2 = 0.90,
    C* = 1.95). It balances bounds (bias O(T (1 + chi2) / C), variance O(T^2 C^2)), so an exact optimum sits
    near it, not on it (`bitchain_seq_tis_error`)."""
    return _out(np.sqrt(2 * (1 + _f(chi2))), chi2)


def seq_mis_product_mean(T, s, C):
    """E[w 1(w <= C)] = Phi((log C - sigma^2/2) / sigma), sigma^2 = T s^2: the mean weight of Li's Seq-MIS
    (product criterion), which drops rollouts with w > C (s = 0.05, T = 256, C = 2: 0.680)."""
    sigma, c = _sigma_c(T, s, C)
    return _out(phi((c - sigma**2 / 2) / sigma), T, s, C)


def seq_mis_product_moments(T, s, C):
    """(mean, variance) of w 1(w <= C): E[w^2 1(w <= C)] = e^(sigma^2) Phi((log C - 3 sigma^2/2) / sigma)."""
    sigma, c = _sigma_c(T, s, C)
    mean = _f(phi((c - sigma**2 / 2) / sigma))
    second = _exp_times_phi(sigma**2, (c - 3 * sigma**2 / 2) / sigma)
    return _out(mean, T, s, C), _out(second - mean**2, T, s, C)


# ---------------------------------------------------------------------------------------------------------
# thresholds in length


def catastrophic_min_length(L, low):
    """One token with l = -L among on-policy tokens gives exp(S/T) = exp(-L/T), which passes a geometric
    lower bound `low` iff T >= L / -log(low) (L = 10, low = 0.5: 14.4). Long rollouts dilute catastrophes."""
    return _out(_f(L) / -_log(low), L, low)


def mis_po_kl_cutoff(geo_low, geo_high=1.0):
    """The per-token KL(mu || pi) above which a geometric (trajectory) band rejects long rollouts:
    S/T -> -KL, so long rollouts pass iff -KL >= log geo_low, i.e. KL <= -log(geo_low)
    (MIS-PO's 0.996: 0.0040 nats). A band with geo_high < 1 would also need KL >= -log(geo_high); a
    geo_high >= 1 (every practical band) sets no lower cutoff, since KL >= 0."""
    del geo_high  # documents the band; the upper edge sets no cutoff when it is >= 1
    return _out(-_log(geo_low), geo_low)


def drift_weight(r, T):
    """Sequence weight r^T under a deterministic per-token ratio r (1.001: T = 10: 1.01, 1000: 2.72,
    2000: 7.39, 5000: 148). Not a valid IS model (E_mu[rho] != 1); the geometric ratio stays r."""
    return _out(_f(r) ** _f(T), r, T)


def drift_crossing(r, C):
    """The length at which r^T reaches C: T = log C / log r (1.001 crosses 5 at T = 1610)."""
    return _out(_log(C) / np.log(_f(r)), r, C)


# ---------------------------------------------------------------------------------------------------------
# Huang's bit chain (scalars)

REWARDS = ("threshold", "additive")


def _binom(n: int, p: float) -> np.ndarray:
    """(n + 1,) P(Bin(n, p) = c) for c = 0..n, in log space (lgamma) so H in the thousands is fine."""
    c = torch.arange(n + 1, dtype=torch.float64)
    log_choose = (math.lgamma(n + 1) - torch.lgamma(c + 1) - torch.lgamma(n - c + 1)).numpy()
    c = c.numpy()
    return np.exp(log_choose + c * math.log(p) + (n - c) * math.log1p(-p))


def _count_reward(H: int, k: int, reward: str) -> np.ndarray:
    """(H + 1,) the reward f(c) of a rollout with c ones: 1[c >= k] ("threshold") or c ("additive")."""
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
    c = np.arange(H + 1, dtype=np.float64)
    return (c >= k).astype(np.float64) if reward == "threshold" else c


def bitchain_true_gradient(H: int, k: int, p: float, reward: str = "threshold") -> float:
    """dJ/dtheta_t = p (1 - p) E_pi[f(O + 1) - f(O)], O ~ Bin(H - 1, p) the other bits, p = sigmoid(theta_t):
    p (1 - p) P(Bin(H - 1, p) = k - 1) for the threshold reward 1[sum >= k], p (1 - p) for the additive sum."""
    f = _count_reward(H, k, reward)
    return p * (1 - p) * float(_binom(H - 1, p) @ np.diff(f))


def bitchain_token_is_mean(H: int, k: int, p: float, q: float, reward: str = "threshold") -> float:
    """E_mu of the token-IS estimate, rho_t (a_t - p) R: p (1 - p) E_mu[f(O + 1) - f(O)], O ~ Bin(H - 1, q). It
    corrects token t but the other H - 1 tokens still come from mu: with the threshold reward that is
    p (1 - p) P(Bin(H - 1, q) = k - 1) (H = 64, k = 40, p = 0.6, q = 0.55: 0.567 of the truth); with the additive
    reward f(O + 1) - f(O) = 1 whatever the others do, so token IS is unbiased: the bias needs a reward that
    couples tokens."""
    f = _count_reward(H, k, reward)
    return p * (1 - p) * float(_binom(H - 1, q) @ np.diff(f))


def bitchain_naive_pg_mean(H: int, k: int, p: float, q: float, reward: str = "threshold") -> float:
    """E_mu of naive PG, (a_t - p) R: q (1 - p) E f(S + 1) - (1 - q) p E f(S), S ~ Bin(H - 1, q): for the
    threshold reward q (1 - p) P(S >= k - 1) - (1 - q) p P(S >= k) (H = 64, k = 40, p = 0.6, q = 0.55: 0.289 of
    the truth)."""
    f = _count_reward(H, k, reward)
    P = _binom(H - 1, q)
    return q * (1 - p) * float(P @ f[1:]) - (1 - q) * p * float(P @ f[:-1])


def bitchain_chi2(H: int, p: float, q: float) -> float:
    """chi2(pi || mu) of the whole rollout, E_mu[w^2] - 1 = (p^2 / q + (1 - p)^2 / (1 - q))^H - 1: the chi2 in
    Li's best clip C* = sqrt(2 (1 + chi2)) (H = 16, p = 0.55, q = 0.45: 0.885, C* = 1.94)."""
    per_token = p * p / q + (1 - p) ** 2 / (1 - q)  # E_mu[rho^2] = 1 + the per-token chi2
    return math.expm1(H * math.log(per_token))


def bitchain_seq_tis_error(H: int, k: int, p: float, q: float, C, batch_size: int = 1, reward: str = "threshold"):
    """(bias2, variance) of sequence TIS's gradient from a batch of `batch_size` rollouts, against the clip C
    (vectorised over C), exact: w = (p / q)^c ((1 - p) / (1 - q))^(H - c) depends on the rollout only through its
    count of ones c, and E[a_t | c] = c / H, so with g_t = min(w, C) f(c) (a_t - p) per rollout

        mean per token   m(C)  = sum_c P_mu(c) min(w_c, C) f(c) (c / H - p)
        second moment    s2(C) = sum_c P_mu(c) min(w_c, C)^2 f(c)^2 (c / H (1 - p)^2 + (1 - c / H) p^2)
        bias2 = H (m - dJ/dtheta_t)^2,   variance = H (s2 - m^2) / batch_size,   MSE = bias2 + variance

    (the lab's definitions, summed over the H positions). H = 16, k = 11, p = 0.55, q = 0.45, B = 128: the MSE has
    an interior minimum near C = 1.8, Li's C* = sqrt(2 (1 + chi2)) = 1.94 with the sequence chi2 0.885."""
    f = _count_reward(H, k, reward)
    c = np.arange(H + 1, dtype=np.float64)
    P = _binom(H, q)  # (H + 1,) P_mu(count = c)
    log_w = c * math.log(p / q) + (H - c) * math.log((1 - p) / (1 - q))  # (H + 1,)
    Cs = _f(C)
    wc = np.exp(np.minimum(log_w, _log(Cs)[..., None]))  # (..., H + 1) min(w_c, C)
    m = (P * wc * f * (c / H - p)).sum(-1)
    s2 = (P * (wc * f) ** 2 * (c / H * (1 - p) ** 2 + (1 - c / H) * p * p)).sum(-1)
    true = bitchain_true_gradient(H, k, p, reward)
    return _out(H * (m - true) ** 2, C), _out(H * (s2 - m * m) / batch_size, C)
