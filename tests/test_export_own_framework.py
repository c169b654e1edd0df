"""Exports never change the algorithm silently (issue 43, item 2; issue 42, item 2's last sentence).

Every framework preset exported to its own framework is read back with the format's own library (PyYAML, tomllib,
the shell's word splitting for flags, Python's ast for keyword arguments) and compared with the preset's config
knob by knob: each knob is at the key its exporter names (`own_key`), whose last word is the knob's own name (a
few knobs the framework spells otherwise are listed below, with why), or a comment names it as not written and why.
verl has its own key-by-key test (tests/test_presets_verl.py), its thresholds being two knobs in one string.

A composition a framework cannot express exactly (a registry estimator, another framework's preset) names in a
comment each part it does not carry: the expectation is derived from the composition (its later parts the
exporter has no setting for, its NOTEs), not written out here.
"""

from __future__ import annotations

import ast
import math
import shlex
from typing import Any

import pytest
import yaml

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from seqis import ESTIMATORS, PRESETS
from seqis.export import EXPORTERS, export, is_own
from seqis.export._own import NOT_WRITTEN
from seqis.export._parts import later_parts
from seqis.registry import resolve

OWN = sorted(k for k in PRESETS if is_own(k, PRESETS[k].export_framework) and PRESETS[k].export_framework != "verl")
# knobs a framework spells otherwise: knob -> why (the exporter's own_key says where)
RENAMED = {
    "is_correction_threshold_low": "OpenRLHF's --algo.advantage.is_correction_threshold takes low and high",
    "is_correction_threshold_high": "OpenRLHF's --algo.advantage.is_correction_threshold takes low and high",
    "eps_clip_low": "OpenRLHF's --actor.eps_clip_low_high takes low and high (SkyRL's is eps_clip_low)",
    "eps_clip_high": "OpenRLHF's --actor.eps_clip_low_high takes low and high (SkyRL's is eps_clip_high)",
    "tis_function": "slime / Miles name the TIS function by --custom-tis-function-path",
    "icepop": "Miles names the IcePop function by --custom-tis-function-path",
    "score_centering": "SkyRL #2244 turns it on by the head width, trainer.algorithm.score_centering_topk",
    "loss": "torchforge's loss is the class the snippet builds as loss_fn",
}


def _scalar(word: str) -> Any:
    """A flag's value as the framework's parser reads it: a number, True / False, inf, or the word."""
    if word in ("inf", "-inf"):
        return float(word)
    value = yaml.safe_load(word)
    return value if isinstance(value, (int, float, bool)) else word


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings and lists as dotted keys ("filters.0.agg_type")."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else None
    if items is None:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _flags(body: str) -> dict[str, Any]:
    out: dict[str, list] = {}
    flag = None
    for word in shlex.split(" ".join(l for l in body.splitlines() if not l.startswith("#")).replace("\\", " ")):
        if word.startswith("--"):
            flag = word
            out[flag] = []
        elif flag is not None:
            out[flag].append(_scalar(word))
    return {k: True if not v else v[0] if len(v) == 1 else tuple(v) for k, v in out.items()}


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "float":  # float("inf")
        return float(ast.literal_eval(node.args[0]))
    return ast.literal_eval(node)


def _python(body: str) -> dict[str, Any]:
    """Keyword arguments of every call (a dict argument flattened), and `name = Class()` as name: Class."""
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                v = ast.Dict if isinstance(kw.value, ast.Dict) else None
                if v is not None:
                    out.update(_flat({ast.literal_eval(k): _value(x) for k, x in zip(kw.value.keys, kw.value.values)},
                                     kw.arg))
                else:
                    out[kw.arg] = _value(kw.value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            out[node.targets[0].id] = node.value.func.id
    return out


def read_back(text: str, suffix: str) -> dict[str, Any]:
    """The snippet's settings, flat, each side file's keys as "name:key"."""
    body, *files = text.split("# --- ")
    kind = suffix.rsplit(".", 1)[-1]
    if kind == "yaml":
        out = _flat(yaml.safe_load(body) or {})
    elif kind == "toml":
        out = _flat(tomllib.loads(body))
    elif kind == "sh":
        out = _flags(body)
    else:
        out = _python(body)
    for f in files:
        name, _, content = f.partition(" ---\n")
        out.update({f"{name}:{k}": v for k, v in _flat(yaml.safe_load(content)).items()})
    return out


def not_written(text: str) -> set[str]:
    """The knobs a comment names as not written ("# not written: a, b: why")."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith(f"# {NOT_WRITTEN}: "):
            names |= {n.strip() for n in line.removeprefix(f"# {NOT_WRITTEN}: ").split(":")[0].split(",")}
    return names


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, bool) or isinstance(want, bool):
        return str(got).lower() == str(want).lower()  # open-instruct's flags spell booleans as words
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return got == want or (math.isinf(got) and got == want) or math.isclose(got, want, rel_tol=1e-14)
    return got == want


def _leaf(where: str) -> str:
    return where.split(":")[-1].rsplit(".", 1)[-1].removeprefix("--").replace("-", "_")


@pytest.mark.parametrize("key", OWN)
def test_a_framework_preset_exported_to_its_own_framework_is_its_config_knob_by_knob(key):
    p = PRESETS[key]
    exporter = EXPORTERS[p.export_framework]
    snip = export(key, p.export_framework)
    # exact unless a knob sets what the framework has no key for: each such knob is a NOTE and in `uncarried`
    assert snip.expressible and snip.exact == (snip.uncarried == ()), snip.text
    assert all(f"# NOTE: {u}" in snip.text for u in snip.uncarried)
    named = {u.split("=", 1)[0] for u in snip.uncarried}
    assert named <= set(p.config.as_dict()), named  # only the preset's own knobs: every other key is carried
    doc, skipped = read_back(snip.text, snip.filename), not_written(snip.text) | named
    own_value = getattr(exporter, "own_value", lambda _, v: v)
    for name, value in p.config.as_dict().items():
        if name in skipped:
            continue
        where = exporter.own_key(name, p.config)
        flag, i = where if isinstance(where, tuple) else (where, None)
        if name == "adv_tau" and flag not in doc:  # seqis's knob unless the framework has one: 1 needs no key
            assert value == 1.0, key
            continue
        assert _leaf(flag) == name or name.endswith(f"_{_leaf(flag)}") or name in RENAMED, (key, name, flag)
        want = own_value(name, value)
        if flag not in doc:  # flags and TOML leave out None / False: the framework's default off
            assert want in (None, False), (key, name, flag, snip.text)
            continue
        got = doc[flag][i] if isinstance(doc[flag], tuple) else doc[flag]  # one of a flag's values, or its one
        assert not isinstance(doc[flag], tuple) or i is not None, (key, name, flag)
        assert _same(got, want), (key, name, got, want, snip.text)


def test_every_framework_with_an_exporter_has_its_presets_checked():
    """17 exporters: every framework's presets (vime's are Miles flags through their composition; the seed's four
    under prime-rl are seqis estimators) are in OWN, verl's in its own test."""
    frameworks = {PRESETS[k].export_framework for k in OWN} | {"verl"}
    assert frameworks == set(EXPORTERS), set(EXPORTERS) - frameworks


@pytest.mark.parametrize("key", OWN)
def test_a_changed_knob_is_carried_or_named(key):
    """adv_tau 0.5: prime-rl writes it as its own key; everywhere else a NOTE says it has no key."""
    p = PRESETS[key]
    snip = export(key, p.export_framework, p.config.replace(adv_tau=0.5))
    doc = read_back(snip.text, snip.filename)
    if any(k.endswith("adv_tau") for k in doc):
        assert snip.exact and 0.5 in [v for k, v in doc.items() if k.endswith("adv_tau")]
    else:
        assert not snip.exact and any(u.startswith("adv_tau=0.5") for u in snip.uncarried), snip.text
        assert all(f"# NOTE: {u}" in snip.text for u in snip.uncarried)


# Score centering in each framework's config (issue 42): the keys the frameworks' code and docs name.
# NeMo-RL: loss_fn.score_centering (nightly; its docs/guides/score-centering.md and API page: the code not read).
# SkyRL #2244 (open): trainer.algorithm.score_centering_topk (SkyRL's score-centering tests configure it; the search
#   index's copies 69204233923 and 70242331882), Marin's fork at 1b5dd6b runs it at 32 with generator logprobs 32.
# Miles #3317 (open; its design read at nanjiangwill/miles@52a21b0, miles/utils/arguments.py add_algo_arguments):
#   --use-score-centering --score-centering-head-size 128 (docs/advanced/score-centering.md there), --use-tis / the
#   IcePop function on both terms.
# prime-rl: [trainer.loss] score_centering = true, [orchestrator.train.sampling] score_centering_top_k = 128 (its docs
#   page "Score centering", the index's copy 70285517586).
SC_KEYS = {
    "nemo-rl/tis-score-centering": {"loss_fn.score_centering": True,
                                    "loss_fn.truncated_importance_sampling_type": "tis"},
    "nemo-rl/icepop-score-centering": {"loss_fn.score_centering": True,
                                       "loss_fn.truncated_importance_sampling_type": "icepop"},
    "skyrl/token_tis_score_centering": {"trainer.algorithm.score_centering_topk": 32,
                                        "generator.sampling_params.logprobs": 32,
                                        "trainer.algorithm.off_policy_correction.tis_ratio_type": "token"},
    "miles/score_centering": {"--use-score-centering": True, "--score-centering-head-size": 128,
                              "--rollout-top-p": 1.0, "--rollout-top-k": -1},
    "miles/score_centering_tis": {"--use-score-centering": True, "--use-tis": True, "--tis-clip": 2.0},
    "miles/score_centering_exact": {"--use-score-centering": True},
    "prime-rl/ipo_score_centering": {"trainer.loss.type": "ipo", "trainer.loss.score_centering": True,
                                     "orchestrator.train.sampling.score_centering_top_k": 128,
                                     "inference.vllm.max_logprobs": 128},
}


@pytest.mark.parametrize("key", sorted(SC_KEYS))
def test_a_score_centering_preset_exports_its_frameworks_keys(key):
    snip = export(key, PRESETS[key].export_framework)
    doc = read_back(snip.text, snip.filename)
    assert snip.expressible and {k: doc.get(k) for k in SC_KEYS[key]} == SC_KEYS[key], snip.text


def test_miles_exact_centering_writes_no_modelled_tail_sampling_and_says_how_it_is_chosen():
    """Miles has no flag for the exact variant: the run's truncated sampling chooses it (its docs page), which the
    snippet cannot know: a NOTE, and the snippet is not exact; the modelled tail writes the sampling it needs."""
    snip = export("miles/score_centering_exact", "miles")
    assert "--rollout-top-p" not in read_back(snip.text, snip.filename)
    assert not snip.exact and [u.split("=")[0] for u in snip.uncarried] == ["use_sampling_support_replay"]
    assert export("miles/score_centering", "miles").exact


def test_every_score_centering_preset_of_a_framework_with_an_exporter_is_checked():
    from seqis.registry import needs_head

    centered = {k for k in OWN if needs_head(k) and PRESETS[k].framework != "verl"}
    assert centered == set(SC_KEYS), centered ^ set(SC_KEYS)


CROSS = [(x, fw) for x in [*ESTIMATORS, *PRESETS] for fw in EXPORTERS
         if not (x in PRESETS and is_own(x, fw))][::7]  # a sample: every seventh pair, every framework


@pytest.mark.parametrize("x,framework", CROSS)
def test_a_cross_export_names_each_part_it_does_not_carry(x, framework):
    """A refusal names every later part the exporter has no setting for; an inexact export a NOTE per difference."""
    comp = resolve(x)
    snip = export(x, framework)
    comments = "\n".join(line for line in snip.text.splitlines() if line.startswith("#"))
    missing = later_parts(comp) - getattr(EXPORTERS[framework], "PARTS", frozenset())
    if not snip.expressible:
        assert f"# cannot express in {framework}: " in comments
        assert all(part in comments for part in missing), (missing, snip.text)
    else:
        assert not missing
        assert snip.exact == (snip.uncarried == ()), snip.text
        assert all(f"# NOTE: {u}" in comments for u in snip.uncarried), snip.text


def test_a_score_centered_composition_in_a_framework_without_it_names_centering():
    """verl's SC preset in TRL: refused by TRL's own rule first, and the centering it lacks is named as well."""
    snip = export("verl/bypass_pg_token_tis_sc", "trl")
    assert not snip.expressible and "centering" in snip.text, snip.text


@pytest.mark.parametrize("key", sorted(k for k in PRESETS if PRESETS[k].framework == "vime"))
def test_vimes_presets_as_miles_flags_carry_the_rule_and_note_the_tail_floors(key):
    """vime has no exporter: its presets are Miles flags through their composition (the same flags for the rule and
    --use-score-centering); vime floors both tails at 1e-6, Miles the sampler's at 0: a NOTE, never silence."""
    cfg = PRESETS[key].config
    snip = export(key, "miles")
    doc = read_back(snip.text, snip.filename)
    assert snip.expressible and not snip.exact and doc["--use-score-centering"] is True
    assert any("tail" in u and "1e-06" in u for u in snip.uncarried), snip.text
    if cfg.use_tis:
        assert (doc["--tis-clip-low"], doc["--tis-clip"]) == (cfg.tis_clip_low, cfg.tis_clip)
        assert ("--custom-tis-function-path" in doc) == cfg.icepop
    else:
        assert "--use-tis" not in doc
