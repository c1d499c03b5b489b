"""Measured generation on the real default model: docs/design.md section 4 invariants."""
import math

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from workbench import ParameterError
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.measure.streaming import stream_generate
from workbench.measure.timers import TokenTimer

pytestmark = pytest.mark.model


class ForceTokens(LogitsProcessor):
    """Forces the given ids one per step (then EOS), through generate's own logits-processor hook."""

    def __init__(self, ids, prompt_len, eos_id):
        self.ids, self.prompt_len, self.eos_id = list(ids) + [eos_id], prompt_len, eos_id

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_len
        target = self.ids[min(step, len(self.ids) - 1)]
        forced = torch.full_like(scores, -math.inf)
        forced[:, target] = 0
        return forced


def test_ignore_eos_gives_exact_token_counts_and_timing_identities(loaded):
    s = GenerationSettings(max_new_tokens=6, ignore_eos=True)
    res = generate_measured(loaded, ["Hi", "Tell me about the sea in one long sentence please."], s)
    prompt_len = res.sequences.shape[1] - 6
    for row, rec in enumerate(res.records):
        assert rec["output_tokens"] == 6 == len(rec["output_ids"])
        assert rec["output_ids"] == res.sequences[row, prompt_len:].tolist()
        assert len(rec["itl_s"]) == rec["output_tokens"] - 1
        assert rec["ttft_s"] + sum(rec["itl_s"]) == pytest.approx(rec["e2e_s"], abs=1e-6)
        assert rec["tpot_s"] == pytest.approx((rec["e2e_s"] - rec["ttft_s"]) / 5)
        assert rec["finish_reason"] == "length"
        assert rec["min_new_tokens"] == 6
    # TTFT includes the prefill forward pass; it would be ~ms if the prompt put() counted as a token
    assert res.prefill_s > 0
    assert all(r["ttft_s"] >= res.prefill_s for r in res.records)
    assert res.records[0]["prompt_tokens"] < res.records[1]["prompt_tokens"]


def test_prompt_put_is_not_a_token():
    timer = TokenTimer()
    timer.put(torch.tensor([[1, 2, 3]]))
    assert timer.times == [] and timer.steps == []
    timer.put(torch.tensor([7]))
    assert len(timer.times) == 1 and timer.steps[0].tolist() == [7]


def test_rows_stop_counting_at_eos(loaded):
    eos = loaded.tokenizer.eos_token_id
    res = generate_measured(loaded, ["What is 2+2?"], GenerationSettings(max_new_tokens=40))
    rec = res.records[0]
    if rec["finish_reason"] == "stop":
        assert rec["output_ids"][-1] == eos and eos not in rec["output_ids"][:-1]
    else:
        assert rec["output_tokens"] == 40


def test_batch_row_with_early_eos_excludes_padding(loaded):
    tok = loaded.tokenizer
    short = tok("Paris", add_special_tokens=False)["input_ids"]
    prompt = "Name a city."
    enc_len = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)["input_ids"]
    force = ForceTokens(short, len(enc_len), tok.eos_token_id)
    res = generate_measured(loaded, [prompt], GenerationSettings(max_new_tokens=10), logits_processor=LogitsProcessorList([force]))
    rec = res.records[0]
    assert rec["output_ids"] == short + [tok.eos_token_id]
    assert rec["output_tokens"] == len(short) + 1 and rec["finish_reason"] == "stop"


def test_left_padded_batch_equals_each_prompt_alone(loaded):
    prompts = ["Hi", "Write one sentence about mountains and rivers in spring.", "What is the capital of Italy?"]
    s = GenerationSettings(max_new_tokens=10, ignore_eos=True)
    batch = generate_measured(loaded, prompts, s)
    assert loaded.tokenizer.padding_side == "left"
    for p, rec in zip(prompts, batch.records):
        alone = generate_measured(loaded, [p], s).records[0]
        assert rec["output_ids"] == alone["output_ids"]


def test_temperature_zero_is_greedy_and_seed_independent(loaded):
    a = generate_measured(loaded, ["Name three colours."], GenerationSettings(max_new_tokens=8, seed=1)).records[0]
    b = generate_measured(loaded, ["Name three colours."], GenerationSettings(max_new_tokens=8, seed=2)).records[0]
    assert a["do_sample"] is False and a["temperature"] == 0
    assert a["output_ids"] == b["output_ids"]


def test_sampling_is_reproducible_with_a_seed(loaded):
    s = GenerationSettings(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    a = generate_measured(loaded, ["Write a word."], s).records[0]
    b = generate_measured(loaded, ["Write a word."], s).records[0]
    assert a["do_sample"] is True and a["output_ids"] == b["output_ids"]


@pytest.mark.parametrize("text", ["The quick brown fox, isn't it?", "你好，世界！今天天气很好。", "Party 🎉🙂 time 👍🏽 ok"])
def test_streamed_text_equals_final_decode(loaded, text):
    tok = loaded.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    prompt = "Repeat after me."
    plen = len(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"])
    force = LogitsProcessorList([ForceTokens(ids, plen, tok.eos_token_id)])
    events = list(stream_generate(loaded, prompt, GenerationSettings(max_new_tokens=len(ids) + 2), logits_processor=force))
    pieces = [e.text for e in events]
    record = events[-1].record
    assert "".join(pieces) == record["text"] == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert record["output_tokens"] == len(ids) + 1


def test_stream_generate_real_text(loaded):
    events = list(stream_generate(loaded, "Say hello.", GenerationSettings(max_new_tokens=12)))
    assert "".join(e.text for e in events) == events[-1].record["text"]
    assert events[-1].record["ttft_s"] > 0


@pytest.mark.parametrize("kwargs,name", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
])
def test_invalid_settings_give_one_line_errors(kwargs, name):
    with pytest.raises(ParameterError) as err:
        GenerationSettings(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_character_cut_by_max_new_tokens_is_dropped_from_text_and_stream(loaded):
    tok = loaded.tokenizer
    ids = tok("世界和平与发展🙂", add_special_tokens=False)["input_ids"]
    cut = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
    prompt = "Repeat after me."
    plen = len(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"])
    force = LogitsProcessorList([ForceTokens(ids, plen, tok.eos_token_id)])
    events = list(stream_generate(loaded, prompt, GenerationSettings(max_new_tokens=cut), logits_processor=force))
    record = events[-1].record
    assert record["finish_reason"] == "length" and record["output_tokens"] == cut
    assert "\ufffd" not in record["text"] and tok.decode(ids[:cut]).startswith(record["text"])
    assert "".join(e.text for e in events) == record["text"]


def test_row_stopped_by_a_stopping_criterion_excludes_padding(loaded):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopRow0After3(StoppingCriteria):
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
            done[0] = self.calls >= 3
            return done

    s = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    res = generate_measured(loaded, ["Count to ten.", "Name colours."], s,
                            stopping_criteria=StoppingCriteriaList([StopRow0After3()]))
    r0, r1 = res.records
    assert r0["output_tokens"] == 3 and r0["finish_reason"] == "stop" and len(r0["itl_s"]) == 2
    assert r1["output_tokens"] == 8 and r1["finish_reason"] == "length"
    assert r0["ttft_s"] + sum(r0["itl_s"]) == pytest.approx(r0["e2e_s"], abs=1e-6)


@pytest.mark.model
def test_templating_time_is_in_ttft_not_in_prefill(loaded, monkeypatch):
    """A chat template that sleeps 0.2 s shows in ttft_s (clock starts before templating), not in prefill_s."""
    import time as _time

    from workbench.measure.generation import GenerationSettings, generate_measured

    settings = GenerationSettings(max_new_tokens=3, ignore_eos=True)
    base = generate_measured(loaded, ["Say hi."], settings).records[0]
    original = loaded.tokenizer.apply_chat_template

    def slow(*args, **kwargs):
        _time.sleep(0.2)
        return original(*args, **kwargs)

    monkeypatch.setattr(loaded.tokenizer, "apply_chat_template", slow)
    res = generate_measured(loaded, ["Say hi."], settings)
    rec = res.records[0]
    assert rec["ttft_s"] >= 0.2 + rec["prefill_s"]          # sleep + prefill both inside TTFT
    assert rec["prefill_s"] < 0.2 + base["prefill_s"]        # the sleep is not in the prefill timer
    assert res.preprocess_s >= 0.2


@pytest.mark.model
def test_stamps_match_generated_ids_and_gaps_fit_in_the_wall_time(loaded):
    """One stamp per generated id; the gaps lie within the batch's wall time after prefill."""
    from workbench.measure.generation import GenerationSettings, generate_measured

    res = generate_measured(loaded, ["Count to ten.", "Name a colour."], GenerationSettings(max_new_tokens=6))
    for rec in res.records:
        assert rec["output_tokens"] == len(rec["output_ids"])
        assert len(rec["itl_s"]) == rec["output_tokens"] - 1
        assert sum(rec["itl_s"]) <= res.wall_s - res.prefill_s
        assert rec["ttft_s"] + sum(rec["itl_s"]) == pytest.approx(rec["e2e_s"])


def test_eos_ids_are_the_union_of_config_tokenizer_and_end_of_turn():
    """Configs that disagree still stop: generation config, tokenizer and chat-template end-of-turn ids."""
    from types import SimpleNamespace

    from workbench.measure.generation import eos_token_ids

    vocab = {"<unk>": 0, "<|im_end|>": 7, "<|eot_id|>": 9}          # a tokenizer's one-token lookups: an unknown
    names = {i: t for t, i in vocab.items()}                         # token maps to the unknown-token id
    tok = SimpleNamespace(eos_token_id=2, chat_template="{{ '<|im_end|>' }}{{ '<end_of_turn>' }}",
                          convert_tokens_to_ids=lambda t: vocab.get(t, 0), convert_ids_to_tokens=names.get)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, None]))
    assert eos_token_ids(SimpleNamespace(model=model, tokenizer=tok)) == {2, 5, 7}
    model.generation_config.eos_token_id = None
    assert eos_token_ids(SimpleNamespace(model=model, tokenizer=tok)) == {2, 7}


@pytest.mark.model
def test_closing_a_stream_stops_its_generation(loaded):
    """An abandoned stream does not keep decoding in its thread (and frees the model for the next call)."""
    from workbench.measure.generation import GenerationSettings, generate_measured, model_lock
    from workbench.measure.streaming import stream_generate

    steps = []
    stream = stream_generate(loaded, "Write a long story about a lighthouse.",
                             GenerationSettings(max_new_tokens=200, ignore_eos=True), on_step=lambda ids, t: steps.append(t))
    next(stream)
    stream.close()
    n_at_close = len(steps)
    assert n_at_close < 200
    lock = model_lock(loaded.model)
    assert lock.acquire(timeout=5)   # the generation thread has let go of the model
    lock.release()
    rec = generate_measured(loaded, ["Hi"], GenerationSettings(max_new_tokens=2, ignore_eos=True)).records[0]
    assert rec["output_tokens"] == 2 and len(steps) <= n_at_close + 2


def test_measured_generate_calls_on_one_model_are_serialised():
    """The model lock is re-entrant for its holder, exclusive for other threads, and per model."""
    import threading

    from workbench.measure.generation import model_lock

    class M:
        pass

    a, b = M(), M()
    assert model_lock(a) is model_lock(a) and model_lock(a) is not model_lock(b)
    with model_lock(a):
        got = []
        t = threading.Thread(target=lambda: got.append(model_lock(a).acquire(timeout=0.05)))
        t.start()
        t.join()
        assert got == [False]
        assert model_lock(b).acquire(timeout=0.05)
        model_lock(b).release()


class ForceRowEos(LogitsProcessor):
    """Forces ``ids`` then EOS on row 0 only; the other rows generate freely."""

    def __init__(self, ids, prompt_len, eos_id):
        self.inner = ForceTokens(ids, prompt_len, eos_id)

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:1] = self.inner(input_ids[:1], scores[:1])
        return scores


@pytest.mark.model
def test_real_batch_row_with_early_eos_stops_counting_while_padding_follows(loaded):
    """A real batch: row 0 ends early with EOS, generate pads it while row 1 runs on; padding is not output."""
    tok = loaded.tokenizer
    short = tok("Paris", add_special_tokens=False)["input_ids"]
    prompts = ["Name a city.", "Describe the sea in a long sentence."]
    from workbench.measure.generation import encode_prompts

    width = encode_prompts(tok, prompts)["input_ids"].shape[1]
    s = GenerationSettings(max_new_tokens=8, min_new_tokens=0)
    res = generate_measured(loaded, prompts, s, logits_processor=LogitsProcessorList([ForceRowEos(short, width, tok.eos_token_id)]))
    r0, r1 = res.records
    assert r0["output_ids"] == short + [tok.eos_token_id] and r0["finish_reason"] == "stop"
    assert r0["output_tokens"] == len(short) + 1 and len(r0["itl_s"]) == len(short)
    assert r1["output_tokens"] > r0["output_tokens"]               # the batch ran on after row 0 finished
    tail = res.sequences[0, width + r0["output_tokens"]:].tolist()
    assert tail and set(tail) == {tok.pad_token_id}               # generate padded row 0: none of it counted
    assert r0["e2e_s"] < r1["e2e_s"]


def test_timers_synchronise_cuda_and_mps_before_reading_the_clock(monkeypatch):
    """Apple MPS is asynchronous like CUDA: the timers wait for it (the old timers synchronised CUDA only)."""
    from workbench.measure import device, timers

    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("cuda"))
    device.synchronize("mps")
    device.synchronize("cuda:0")
    device.synchronize("cpu")
    assert calls == ["mps", "cuda"]
    timer = timers.TokenTimer("mps")
    timer.put(torch.tensor([[1, 2]]))
    timer.put(torch.tensor([3]))
    assert calls == ["mps", "cuda", "mps"]


def test_generate_gets_its_settings_in_the_config_not_beside_it(loaded, caplog):
    """transformers deprecates ``generate(generation_config=..., pad_token_id=...)`` ("Passing `generation_config`
    together with generation-related arguments ... will be removed"): the pad token and a speculative setting
    (prompt lookup's ``prompt_lookup_num_tokens``) go in the config, and prompt lookup still runs (its draft steps
    counted)."""
    import logging

    from transformers.utils import logging as hf_logging

    from workbench.inputs import prompts

    hf_logging.warning_once.cache_clear()   # once per process: an earlier test's warning would hide this one's
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            res = generate_measured(loaded, prompts.task_prompts("extract", "en", 1, 300),
                                    GenerationSettings(max_new_tokens=12, ignore_eos=True),
                                    generate_kwargs={"prompt_lookup_num_tokens": 4})
    finally:
        hf_logging.disable_propagation()
    assert not [r for r in caplog.records if "together with generation-related" in r.getMessage()]
    rec = res.records[0]
    assert rec["output_tokens"] == 12 and sum(rec["draft_proposed"]) > 0   # the lookup ran: candidates verified
