"""Memory instruments: KV-cache bytes from the config (by hand) and the memory tracker on CPU."""
from dataclasses import dataclass

import numpy as np
import pytest

from workbench import memory


@dataclass
class _Info:
    num_layers: int = 30
    num_kv_heads: int = 3
    head_dim: int = 64
    dtype: str = "float32"

    def kv_cache_bytes_per_token(self):
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4


def test_kv_cache_bytes_by_hand():
    # SmolLM2-135M: 2 x 30 layers x 3 kv heads x 64 dims x 4 bytes = 46,080 bytes per token
    assert memory.kv_cache_bytes(_Info(), 1) == 46080
    assert memory.kv_cache_bytes(_Info(), 1000, batch_size=4) == 46080 * 4000


def test_memory_tracker_sees_allocation_on_cpu():
    tr = memory.MemoryTracker("cpu")
    tr.start()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    tr.on_step(None, 0.0)
    assert tr.kind == "rss" and tr.first_step_growth_bytes > 48 * 2**20
    del block
    tr.on_step(None, 0.0)
    assert tr.max_growth_bytes >= tr.first_step_growth_bytes and tr.peak_bytes == tr.max_growth_bytes


def test_malloc_trim_is_safe_to_call():
    memory.malloc_trim()  # glibc: returns freed heap; elsewhere a no-op


@pytest.mark.model
def test_kv_bytes_from_the_config_equal_the_cache_generate_allocates(loaded):
    """Computed KV bytes equal the bytes of the key/value tensors of the cache generate returns."""
    import torch

    from workbench.generation import encode_prompts

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
