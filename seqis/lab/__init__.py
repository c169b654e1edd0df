"""The bias and variance lab: toy policies with exact gradients, and a vectorised Monte Carlo.

An estimator's gradient error on real rollouts can only be compared with another estimator's. On a toy
whose true policy gradient is known exactly, it splits cleanly into bias and variance:

    g_b      the gradient estimate from batch b: minus the gradient in theta of the estimator's loss
             (`seqis.run(name, batch, cfg, agg="seq-mean-token-sum")`, A = reward) on B rollouts from mu
    mean     average of g_b over n_batches seeded batches;  true: the exact dJ/dtheta
    bias2    ||mean - true||^2          variance: mean over batches of ||g_b - mean||^2
    mse      mean over batches of ||g_b - true||^2 = bias2 + variance

bias2 carries a noise floor of variance / n_batches (what an unbiased estimator shows); the sweeps
report it. With the seq-mean-token-sum loss a batch's estimate is the mean of per-rollout terms, so
Var(B) = Var(1) / B and MSE(B) = bias^2 + Var(1) / B: a biased estimator's MSE plateaus at bias^2 as B
grows while sequence IS keeps falling (`sweep_batch_size`).

Two toys (the "chain" protocol below; `monte_carlo` accepts either):

- `BitChain(horizon, threshold, p, q)`: Huang's prefix chain. H independent bits, pi(a_t = 1) = p_t =
  sigmoid(theta_t), mu(a_t = 1) = q_t, reward 1[sum a >= k] (or additive: sum a). Exact gradient by a
  dynamic program over the count of ones: dJ/dtheta_t = p_t (1 - p_t) P_pi(sum of the others = k - 1).
  Token IS is biased here (its expectation uses P_mu for the other tokens); with an additive reward it
  is not: the bias needs rewards that couple tokens.
- `TabularAR(vocab, horizon)`: a tabular autoregressive policy over V <= 4 tokens and T <= 6 positions
  whose logits depend on (position, previous token), with trainer and inference policies that differ
  per state. Exact gradient and exact estimator expectations by enumerating all V^T sequences. Here the
  sampler also shifts which states are visited, so token IS is biased even with an additive reward.

The chain protocol: `horizon` (T), `dim` (D, the number of parameters theta), `sample(n, generator,
device, dtype) -> Rollouts`, `score_vjp(tokens, v) -> (n, D)` (the per-rollout gradient in theta of
sum_t v_t log pi(a_t)), `logprobs(tokens, theta)` (differentiable), `true_gradient() -> (D,) float64`,
`value()`, `seq_chi2()` (the whole rollout's chi2, E_mu[w^2] - 1), `with_lag(lag, lr)`, and `enumerate()` where the
sequence space is small.

Everything runs as tensors: all n_batches * batch_size rollouts are drawn as [N, T] tensors in chunks
that fit `memory_budget` (whole batches per chunk), each chunk goes through `seqis.run_many` once (the
log-ratios are shared by every estimator), autograd gives d loss / d trainer_logprobs, the chain maps it
to theta, and a reshape forms the per-batch means. No Python loop over rollouts. Estimators must be
per-rollout functions of the batch (every registered one is): a chunk of several batches then gives
each batch exactly the gradient it would get alone.

Files: chain.py (BitChain, Rollouts), tabular.py (TabularAR), montecarlo.py (monte_carlo, expected_gradient),
sweeps.py (sweep_knob, sweep_batch_size, sweep_horizon, sweep_lag); train.py (train, train_lags: SGD on a toy
under policy lag, each estimator driving the update, exact J every step) with policies.py (the toys as many
policies at once, sampler faults), poisson_binomial.py (exact J and gradient of a count reward) and streams.py
(one counter-based random stream per seed); mean_field.py (train_expected: the same training along each estimator's
exact expected gradient, summed over counts on a uniform bit chain, for any horizon); centering.py (score centering on
the bit chain: sc_drift, the drift under a constant reward; sc_training, who converges where) and head_lm.py (a
generator with a full next-token distribution: the centered gradient's error by head size). docs/score-centering.md.
"""

from .centering import drift_path, sc_drift, sc_training
from .chain import BitChain, Rollouts
from .mean_field import train_expected
from .montecarlo import AGG, MCResult, expected_gradient, monte_carlo, monte_carlo_many
from .sweeps import sweep_batch_size, sweep_horizon, sweep_knob, sweep_lag
from .tabular import TabularAR
from .train import SamplerFault, TrainResult, train, train_lags

__all__ = [
    "AGG",
    "BitChain",
    "TabularAR",
    "Rollouts",
    "MCResult",
    "monte_carlo",
    "monte_carlo_many",
    "expected_gradient",
    "sweep_knob",
    "sweep_batch_size",
    "sweep_horizon",
    "sweep_lag",
    "train",
    "train_lags",
    "train_expected",
    "TrainResult",
    "SamplerFault",
    "drift_path",
    "sc_drift",
    "sc_training",
]
