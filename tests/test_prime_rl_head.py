"""prime-rl's token export carries no sampler head: what prime-rl writes (its exporter's fields, cited), a batch read
from it has none, and a score-centering correction on it, run or scanned, names the fields it lacks."""

import json

import pytest

from seqis.io import load_batch
from seqis.io.prime_rl import NO_HEAD, read_prime_rl
from seqis.registry import head_fields, run, runnable, skipped_note
from seqis.runs import scan
from seqis.runs.example import write_prime_rl_run

# The per-token fields prime-rl's exporter writes, schema_version 1: PrimeIntellect-ai/prime-rl,
# src/prime_rl/trainer/rl/token_export.py, `_export_columns`, at 559b44772e471d1538537b8805cc77f3824a5e64
# (main, 2026-08-21); 004274ec964f016ec9b17b5ae990a4b535314ff1 adds `losses` and `rewards`, drops the weight streams.
# Its sampling mask (`sampling_mask`, `sampling_mask_logprobs`: transport payload fields) and the trainer's
# `trainer_mask_logprobs` (LossInputs, used by IPO's score_centering_loss) are not among them.
PRIME_RL_TOKEN_FIELDS = ("token_ids", "position_ids", "loss_mask", "advantages", "inference_logprobs",
                         "trainer_logprobs", "entropy", "mismatch_kl", "log_importance_ratio", "importance_ratio",
                         "prob_delta", "is_masked", "is_masked_high", "is_masked_low", "rl_weights", "ce_weights",
                         "ref_kl_weights")
PRIME_RL_LINE_FIELDS = ("schema_version", "step", "rank", "micro_step", "micro_sequence_idx", "export_sequence_idx",
                        "env_name")
CENTERED = ("verl/bypass_pg_sc", "prime-rl/ipo_score_centering", "miles/score_centering_exact")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prime_rl_no_head")
    write_prime_rl_run(root, steps=2, ranks=1, rollouts_per_rank=4, incident=None, schema="weights")
    return root


def test_the_written_export_has_prime_rls_fields_and_no_head(run_dir):
    """The example writer's records have the fields of prime-rl's exporter at the cited commit, and so no head."""
    record = json.loads((run_dir / "step_0" / "rank_0.jsonl").read_text().splitlines()[0])
    assert set(record) == set(PRIME_RL_TOKEN_FIELDS) | set(PRIME_RL_LINE_FIELDS)
    assert not any("topk" in k or "top_logprobs" in k or "sampling_mask" in k for k in record)
    batch = read_prime_rl(run_dir / "step_0")
    assert not batch.has_head
    assert batch.topk_ids is batch.topk_inference_logprobs is batch.topk_trainer_logprobs is batch.topk_support is None


@pytest.mark.parametrize("key", CENTERED)
def test_a_centered_correction_on_a_prime_rl_batch_names_what_it_lacks(run_dir, key):
    batch = load_batch(run_dir / "step_1" / "rank_0.jsonl")
    with pytest.raises(ValueError) as e:
        run(key, batch)
    for field in head_fields(key):
        assert field in str(e.value)
    assert ("topk_support" in str(e.value)) == ("exact" in key or key.startswith("prime-rl"))
    ok, skipped = runnable(["token_tis", key], batch)
    assert ok == ["token_tis"] and skipped == {key: head_fields(key)}
    assert "topk_ids" in skipped_note(skipped) and key in skipped_note(skipped)


def test_a_scan_of_a_prime_rl_run_says_which_corrections_did_not_run_and_why(run_dir):
    df = scan(run_dir, ["token_tis", *CENTERED])
    assert set(df["estimator"]) == {"token_tis"}  # no rows for the centered ones
    notes = df.attrs["summary"]["notes"]
    assert len(notes) == 2  # one per set of fields: the modelled tail's three, the exact variant's four
    plain = next(n for n in notes if "verl/bypass_pg_sc" in n)
    assert "topk_support" not in plain and "topk_trainer_logprobs" in plain and "2 of 2 steps" in plain
    exact = next(n for n in notes if "prime-rl/ipo_score_centering" in n)
    assert "miles/score_centering_exact" in exact and "topk_support" in exact
    assert all(NO_HEAD in n for n in notes)


def test_a_scan_with_no_centered_correction_notes_nothing(run_dir):
    assert scan(run_dir, ["token_tis"]).attrs["summary"]["notes"] == []
