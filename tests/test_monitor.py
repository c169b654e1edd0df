"""seqis.runs.monitor.step_metrics: the flat dict a trainer logs. Every diagnostics name, each correction's metrics and
each finding kind as finite floats (also on batches whose ratios overflow), the same values as diagnostics, run and
diagnose give; per group with `by`; verl's names against verl's own compute_offpolicy_metrics (the installed
package, its heavy imports stubbed as in test_presets_verl.py) and prime-rl's against its arithmetic written out
here; and docs/live-runs.md's TensorBoard recipe run as written, its event files (torch.utils.tensorboard's
SummaryWriter) read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from test_presets_verl import verl  # noqa: F401 (fixture: verl's rollout_corr_helper and core_algos)

from seqis import ESTIMATORS, Batch, diagnose, diagnostics, run
from seqis.diagnosis.causes import KINDS
from seqis.runs.monitor import (
    FINDINGS_TOKENS,
    FRAMEWORK_NAMES,
    LEVELS,
    PERCENTILE_SAMPLE,
    findings_rows,
    step_metrics,
)
from seqis.samplers.scenarios import make_batch

CORRECTIONS = ["seq_tis", "mis_po", "verl/bypass_pg_geo_rs", "prime-rl/ipo"]
DOCS = Path(__file__).resolve().parent.parent / "docs" / "live-runs.md"


def with_envs(batch: Batch, envs=("math", "code")) -> Batch:
    metadata = {"env_name": [envs[i % len(envs)] for i in range(batch.shape[0])]}
    return Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, batch.loss_mask, metadata)


@pytest.fixture(scope="module")
def spiked() -> Batch:
    """Catastrophic tokens in some rollouts (a bad finding), two environments."""
    return with_envs(make_batch("catastrophic", seed=1, n_rollouts=48, max_len=96))


def test_every_diagnostics_name_correction_metric_and_finding_kind_as_a_finite_float(spiked):
    m = step_metrics(spiked, CORRECTIONS)
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    for name, value in diagnostics(spiked).items():
        assert m[f"seqis/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-12), name
    for key in CORRECTIONS:
        for metric, value in run(key, spiked).scalars().items():  # (float32 sums, in another order than run's)
            assert m[f"seqis/{key}/{metric}"] == pytest.approx(value, rel=1e-5, abs=1e-12), (key, metric)
    found = {f.kind: LEVELS[f.severity] for f in diagnose(spiked)}
    assert found.get("catastrophic_tokens", 0.0) >= 1.0  # the batch's fault, logged as warn or bad
    for kind in KINDS:
        assert m[f"seqis/findings/{kind}"] == found.get(kind, 0.0), kind
    n_corr = sum(len(run(k, spiked).scalars()) for k in CORRECTIONS)
    assert len(m) == len(diagnostics(spiked)) + n_corr + len(KINDS)  # nothing else
    # the statistics near ratio 1 (issue 43), by their exact names
    assert m["seqis/abs_ratio_mean"] > 1
    for band in ("0.999_1.002", "0.99_1.01", "0.95_1.05"):
        assert 0 <= m[f"seqis/tokens_in_{band}"] <= 1 and 0 <= m[f"seqis/rollouts_in_{band}"] <= 1, band


def test_by_gives_each_group_its_own_keys(spiked):
    m = step_metrics(spiked, ["seq_tis"], by="env_name", prefix="mismatch/")
    envs = spiked.metadata["env_name"]
    for env in ("code", "math"):
        sub = spiked.select([i for i, e in enumerate(envs) if e == env])
        for name, value in diagnostics(sub).items():
            assert m[f"mismatch/{env}/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-12), (env, name)
        for metric, value in run("seq_tis", sub).scalars().items():
            assert m[f"mismatch/{env}/seq_tis/{metric}"] == pytest.approx(value, rel=1e-6, abs=1e-12)
        found = {f.kind: LEVELS[f.severity] for f in diagnose(sub)}
        assert all(m[f"mismatch/{env}/findings/{k}"] == found.get(k, 0.0) for k in KINDS)
    assert m["mismatch/kl_k3"] == pytest.approx(diagnostics(spiked)["kl_k3"], rel=1e-6)  # the whole batch too
    assert len(m) == 3 * len(step_metrics(spiked, ["seq_tis"]))


def test_overflowing_ratios_still_log_finite_floats():
    # log-ratios of +-60 on every token of 512-token rollouts: S_j far past the e^40 weight cap, rho_t^2 past
    # float32's largest number
    g = torch.Generator().manual_seed(0)
    B, T = 16, 512
    up = torch.rand(B, T, generator=g) < 0.5  # (B, T) l = +60 here, -60 elsewhere
    up[: B // 2] = True  # half the rollouts all up: S_j = 60 T_j
    base = -torch.rand(B, T, generator=g) * 3
    inference = torch.where(up, base - 60, base)
    trainer = torch.where(up, base, base - 60)
    batch = Batch(trainer, inference, torch.randn(B, generator=g), torch.ones(B, T, dtype=torch.bool))
    m = step_metrics(batch, list(ESTIMATORS) + ["verl/bypass_pg_geo_rs_token_tis"], names="verl")
    bad = {k: v for k, v in m.items() if not math.isfinite(v)}
    assert not bad, bad
    assert m["seqis/findings/catastrophic_tokens"] == 2.0


def test_labels_configs_and_compositions_name_their_keys(spiked):
    from seqis.registry import resolve

    cfg = ESTIMATORS["seq_tis"].config(seq_clip=5.0)
    m = step_metrics(spiked, [("seq_tis", cfg), ("my_ipo", resolve("prime-rl/ipo")), "seq_mis"])
    assert m["seqis/seq_tis/seq_weight"] == pytest.approx(run("seq_tis", spiked, cfg).scalars()["seq_weight"])
    assert m["seqis/seq_tis/seq_weight"] != pytest.approx(run("seq_tis", spiked).scalars()["seq_weight"])
    assert m["seqis/my_ipo/is_masked"] == pytest.approx(run("prime-rl/ipo", spiked).scalars()["is_masked"])
    assert m["seqis/seq_mis/is_masked"] == pytest.approx(run("seq_mis", spiked).scalars()["is_masked"])
    with pytest.raises(ValueError, match="names must be one of"):
        step_metrics(spiked, names="openrlhf")
    with pytest.raises(ValueError, match="no_such_column"):
        step_metrics(spiked, by="no_such_column")
    with pytest.raises(ValueError, match="no_such_estimator"):
        step_metrics(spiked, ["no_such_estimator"])


def test_groups_named_like_a_statistic_or_a_correction_keep_their_keys_apart(spiked):
    odd = Batch(spiked.trainer_logprobs, spiked.inference_logprobs, spiked.advantages, spiked.loss_mask,
                {"env_name": ["findings"] * spiked.shape[0]})
    m = step_metrics(odd, by="env_name")  # seqis/findings/<kind> and seqis/findings/kl_k3 do not meet
    assert "seqis/findings/kl_k3" in m
    clash = Batch(spiked.trainer_logprobs, spiked.inference_logprobs, spiked.advantages, spiked.loss_mask,
                  {"env_name": ["seq_tis"] * spiked.shape[0]})
    m = step_metrics(clash, ["seq_tis"], by="env_name")  # seqis/seq_tis/<metric> and seqis/seq_tis/<name> differ
    assert "seqis/seq_tis/kl_k3" in m and "seqis/seq_tis/is_clipped" in m


def test_findings_rows_against_a_loop():
    # of the rollouts with a loss token, every k-th (k = ceil(tokens / budget)), those that fit, at least one
    length = torch.tensor([5.0, 0, 7, 3, 9, 0, 4, 6, 2, 8, 1, 5])  # 50 loss tokens in 10 rollouts
    for budget in (1, 6, 10, 17, 25, 26, 49):
        k = math.ceil(50 / budget)
        strided = [j for j in range(12) if length[j] > 0][::k]
        want, total = [], 0
        for j in strided:
            if total + length[j] > budget and want:
                break
            want.append(j)
            total += length[j]
        assert findings_rows(length, budget).tolist() == want, budget
    assert findings_rows(length, 50) is None and findings_rows(length, None) is None
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="findings_tokens"):
            findings_rows(length, bad)


def test_findings_read_the_sampled_rollouts_and_none_reads_them_all(spiked):
    # a budget under the batch's tokens: the findings are diagnose's on the rollouts findings_rows picks; the
    # default budget holds this whole batch, and None always reads every token
    budget = int(spiked.loss_mask.sum()) // 5
    m = step_metrics(spiked, findings_tokens=budget)
    rows = findings_rows(spiked.loss_mask.sum(-1).float(), budget)
    assert 0 < int(spiked.loss_mask[rows].sum()) <= budget
    found = {f.kind: LEVELS[f.severity] for f in diagnose(spiked.select(rows))}
    assert all(m[f"seqis/findings/{k}"] == found.get(k, 0.0) for k in KINDS)
    for name, value in diagnostics(spiked).items():  # the statistics still read the whole batch
        assert m[f"seqis/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-12), name
    assert int(spiked.loss_mask.sum()) <= FINDINGS_TOKENS
    assert step_metrics(spiked) == step_metrics(spiked, findings_tokens=None)


def test_percentiles_read_the_sample_the_docstring_names_and_none_reads_every_token():
    # a batch of more positions than PERCENTILE_SAMPLE: p50 / p99 are diagnostics' on that sample, every other
    # statistic the whole batch's; percentile_sample=None gives diagnostics' exact ones
    batch = make_batch("catastrophic", seed=3, n_rollouts=160, max_len=640)
    assert batch.loss_mask.numel() > PERCENTILE_SAMPLE
    m = step_metrics(batch)
    exact, sampled = diagnostics(batch), diagnostics(batch, percentile_sample=PERCENTILE_SAMPLE)
    for name in exact:
        want = sampled[name] if name in ("abs_log_ratio_p50", "abs_log_ratio_p99") else exact[name]
        assert m[f"seqis/{name}"] == pytest.approx(want, rel=1e-6, abs=1e-12), name
    exact_m = step_metrics(batch, percentile_sample=None)
    for name, value in exact.items():
        assert exact_m[f"seqis/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-12), name


def test_every_kind_diagnose_can_report_is_logged():
    folder = Path(__file__).resolve().parent.parent / "seqis" / "diagnosis"
    source = "".join(f.read_text() for f in folder.glob("*.py"))
    kinds = set(re.findall(r'Finding\(\s*"(\w+)"', source))
    assert kinds and kinds <= set(KINDS), kinds - set(KINDS)


# ---------------------------------------------------------------------------------------------------------
# the frameworks' names


def verl_batch(seed: int = 3) -> Batch:
    """Ragged rollouts, none empty, some with |S| > 20 (verl's +-20 clamp of chi2_seq exercised)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 24, 64
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    noise = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.2
    noise[:3] += 0.8  # three rollouts with S_j near +0.8 T_j (past 20 when long)
    trainer = torch.where(mask, inference + noise, torch.tensor(-torch.inf, dtype=torch.float64))
    return Batch(trainer, inference, torch.randn(B, generator=g, dtype=torch.float64), mask)


def test_verl_names_match_verls_compute_offpolicy_metrics(verl):  # noqa: F811
    helper = verl.helper
    batch = verl_batch()
    assert (batch.trainer_logprobs.detach().where(batch.loss_mask, 0).sum(-1) - batch.inference_logprobs.where(
        batch.loss_mask, 0).sum(-1)).max() > 20
    mask = batch.loss_mask.double()
    old = batch.trainer_logprobs.detach().where(batch.loss_mask, 0.0)
    want = helper.compute_offpolicy_metrics(old_log_prob=old, rollout_log_prob=batch.inference_logprobs,
                                            response_mask=mask)
    got = step_metrics(batch, names="verl", prefix="")
    assert set(want) == {k.removeprefix("rollout_corr/") for k in got if k.startswith("rollout_corr/")}
    for key, value in want.items():
        # verl divides by (count + 1e-8): a relative difference of 1e-8 / T
        assert got[f"rollout_corr/{key}"] == pytest.approx(value, rel=1e-7, abs=1e-9), key


def test_prime_rl_names_follow_its_arithmetic(spiked):
    m = step_metrics(spiked, ["prime-rl/ipo", "mis_po"], by="env_name", names="prime-rl", prefix="")
    envs = spiked.metadata["env_name"]

    def mismatch_kl(b: Batch) -> float:  # prime-rl: mean over loss tokens of exp(l) - l - 1 (train.py)
        l = (b.trainer_logprobs.detach() - b.inference_logprobs)[b.loss_mask].double()
        return float((l.exp() - l - 1).mean())

    assert m["mismatch_kl/all/mean"] == pytest.approx(mismatch_kl(spiked), rel=1e-5)
    for env in ("code", "math"):
        sub = spiked.select([i for i, e in enumerate(envs) if e == env])
        assert m[f"mismatch_kl/{env}/mean"] == pytest.approx(mismatch_kl(sub), rel=1e-5)
    for key in ("prime-rl/ipo", "mis_po"):  # per sequence, then the mean and max over sequences (loss.py)
        kept = run(key, spiked).masks["kept"]
        valid = spiked.loss_mask.any(-1)
        per_seq = 1 - (kept.sum(-1) / spiked.loss_mask.sum(-1).clamp(min=1))[valid].double()
        assert m[f"{key}/is_masked/mean"] == pytest.approx(float(per_seq.mean()), rel=1e-6, abs=1e-12)
        assert m[f"{key}/is_masked/max"] == pytest.approx(float(per_seq.max()), rel=1e-6, abs=1e-12)
    assert set(FRAMEWORK_NAMES) == {"verl", "prime-rl"}


# ---------------------------------------------------------------------------------------------------------
# the TensorBoard recipe, against TensorBoard itself


def recipe(heading: str) -> str:
    """The first python block under `heading` in docs/live-runs.md."""
    text = DOCS.read_text()
    found = re.search(rf"{re.escape(heading)}.*?```python\n(.*?)```", text, flags=re.S)
    assert found, f"no python block under {heading!r} in {DOCS}"
    return found.group(1)


def test_the_tensorboard_recipe_writes_event_files_tensorboard_reads_back(tmp_path, spiked):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (the [test] extra has it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scope = {"log_dir": str(tmp_path / "tb")}
    exec(compile(recipe("### TensorBoard"), str(DOCS), "exec"), scope)
    batches = [with_envs(make_batch(s, seed=i, n_rollouts=16, max_len=64)) for i, s in enumerate(("gaussian",
                                                                                                  "precision"))]
    batches.insert(1, spiked)  # step 1: catastrophic tokens
    for step, b in enumerate(batches):
        scope["log_mismatch"](step, b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask,
                              b.metadata["env_name"])
    scope["writer"].close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for step, b in enumerate(batches):
        want = step_metrics(b, ["seq_tis", "verl/bypass_pg_geo_rs"], by="env_name")
        assert set(want) <= tags
        for key, value in want.items():
            (event,) = [e for e in events.Scalars(key) if e.step == step]
            assert event.value == pytest.approx(value, rel=1e-6, abs=1e-30), (step, key)  # stored as float32
    assert [e.value for e in events.Scalars("seqis/findings/catastrophic_tokens")] == [0.0, 1.0, 0.0]
