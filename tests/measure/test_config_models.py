"""Models built from a shipped config (workbench.measure.config_models): spec errors are one line, random
weights are deterministic and marked, and a random-weight model runs a one-point sweep with a real model's
columns."""

import pytest
import torch

from workbench import ParameterError
from workbench.experiments import engine_tuning as et
from workbench.measure import config_models, models
from workbench.run import results


def test_config_spec_errors_are_one_line():
    for spec in ("config:", "config:/nonexistent/config.json", "config:NoSuchModel"):
        with pytest.raises(ParameterError, match="^model: "):
            models.resolve_model_path(spec)
    assert set(config_models.shipped()) >= {"SmolLM2-135M", "Qwen3-0.6B", "Llama-3.1-8B"}
    assert models.max_context_tokens("config:Llama-3.1-8B") == 131072


@pytest.mark.model
def test_random_weights_are_deterministic_and_marked():
    a = models.load_model("config:SmolLM2-135M", "cpu", "float32")
    assert a.info.random_weights and "(random weights)" in a.info.name and a.info.weights_sha256.startswith("random-")
    assert a.info.num_layers == 30 and a.info.num_kv_heads == 3 and a.info.head_dim == 64
    w = a.model.model.layers[3].mlp.down_proj.weight[:2, :4].clone()
    models._load_config_model.cache_clear()
    b = models.load_model("config:SmolLM2-135M", "cpu", "float32")
    assert b is not a and torch.equal(b.model.model.layers[3].mlp.down_proj.weight[:2, :4], w)


@pytest.mark.model
def test_a_random_weight_model_runs_a_one_point_sweep_with_a_real_models_columns(loaded):
    def one_point(model):
        cfg = et.Config(device="cpu", model=model, dtypes=["float32"], attn_implementations=["sdpa"],
                        cache_implementations=["dynamic"], prompt_tokens=[32], max_new_tokens=3, repeats=1, warmup=0,
                        guard_prompts=1, guard_tokens=2, guard_text_tokens=64, guard_window=32, calibrate=False)
        run = results.create_run()
        m = models.load_model(model, "cpu", "float32")
        return et.run(cfg, run, m), results.read_manifest(run)

    real, _ = one_point("default")
    rand, manifest = one_point("config:SmolLM2-135M")
    assert len(real) == len(rand) == 1 and (rand["status"] == "ok").all(), rand.get("status")
    assert set(rand.columns) == set(real.columns)
    assert bool(rand["random_weights"].iloc[0]) and not bool(real["random_weights"].iloc[0])
    assert rand["perplexity_ratio"].isna().all() and real["perplexity_ratio"].notna().all()  # quality off
    assert rand["tpot_s_p50"].iloc[0] > 0
    assert "random weights" in str(manifest)
