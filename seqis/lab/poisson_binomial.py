"""Exact value and gradient of a count reward under independent bits, for many policies at once.

R policies, each H independent bits with P(bit t = 1) = p[r, t]. The count C = sum of the bits is
Poisson-binomial; its distribution is the coefficient list of prod_t ((1 - p_t) + p_t x). A product tree
multiplies neighbouring polynomials level by level (log2 H levels, each one batched real FFT convolution),
so the R distributions cost O(R H log^2 H) with no Python loop over positions.

    J(p)         = sum_c f(c) P(C = c)                                    (R,)
    dJ/dp_t      = E[f(O_t + 1)] - E[f(O_t)],  O_t = the count of the other H - 1 bits
    dJ/dtheta_t  = p_t (1 - p_t) dJ/dp_t                                 (p_t = sigmoid(theta_t))

The gradient is the reverse pass of the tree: the adjoint of a product node c = a * b is the
cross-correlation of c's adjoint with the sibling (again one FFT per level). Both are float64; the error is
a few ulps of the largest coefficient (tests compare with the position-by-position DP of `BitChain`).
"""

from __future__ import annotations

import torch


def _leaves(p: torch.Tensor) -> torch.Tensor:
    """(R, n, 2) leaf polynomials [1 - p_t, p_t], padded to a power of two n with bits that are never one."""
    R, H = p.shape
    n = 1 << max(H - 1, 0).bit_length()
    leaves = p.new_zeros(R, n, 2)
    leaves[..., 0] = 1.0
    leaves[:, :H, 0] = 1 - p
    leaves[:, :H, 1] = p
    return leaves


def count_distribution(p: torch.Tensor) -> torch.Tensor:
    """(R, H + 1) P(C = c) for bits with probabilities p (R, H), float64."""
    return _tree(p.to(torch.float64))[0][:, 0, : p.shape[1] + 1]


def _tree(p: torch.Tensor):
    """Multiply the leaves pairwise up to the root; keep each level's spectra for the reverse pass."""
    poly = _leaves(p)  # (R, nodes, L)
    levels = []
    while poly.shape[1] > 1:
        L = poly.shape[-1]
        m = 2 * L - 1  # length of a product of two length-L polynomials
        nfft = 1 << (m - 1).bit_length()
        left = torch.fft.rfft(poly[:, 0::2], nfft)  # (R, nodes / 2, nfft / 2 + 1)
        right = torch.fft.rfft(poly[:, 1::2], nfft)
        levels.append((left, right, nfft, L))
        poly = torch.fft.irfft(left * right, nfft)[..., :m]  # (R, nodes / 2, m)
    return poly, levels


def value_and_gradient(p: torch.Tensor, f: torch.Tensor, *, gradient: bool = True):
    """J (R,) = E[f(C)] and, unless gradient=False, dJ/dp (R, H); p (R, H) bit probabilities, f (H + 1,)
    the reward of each count. float64."""
    p = p.to(torch.float64)
    f = f.to(p.device, torch.float64)
    R, H = p.shape
    root, levels = _tree(p)
    J = root[:, 0, : H + 1] @ f  # (R,)
    if not gradient:
        return J, None
    adj = f.expand(R, 1, H + 1)  # d J / d (root coefficients), (R, 1, H + 1)
    for left, right, nfft, L in reversed(levels):
        A = torch.fft.rfft(adj[..., : 2 * L - 1], nfft)  # (R, nodes, nfft / 2 + 1)
        # a[i] enters c[i + j] times b[j]: d J / d a[i] = sum_j adj_c[i + j] b[j], a correlation
        adj_left = torch.fft.irfft(A * right.conj(), nfft)[..., :L]
        adj_right = torch.fft.irfft(A * left.conj(), nfft)[..., :L]
        adj = torch.stack([adj_left, adj_right], 2).flatten(1, 2)  # (R, 2 nodes, L)
    return J, adj[:, :H, 1] - adj[:, :H, 0]  # a leaf is [1 - p, p]
