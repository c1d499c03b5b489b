"""The quality guard (workbench.measure.guard): perplexity / KL against float32 on shipped held-out text."""

import copy
import math

import pytest
import torch

from workbench.errors import ParameterError
from workbench.measure import guard, models, quality


@pytest.fixture(scope="module")
def ref(loaded):
    return guard.reference(loaded, tokens=256, window=64, greedy_prompts=1, greedy_tokens=6)


@pytest.fixture(scope="module")
def damaged(loaded):
    """The model with 30% noise on its projections (:func:`_perturbed`): perplexity well above the limit."""
    return _perturbed(loaded, 0.3)


def _perturbed(loaded, rel: float):
    """A copy of the model with Gaussian noise of ``rel`` x each weight's std added to every attention
    and MLP projection: a stand-in for a quantization that damages the model."""
    model = copy.deepcopy(loaded.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
                w = mod.weight
                w.add_(torch.randn(w.shape, generator=gen) * w.std() * rel)
    return models.LoadedModel(model, loaded.tokenizer, loaded.info)


@pytest.mark.model
def test_held_out_text_ships_both_languages(loaded):
    wins = guard.windows(loaded.tokenizer, ("en", "zh"), tokens=2048, window=256)
    assert [w[0] for w in wins].count("en") == 7 and [w[0] for w in wins].count("zh") == 8  # en ~2,000 ids
    assert all(len(ids) == 256 for _, ids in wins)
    with pytest.raises(ParameterError, match="guard_languages"):
        guard.held_out_text("fr")
    with pytest.raises(ParameterError, match="guard_window"):
        guard.windows(loaded.tokenizer, ("en",), tokens=64, window=128)


def test_limits_are_validated():
    with pytest.raises(ParameterError, match="max_perplexity_ratio"):
        guard.Limits(max_perplexity_ratio=0.9)
    with pytest.raises(ParameterError, match="max_kl_mean"):
        guard.Limits(max_kl_mean=0)


def test_perplexity_has_one_formula():
    assert quality.perplexity_from_nll([1.0, 3.0]) == pytest.approx(math.exp(2.0))
    assert math.isnan(quality.perplexity_from_nll([]))


@pytest.mark.model
def test_the_reference_judged_against_itself_passes_exactly(loaded, ref):
    row = guard.judge(loaded, ref)
    assert set(guard.COLUMNS) <= set(row)
    assert row["perplexity_ratio"] == pytest.approx(1.0) and row["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert row["top1_agreement"] == 1.0 and row["token_agreement"] == 1.0 and row["guard_passed"]
    assert row["perplexity"] == pytest.approx(row["perplexity_ref"]) and row["guard_windows"] == 8


@pytest.mark.model
def test_a_judgement_reuses_the_references_log_probs_and_gives_the_recomputed_numbers(loaded, damaged, monkeypatch):
    """The reference's log-probabilities are kept (2 windows of 64 tokens, well inside the cap): a judgement runs
    the configuration's passes only, and its columns equal those of a judgement that recomputes the reference
    (the cap at 0 bytes keeps nothing)."""
    small = dict(languages=("en",), tokens=128, window=64, greedy_prompts=1, greedy_tokens=4)
    ref = guard.reference(loaded, **small)
    assert ref.log_probs is not None and len(ref.log_probs) == len(ref.windows) == 2
    other = damaged
    calls = []
    real = guard._log_probs
    monkeypatch.setattr(guard, "_log_probs", lambda lm, ids: calls.append(lm.model) or real(lm, ids))
    kept = guard.judge(other, ref)
    assert len(calls) == 2 and all(m is other.model for m in calls)       # no reference pass
    monkeypatch.setattr(guard, "REFERENCE_LOG_PROBS_BYTES", 0)
    bare = guard.reference(loaded, **small)
    assert bare.log_probs is None
    calls.clear()
    again = guard.judge(other, bare)
    assert len(calls) == 4 and sum(m is loaded.model for m in calls) == 2
    assert kept["kl_mean"] > 0                                             # a real difference to carry
    for c in guard.COLUMNS:
        if isinstance(kept[c], float) and math.isnan(kept[c]):
            assert math.isnan(again[c]), c
        else:
            assert kept[c] == again[c], c


@pytest.mark.model
def test_guard_fails_a_perturbation_that_raises_perplexity(damaged, ref):
    row = guard.judge(damaged, ref)
    assert row["perplexity_ratio"] > guard.MAX_PERPLEXITY_RATIO  # the perturbation really hurts
    assert not row["guard_passed"] and "perplexity ratio" in row["guard_reason"]
    assert row["kl_mean"] > 0 and row["top1_agreement"] < 1.0


@pytest.mark.model
def test_guard_passes_torchao_int8_weight_only_on_the_real_model(loaded, ref):
    from workbench.techniques import rungs

    q = rungs.build(loaded, rungs.Rung(quantization="int8_weight_only")).loaded
    row = guard.judge(q, ref)
    assert row["guard_passed"], row["guard_reason"]
    assert 0 < row["kl_mean"] < guard.MAX_KL_MEAN and row["perplexity_ratio_high"] < guard.MAX_PERPLEXITY_RATIO


def test_verdict_uses_the_upper_bound_not_the_estimate():
    row = {"perplexity_ratio": 1.02, "perplexity_ratio_high": 1.08, "kl_mean": 0.01, "kl_mean_high": 0.02}
    v = guard.verdict(row, guard.Limits())
    assert not v["guard_passed"] and "upper 95% bound 1.08" in v["guard_reason"]
    row["perplexity_ratio_high"] = 1.04
    assert guard.verdict(row, guard.Limits())["guard_passed"]
