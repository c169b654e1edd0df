"""seqis.export: prime-rl TOML and verl YAML snippets say the same thing as the seqis config.

The verl checks re-derive verl's rejection rule (its k1 statistic is -l = log(mu / pi), kept when it lies
in [log lower, log upper]) and compare it with seqis's band on l, token by token.
"""

import math

import pytest
import torch

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from seqis import ESTIMATORS
from seqis.estimators._kernels import in_band
from seqis.export import prime_rl_mapping, prime_rl_toml, verl_mapping, verl_yaml


def _yaml(text: str) -> dict[str, str]:
    """The `algorithm.rollout_correction` block of a snippet as {key: raw value} (our snippets are flat
    two-space YAML; no YAML library needed)."""
    out, inside = {}, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line == "  rollout_correction:":
            inside = True
            continue
        if inside and line.startswith("    "):
            key, _, value = line.strip().partition(": ")
            out[key] = value
        elif not line.startswith("    "):
            inside = False
    return out


def _verl_k1_keeps(stat_l: torch.Tensor, spec: str) -> torch.Tensor:
    """verl keeps a k1 statistic -l when log(lower) <= -l <= log(upper)."""
    lower, upper = (float(x) for x in spec.split("_"))
    k1 = -stat_l
    return (k1 >= math.log(lower)) & (k1 <= math.log(upper))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_estimator_exports_valid_toml_and_yaml(name):
    toml = prime_rl_toml(name)
    table = tomllib.loads(toml.text)["loss"]
    assert table["ratio_type"] in ("token", "sequence")
    assert table["adv_tau"] == 1.0 and table["kl_tau"] == 0.0
    assert table["token_mask_low"] < table["token_mask_high"] and table["geo_mask_low"] < table["geo_mask_high"]
    y = verl_yaml(name)
    keys = _yaml(y.text)
    assert keys["bypass_mode"] == "true" and keys["loss_type"] == "reinforce"
    assert keys["rollout_is"] in ("null", "token", "sequence")
    for snip in (toml, y):  # the header names the estimator and its knobs; an approximation says why
        assert snip.text.startswith(f"# seqis {name}")
        assert snip.exact == ("# NOTE:" not in snip.text)
        assert snip.filename.startswith(name)


def test_seq_tis_maps_exactly():
    cfg = ESTIMATORS["seq_tis"].config(seq_clip=3.0, adv_tau=0.5)
    table = tomllib.loads(prime_rl_toml("seq_tis", cfg).text)["loss"]
    assert table["ratio_type"] == "sequence" and table["sequence_clip_high"] == 3.0 and table["adv_tau"] == 0.5
    assert table["geo_mask_high"] == math.inf and table["token_mask_low"] == 0.0  # bands switched off
    assert prime_rl_mapping("seq_tis", cfg).exact
    keys = _yaml(verl_yaml("seq_tis", cfg).text)
    assert keys["rollout_is"] == "sequence" and float(keys["rollout_is_threshold"]) == 3.0
    assert keys["rollout_rs"] == "null"
    assert not verl_mapping("seq_tis", cfg).exact  # adv_tau = 0.5 has no verl key
    assert "adv_tau=0.5 has no verl key" in verl_yaml("seq_tis", cfg).text


def test_geo_mask_prime_rl_says_it_weighs_tokens_differently():
    m = prime_rl_mapping("geo_mask")
    assert m.keys["geo_mask_low"] == 0.5 and m.keys["geo_mask_high"] == 2.0 and not m.exact
    assert "weighs it 1" in m.notes[0]
    clip = prime_rl_mapping("geo_mask", ESTIMATORS["geo_mask"].config(token_clip=2.0))
    assert "token_clip=2.0 has no prime-rl key" in clip.notes[0]
    v = verl_mapping("geo_mask", ESTIMATORS["geo_mask"].config(token_clip=2.0))
    assert v.exact and v.keys["rollout_is"] == "token" and v.keys["rollout_is_threshold"] == 2.0


@pytest.mark.parametrize("lo, hi", [(0.5, 2.0), (0.996, 1.001), (0.1, 10.0), (0.9, 1.05)])
def test_verl_k1_bands_keep_exactly_the_seqis_band(lo, hi):
    # log-ratios spread over the band's edges, plus the edges' neighbours in float64
    l = torch.cat([torch.linspace(-3, 3, 20001, dtype=torch.float64),
                   torch.tensor([math.log(lo), math.log(hi)], dtype=torch.float64) * (1 + torch.tensor([-1e-9, 1e-9],
                                                                                          dtype=torch.float64))])
    cfg = ESTIMATORS["mis_po"].config(token_mask_low=lo, token_mask_high=hi, geo_mask_low=lo, geo_mask_high=hi)
    keys = _yaml(verl_yaml("mis_po", cfg).text)
    assert keys["rollout_rs"] == '"token_k1,seq_mean_k1"'
    token_spec, geo_spec = keys["rollout_rs_threshold"].strip('"').split(",")
    assert torch.equal(_verl_k1_keeps(l, token_spec), in_band(l, lo, hi))
    assert torch.equal(_verl_k1_keeps(l, geo_spec), in_band(l, lo, hi))


def test_seq_mis_product_keeps_w_at_most_C():
    cfg = ESTIMATORS["seq_mis_product"].config(seq_clip=4.0)
    keys = _yaml(verl_yaml("seq_mis_product", cfg).text)
    assert keys["rollout_rs"] == "seq_sum_k1"
    S = torch.linspace(-80, 5, 8501, dtype=torch.float64)  # summed log-ratios
    assert torch.equal(_verl_k1_keeps(S, keys["rollout_rs_threshold"].strip('"')), S <= math.log(4.0))


def test_icepop_and_max_mask():
    keys = _yaml(verl_yaml("icepop").text)
    assert keys["rollout_is"] == "token" and keys["rollout_is_threshold"] == '"0.5_5.0"'
    m = verl_mapping("max_mask")  # the default band [0.5, 2] is symmetric in log space: exact
    assert m.exact and m.keys["rollout_rs"] == "seq_max_k2"
    assert m.keys["rollout_rs_threshold"] == pytest.approx(0.5 * math.log(2.0) ** 2)
    skew = verl_mapping("max_mask", ESTIMATORS["max_mask"].config(token_mask_low=0.2))
    assert not skew.exact and "symmetrically" in skew.notes[0]


def test_estimators_without_an_equivalent_say_so():
    for name in ("geo_is", "prefix_is"):
        assert "no verl rollout_correction equivalent" in verl_yaml(name).text
        assert "no prime-rl LossConfig equivalent" in prime_rl_toml(name).text


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        prime_rl_toml("nope")
