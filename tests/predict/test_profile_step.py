"""Where a decode step's time goes (workbench.predict.profile_step): operator classes and a real profile."""

import pytest

from workbench.errors import ParameterError
from workbench.predict import profile_step
from workbench.share import ladder as ladder_figures


def test_operators_are_put_in_their_component():
    c = profile_step.component
    assert c("aten::addmm") == c("aten::_weight_int8pack_mm") == c("aten::_weight_int4pack_mm_for_cpu") == "matvec"
    assert c("quantized::linear_dynamic") == "matvec"
    assert c("aten::_scaled_dot_product_flash_attention_for_cpu") == c("aten::index_copy_") == "attention"
    assert c("aten::rsqrt") == c("aten::silu") == c("cpp_fused_add_mean_mul_pow_rsqrt_0") == "norm_activation"
    assert c("aten::argmax") == c("aten::isin") == "sampling"
    assert c("ProfilerStep#1") is None and c("Torch-Compiled Region: 0/0") is None


@pytest.mark.model
def test_a_decode_step_is_split_and_the_figure_stacks_the_rungs(loaded):
    out = profile_step.profile_decode_step(loaded, prompt_tokens=32, steps=2, repeats=3)
    assert set(profile_step.COMPONENTS) <= set(out) and out["matvec"] > 0 and out["step_s"] > 0
    assert all(out[c] >= 0 for c in profile_step.COMPONENTS)
    assert sum(out[c] for c in profile_step.COMPONENTS) == pytest.approx(out["profiled_step_s"])
    assert out["profiled_step_s"] >= out["profiled_s"]
    roof = profile_step.roofline_step_s(loaded, 33, 10e9)
    assert roof == pytest.approx((loaded.info.weight_bytes + 33 * loaded.info.kv_cache_bytes_per_token()) / 10e9)
    import pandas as pd

    table = pd.DataFrame([{"rung": "float32", **out, "roofline_s": roof}])
    fig = ladder_figures.fig_profile(table, reference_s=0.01)
    assert fig.layout.barmode == "stack" and len([t for t in fig.data if t.type == "bar"]) == len(profile_step.COMPONENTS)
    with pytest.raises(ParameterError, match="^steps:"):
        profile_step.profile_decode_step(loaded, steps=1)
