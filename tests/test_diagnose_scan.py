"""diagnose(batch) without `by` scans the metadata columns (issue 43): a fault only one environment shows, which the
whole batch hides, comes first and names its group; clean batches with several columns raise no new alarm (the scan
divides the whole batch's level among its groups); a column of more than 32 values is not tried; the command line
names the group. On the recurrent LMs of seqis.samplers.generators (fast: no tiny transformer to train)."""

import math
from statistics import NormalDist

import pytest
import torch

from seqis import Batch, diagnose
from seqis.diagnosis.causes import MAX_GROUPS, MIN_GROUP_ROLLOUTS, Z_DETECT, scan_z, scanned_columns, scanned_groups
from seqis.runs.run import concat
from seqis.samplers.generators import make


def math_at(temperature: float, gen: str = "lm_byte256", seed: int = 0) -> Batch:
    """16 rollouts of the math environment sampled at `temperature`, then 48 clean ones of code and chat: 64
    rollouts, the generator's own columns (group_id, reward, length, ...) and env."""
    hot = make(gen, seed=seed, n_prompts=2, temperature=temperature)  # (16, T)
    rest = make(gen, seed=seed + 1, n_prompts=6)  # (48, T')
    b = concat([hot, rest])
    b.metadata["env"] = ["math"] * 16 + ["code", "chat"] * 24
    return b


def group_findings(findings):
    return [f for f in findings if f.group is not None]


@pytest.mark.parametrize("gen", ["lm_byte256", "lm_mixed1k", "lm_code4k"])
def test_one_env_at_temperature_0_7_comes_first_naming_its_group(gen):
    b = math_at(0.7, gen)
    found = diagnose(b)
    first = found[0]
    assert first.kind == "temperature_mismatch" and first.group == "math" and first.evidence["by"] == "env"
    assert first.evidence["temperature"] == pytest.approx(0.7, rel=0.05) and first.severity == "bad"
    assert first.message.startswith("Only in env = math (16 of 64 rollouts")
    assert first.evidence["group_rollouts"] == 16 and first.evidence["z_detect"] > Z_DETECT
    # the whole batch hides it: its own findings hold no temperature (the issue's "precision noise")
    whole = [f for f in found if f.group is None]
    assert whole and not any(f.kind in ("temperature_mismatch", "healthy") for f in whole)  # not healthy either
    assert len(group_findings(found)) == 1  # the prompts, lengths and rewards that hold math rollouts: explained
    # by= names the column too, and finds the same
    per_env = diagnose(b, by="env")
    mine = [f for f in per_env if f.group == "math"][0]
    assert mine.kind == "temperature_mismatch" and mine.evidence["by"] == "env"
    assert mine.evidence["temperature"] == pytest.approx(first.evidence["temperature"])


def test_a_fault_the_whole_batch_shows_is_not_repeated_per_group():
    b = make("lm_byte256", seed=0, temperature=0.7)
    b.metadata["env"] = ["math", "code"] * 32
    found = diagnose(b)
    assert found[0].kind == "temperature_mismatch" and found[0].group is None
    assert not group_findings(found)


def with_columns(b: Batch, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    B = b.shape[0]
    b.metadata["env"] = [("math", "code", "chat", "tool")[p * 4 // (max(b.metadata["group_id"]) + 1)]
                         for p in b.metadata["group_id"]]
    b.metadata["turn"] = torch.randint(2, (B,), generator=g).tolist()
    b.metadata["rank"] = [i % 4 for i in range(B)]
    return b


@pytest.mark.parametrize("gen, knobs", [("lm_byte256", {}), ("lm_mixed1k", {}), ("lm_code4k", {}),
                                        ("lm_byte256", dict(sampler_dtype="fp16"))])
@pytest.mark.parametrize("seed", [0, 1])
def test_clean_batches_with_metadata_columns_raise_no_new_alarm(gen, knobs, seed):
    b = with_columns(make(gen, seed=300 + seed, **knobs), seed)
    assert {"env", "turn", "rank"} <= set(scanned_groups(b))  # tried, with groups of 16 rollouts and more
    found = diagnose(b)
    assert not group_findings(found)
    bare = Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask, extras=b.extras)
    assert [(f.kind, f.severity) for f in found] == [(f.kind, f.severity) for f in diagnose(bare)]
    assert all(f.severity == "ok" for f in found)


def test_a_column_of_more_than_32_values_is_not_tried():
    b = math_at(0.7)
    # math's 16 rollouts share one value, the other 48 spread over 32 more: 33 values, not tried
    b.metadata["shard"] = ["m"] * 16 + [f"s{i % 32}" for i in range(48)]
    b.metadata.pop("env")
    assert "shard" not in scanned_columns(b) and len(set(b.metadata["shard"])) == MAX_GROUPS + 1
    assert not any(f.kind == "temperature_mismatch" for f in diagnose(b))
    b.metadata["shard"] = ["m"] * 16 + [f"s{i % 31}" for i in range(48)]  # 32 values: tried, and math found
    assert "shard" in scanned_columns(b)
    first = diagnose(b)[0]
    assert (first.kind, first.group, first.evidence["by"]) == ("temperature_mismatch", "m", "shard")


def test_which_columns_and_groups_are_scanned():
    b = make("lm_byte256", seed=0)  # 64 rollouts of 8 prompts
    b.metadata.update(one=[0] * 64, each=list(range(64)), pairs=[i // 2 for i in range(64)],
                      halves=[i // 32 for i in range(64)], lists=[[i] for i in range(64)])
    cols = scanned_columns(b)
    assert "one" not in cols and "each" not in cols and "lists" not in cols  # 1 value; one per rollout; unhashable
    assert "pairs" in cols and "group_id" in cols  # 32 values of two rollouts; 8 prompts of 8 rollouts
    groups = scanned_groups(b)  # only groups of MIN_GROUP_ROLLOUTS rollouts are tested
    assert "pairs" not in groups and "group_id" not in groups and set(groups["halves"]) == {0, 1}
    assert all(len(rows) >= MIN_GROUP_ROLLOUTS for g in groups.values() for rows in g.values())


def test_the_scan_divides_the_whole_batchs_level_among_its_groups():
    normal = NormalDist()
    alpha = normal.cdf(-Z_DETECT)  # the whole batch's one-sided level, ~2.9e-7
    assert scan_z(1) == pytest.approx(Z_DETECT)
    for m in (2, 8, 32, 100):
        assert normal.cdf(-scan_z(m)) * m == pytest.approx(alpha, rel=1e-9)  # Bonferroni: m tests share alpha
    assert 5.5 < scan_z(32) < 5.7 and scan_z(100) < 5.9 and math.isfinite(scan_z(10_000))


def test_command_line_without_by_names_the_group(tmp_path, capsys):
    from seqis.__main__ import main
    from seqis.io import save_batch

    path = tmp_path / "mixed.parquet"
    save_batch(math_at(0.7), path)
    assert main(["diagnose", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("BAD  temperature_mismatch [env = math]: temperature 0.7")
    assert "Only in env = math (16 of 64 rollouts" in out


def test_the_issues_batch_the_tiny_transformer_with_only_math_at_0_7(capsys):
    # assets/tiny_lm_math_temperature0.7.parquet (scripts/make_assets.py): the whole batch alone is precision noise
    from seqis.__main__ import main
    from seqis.io import ASSETS_DIR, load_batch

    path = ASSETS_DIR / "tiny_lm_math_temperature0.7.parquet"
    b = load_batch(path)
    found = diagnose(b)
    assert (found[0].kind, found[0].group, found[0].evidence["by"]) == ("temperature_mismatch", "math", "env")
    assert found[0].evidence["temperature"] == pytest.approx(0.7, rel=0.02)
    assert [f.kind for f in found if f.group is None] == ["precision_noise"]
    assert main(["diagnose", str(path)]) == 0
    assert capsys.readouterr().out.startswith("BAD  temperature_mismatch [env = math]: temperature 0.70")
