"""Memory instruments: KV-cache bytes from the real default model's config (by hand) and the memory tracker on CPU."""
import json

import numpy as np
import pytest

from workbench.measure import memory, models


def _default_info(dtype: str) -> models.ModelInfo:
    """The real :class:`~workbench.measure.models.ModelInfo` of the embedded SmolLM2-135M, its shape read from the shipped
    ``config.json`` (no weights loaded), in ``dtype``."""
    cfg = json.loads((models.default_model_dir() / "config.json").read_text())
    return models.ModelInfo(
        name="SmolLM2-135M-Instruct", path=str(models.default_model_dir()), weights_sha256="", num_params=0,
        num_non_embedding_params=0, weight_bytes=0, dtype=dtype, device="cpu", device_name="cpu",
        max_context_tokens=cfg["max_position_embeddings"], num_layers=cfg["num_hidden_layers"],
        num_kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], hidden_size=cfg["hidden_size"],
        num_heads=cfg["num_attention_heads"])


@pytest.mark.parametrize("dtype,per_token", [("float32", 46080), ("bfloat16", 23040), ("float16", 23040)])
def test_kv_cache_bytes_by_hand(dtype, per_token):
    # SmolLM2-135M (its config: 30 layers, 3 kv heads of 64 dims; 9 query heads share them, GQA):
    # 2 (K, V) x 30 x 3 x 64 x 4 bytes = 46,080 bytes per token in float32, half that in 16-bit types
    info = _default_info(dtype)
    assert info.kv_cache_bytes_per_token() == per_token
    assert memory.kv_cache_bytes(info, 1) == per_token
    assert memory.kv_cache_bytes(info, 1000, batch_size=4) == per_token * 4000


def test_memory_tracker_sees_allocation_on_cpu():
    tr = memory.MemoryTracker("cpu")
    tr.start()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    tr.on_step(None, 0.0)
    assert tr.kind == "rss" and tr.first_step_growth_bytes > 48 * 2**20
    del block
    tr.on_step(None, 0.0)
    assert tr.max_growth_bytes >= tr.first_step_growth_bytes and tr.peak_bytes == tr.max_growth_bytes


def test_malloc_trim_calls_glibc_and_is_a_no_op_elsewhere(monkeypatch):
    import ctypes

    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)
            return 1

    def cdll(name):
        if name != "libc.so.6":
            raise OSError(f"{name}: cannot open shared object file")
        return Libc()

    with monkeypatch.context() as mp:
        mp.setattr(ctypes, "CDLL", cdll)
        assert memory.malloc_trim() is None and calls == [0]      # glibc: malloc_trim(0) returns freed heap
        mp.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError("no glibc here")))
        assert memory.malloc_trim() is None and calls == [0]      # elsewhere: nothing called, nothing raised
    memory.malloc_trim()                                          # and the real call on this machine is safe


@pytest.mark.model
def test_kv_bytes_from_the_config_equal_the_cache_generate_allocates(loaded):
    """Computed KV bytes equal the bytes of the key/value tensors of the cache generate returns."""
    import torch

    from workbench.measure.generation import encode_prompts

    enc = encode_prompts(loaded.tokenizer, ["Hello there, how are you?", "Hi"])
    with torch.inference_mode():
        out = loaded.model.generate(**enc, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                                    return_dict_in_generate=True, pad_token_id=loaded.tokenizer.pad_token_id)
    cache = out.past_key_values
    tensors = []
    for layer in getattr(cache, "layers", []):
        tensors += [layer.keys, layer.values]
    if not tensors:  # older cache layout
        tensors = list(cache.key_cache) + list(cache.value_cache)
    actual = sum(t.numel() * t.element_size() for t in tensors)
    cached_tokens = tensors[0].shape[-2]          # prompt width + new tokens - 1 (the last token is not cached)
    assert cached_tokens == enc["input_ids"].shape[1] + 3 - 1
    assert memory.kv_cache_bytes(loaded.info, cached_tokens, batch_size=2) == actual
    assert loaded.info.kv_cache_bytes_per_token() == _default_info("float32").kv_cache_bytes_per_token()
