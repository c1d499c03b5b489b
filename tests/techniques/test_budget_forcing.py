"""Tests for workbench.techniques.budget_forcing: budget forcing, thinking detection, splitting, a measured batch.

The processor is driven by a scripted stand-in for a model (a greedy loop that
mirrors ``generate``: argmax of the processed scores, padding once a row is
finished, stopping criteria after each step). Integration runs use a tiny
random Llama with a test tokenizer that has real ``<think>`` tokens, and the
real default model (``@pytest.mark.model``).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from workbench.errors import ParameterError
from workbench.techniques import budget_batch as B
from workbench.techniques import budget_forcing as R

V = 64
EOS = 0
NATIVE = R.ThinkingFormat("native", (10,), (11,))
EMULATED = R.ThinkingFormat("emulated", (20, 21, 22), (23, 21, 22))
WAIT = [30, 31]
HANDOFF = [40, 41]
NEWLINE = 7


class FakeTok:
    """decode(): token 7 is a newline, anything else one letter."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\n" if i == NEWLINE else "x" for i in ids)


def simulate(fmt, spec, phases, script, steps=None):
    """Greedy decode where ``script(row, step, generated) -> preferred id`` plays the model."""
    proc = R.BudgetForcingProcessor(fmt, spec, WAIT, HANDOFF, {EOS}, phases)
    crit = R.AnswerStoppingCriteria(proc, FakeTok(), spec.answer_tokens, spec.stop_at_newline)
    b = len(phases)
    ids = torch.full((b, 5), 3, dtype=torch.long)  # the "prompt"
    gen = [[] for _ in range(b)]
    unfinished = torch.ones(b, dtype=torch.bool)
    steps = steps or spec.total_new_tokens(fmt, R.PRE in phases)
    for step in range(steps):
        scores = torch.zeros((b, V))
        for r in range(b):
            scores[r, script(r, step, gen[r])] = 5.0
        scores = proc(ids, scores)
        nxt = scores.argmax(-1)
        nxt = torch.where(unfinished, nxt, torch.full_like(nxt, EOS))
        for r in range(b):
            if unfinished[r]:
                gen[r].append(int(nxt[r]))
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        unfinished &= ~(crit(ids) | (nxt == EOS))
        if not unfinished.any():
            break
    return proc, gen


def never_closes(r, step, gen):
    return 5


@pytest.mark.parametrize("fmt", [NATIVE, EMULATED])
@pytest.mark.parametrize("budget", [0, 1, 4, 9])
def test_budget_caps_thinking_at_b_plus_delimiter(fmt, budget):
    spec = R.BudgetSpec(budget=budget, answer_tokens=5, stop_at_newline=False)
    phase = R.THINK if budget else R.ANSWER
    proc, gen = simulate(fmt, spec, [phase, phase], never_closes)
    for row, out in zip(proc.rows, gen):
        k = R.split_thinking(out, fmt, phase, {EOS})
        expected = budget + len(fmt.close_ids) if budget else 0
        assert k == expected  # never-closing model: exactly B body tokens, then the forced delimiter
        assert out[k:k + len(HANDOFF)] == HANDOFF
        assert len(out) - k == spec.answer_tokens  # the answer allowance, fully used
        assert row.stop_reason == "length"


@pytest.mark.parametrize("fmt", [NATIVE, EMULATED])
def test_random_models_respect_max_and_min_budget(fmt):
    rng = random.Random(0)
    for trial in range(40):
        budget = rng.randint(0, 12)
        lo = rng.randint(0, budget)
        spec = R.BudgetSpec(budget=budget, min_budget=lo, answer_tokens=6)
        choices = [5, 6, NEWLINE, EOS, fmt.close_ids[0], *fmt.close_ids, *fmt.open_ids]

        def script(r, step, gen, seed=trial):
            return random.Random(seed * 1000 + r * 100 + step).choice(choices)

        phase = R.THINK if budget else R.ANSWER
        proc, gen = simulate(fmt, spec, [phase] * 3, script)
        for row, out in zip(proc.rows, gen):
            k = R.split_thinking(out, fmt, phase, {EOS})
            assert k <= budget + len(fmt.close_ids)
            if budget == 0:
                assert k == 0
            elif k < len(out) or row.close_end is not None:
                assert k >= lo + len(fmt.close_ids)  # never ended before the minimum
                assert tuple(out[k - len(fmt.close_ids):k]) == fmt.close_ids
            assert len(out) <= spec.total_new_tokens(fmt)
            assert k + (len(out) - k) == len(out)


def test_min_budget_inserts_wait_instead_of_closing():
    spec = R.BudgetSpec(budget=20, min_budget=8, answer_tokens=4, stop_at_newline=False)

    def wants_to_stop(r, step, gen):  # tries to close at step 2, then EOS, then close again
        return {2: 11, 3: EOS}.get(step, 11 if step > 3 else 5)

    proc, gen = simulate(NATIVE, spec, [R.THINK], wants_to_stop)
    out, row = gen[0], proc.rows[0]
    k = R.split_thinking(out, NATIVE, R.THINK, {EOS})
    assert row.waits >= 1 and out[2:4] == WAIT
    assert k - 1 >= 8  # body before the delimiter reaches the minimum
    assert EOS not in out[:k]
    assert not row.forced_close  # the model closed by itself once allowed


def test_budget_holds_when_model_opens_thinking_itself():
    spec = R.BudgetSpec(budget=6, answer_tokens=4, stop_at_newline=False)

    def opens_first(r, step, gen):
        return 10 if step == 0 else 5  # <think>, then thinks forever

    proc, gen = simulate(NATIVE, spec, [R.PRE], opens_first)
    out = gen[0]
    k = R.split_thinking(out, NATIVE, R.PRE, {EOS})
    assert out[0] == 10 and out[k - 1] == 11
    assert k == 1 + 6 + 1  # open + B + close
    assert proc.rows[0].forced_close


def test_budget_zero_bans_native_open():
    spec = R.BudgetSpec(budget=0, answer_tokens=4, stop_at_newline=False)
    proc, gen = simulate(NATIVE, spec, [R.PRE], lambda r, s, g: 10)
    assert 10 not in gen[0]
    assert R.split_thinking(gen[0], NATIVE, R.PRE, {EOS}) == 0


def test_partial_delimiter_is_completed_not_restarted():
    spec = R.BudgetSpec(budget=5, answer_tokens=3, stop_at_newline=False)
    # emulated close is 23 21 22; the model starts it on its 5th body token
    proc, gen = simulate(EMULATED, spec, [R.THINK], lambda r, s, g: 23 if s == 4 else 5)
    out = gen[0]
    assert out[:7] == [5, 5, 5, 5, 23, 21, 22]
    assert R.split_thinking(out, EMULATED, R.THINK, {EOS}) == 7


def test_eos_inside_thinking_closes_it():
    spec = R.BudgetSpec(budget=10, answer_tokens=3, stop_at_newline=False)
    proc, gen = simulate(NATIVE, spec, [R.THINK], lambda r, s, g: EOS if s == 3 else 5)
    assert gen[0][:4] == [5, 5, 5, 11] and gen[0][4:6] == HANDOFF


def test_newline_stop_ends_answer():
    spec = R.BudgetSpec(budget=2, answer_tokens=10)
    proc, gen = simulate(NATIVE, spec, [R.THINK], lambda r, s, g: NEWLINE if s == 7 else 5)
    row = proc.rows[0]
    assert row.stop_reason == "stop" and gen[0][-1] == NEWLINE and len(gen[0]) == 8


def test_split_thinking_cases():
    assert R.split_thinking([5, 5, 11, 40, 6], NATIVE, R.THINK) == 3
    assert R.split_thinking([5, 5, 5], NATIVE, R.THINK) == 3  # never closed: all thinking
    assert R.split_thinking([6, 6], NATIVE, R.PRE) == 0  # never opened: all answer
    assert R.split_thinking([10, 5, 11, 6], NATIVE, R.PRE) == 3
    assert R.split_thinking([11, 6], NATIVE, R.ANSWER) == 0
    assert R.split_thinking([5, 23, 21, 22, 6], EMULATED, R.THINK) == 4


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(budget=-1), "budget"),
        (dict(budget=1.5), "budget"),
        (dict(budget=8, min_budget=9), "min_budget"),
        (dict(budget=8, min_budget=-2), "min_budget"),
        (dict(budget=100, max_new_tokens=64), "budget"),
        (dict(budget=50, answer_tokens=24, max_new_tokens=64), "budget"),
        (dict(budget=8, answer_tokens=0), "answer_tokens"),
    ],
)
def test_invalid_budgets_give_one_line_errors(kwargs, name):
    with pytest.raises(ParameterError) as exc:
        R.BudgetSpec(**kwargs)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{name}: ")


def test_budget_spec_sizes_max_new_tokens():
    spec = R.BudgetSpec(budget=16, answer_tokens=24)
    assert spec.total_new_tokens(EMULATED) == 16 + 3 + 24
    assert spec.total_new_tokens(NATIVE, opens_in_output=True) == 1 + 16 + 1 + 24
    assert R.BudgetSpec(budget=40, answer_tokens=24, max_new_tokens=64).total_new_tokens(NATIVE) == 64


# ----------------------------------------------------------------------------- with tokenizers and models


@pytest.fixture(scope="module")
def default_tokenizer():
    from transformers import AutoTokenizer

    from workbench.measure.models import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.fixture(scope="module")
def think_tokenizer(default_tokenizer):
    """A copy of the default tokenizer with real <think> tokens and a Qwen3-like enable_thinking template."""
    tok = copy.deepcopy(default_tokenizer)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    )
    return tok


def test_detects_native_and_emulated_formats(default_tokenizer, think_tokenizer):
    emu = R.thinking_format(default_tokenizer)
    assert emu.mode == "emulated" and list(emu.close_ids) == default_tokenizer.encode("</think>", add_special_tokens=False)
    assert len(emu.close_ids) > 1
    nat = R.thinking_format(think_tokenizer)
    vocab = think_tokenizer.get_vocab()
    assert nat.mode == "native" and nat.template_flag
    assert nat.open_ids == (vocab["<think>"],) and nat.close_ids == (vocab["</think>"],)
    assert R.thinking_format(think_tokenizer, "emulated").mode == "emulated"
    with pytest.raises(ParameterError, match="^thinking: "):
        R.thinking_format(default_tokenizer, "native")


MESSAGES = ["What is 2 + 3? Answer on one line.", "小明有3个苹果，又买了2个。现在有几个？", "Who is taller, A or B?"]


def test_build_inputs_sets_phases(default_tokenizer, think_tokenizer):
    msgs = MESSAGES[:2]
    nat = R.thinking_format(think_tokenizer)
    _, phases = B.build_inputs(think_tokenizer, msgs, nat, budget=8)
    assert phases == [R.PRE, R.PRE]
    ids, phases = B.build_inputs(think_tokenizer, msgs, nat, budget=0)
    assert phases == [R.ANSWER, R.ANSWER] and nat.close_ids[0] in ids[0]
    emu = R.thinking_format(default_tokenizer)
    ids, phases = B.build_inputs(default_tokenizer, msgs, emu, budget=8)
    assert phases == [R.THINK] * 2 and default_tokenizer.decode(ids[0]).endswith("<think>\n")


class PreferOpenFirst:
    """A scripted model preference run before budget forcing: emit <think> at the first step, never </think>."""

    def __init__(self, open_id, close_id):
        self.open_id, self.close_id, self.step = open_id, close_id, 0

    def __call__(self, input_ids, scores):
        if self.step == 0:
            scores[:, self.open_id] = 1e4
        scores[:, self.close_id] = -1e4 if self.step else scores[:, self.close_id]
        self.step += 1
        return scores


@pytest.fixture(scope="module")
def tiny_native(think_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.measure.models import LoadedModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(think_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      eos_token_id=think_tokenizer.eos_token_id, pad_token_id=think_tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    tok = copy.deepcopy(think_tokenizer)
    tok.padding_side = "left"
    return LoadedModel(model, tok, None)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_native_budget_holds_through_generate(tiny_native, temperature):
    vocab = tiny_native.tokenizer.get_vocab()
    o, c = vocab["<think>"], vocab["</think>"]
    spec = R.BudgetSpec(budget=7, answer_tokens=6)
    batch = B.generate_with_budget(tiny_native, MESSAGES, spec, temperature=temperature,
                                   extra_processors=[PreferOpenFirst(o, c)])
    assert batch.wall_s > 0 and batch.fmt.mode == "native"
    handoff = tiny_native.tokenizer.encode(spec.handoff, add_special_tokens=False)
    for rec, ctx in zip(batch.records, batch.answer_contexts):
        assert rec["thinking_mode"] == "native" and rec["output_ids"][0] == o
        assert rec["thinking_tokens"] == 1 + 7 + 1 and rec["output_ids"][8] == c
        assert rec["forced_close"]
        assert rec["thinking_tokens"] + rec["answer_tokens"] == rec["output_tokens"] == len(rec["output_ids"])
        assert rec["answer_tokens"] <= spec.answer_tokens
        assert rec["ttfat_s"] >= rec["ttft_s"] and rec["e2e_s"] >= rec["ttfat_s"]
        assert rec["e2e_s"] == pytest.approx(rec["ttft_s"] + sum(rec["itl_s"]))
        assert len(rec["itl_s"]) == rec["output_tokens"] - 1
        assert rec["tpot_s"] == pytest.approx((rec["e2e_s"] - rec["ttft_s"]) / (rec["output_tokens"] - 1))
        # the scoring context: prompt, the thinking as generated (closed), then the hand-off phrase
        assert ctx[-len(handoff):] == handoff and ctx[-len(handoff) - 9:-len(handoff)] == rec["output_ids"][:9]


def test_native_budget_zero_has_no_thinking(tiny_native):
    vocab = tiny_native.tokenizer.get_vocab()
    batch = B.generate_with_budget(tiny_native, MESSAGES[:2], R.BudgetSpec(budget=0, answer_tokens=5),
                                   extra_processors=[PreferOpenFirst(vocab["<think>"], vocab["</think>"])])
    for rec in batch.records:
        assert rec["thinking_tokens"] == 0 and rec["answer_tokens"] == rec["output_tokens"] > 0
        assert rec["ttfat_s"] == rec["ttft_s"]


def test_trim_recomputes_timings_with_request_timing():
    """A record cut to its first ids gets the timings request_timing gives for those ids' stamps."""
    from workbench.stats import metrics

    stamps = [0.5, 0.7, 1.0, 1.6, 2.0]
    rec = {**metrics.request_timing(stamps, 0.0), "output_ids": [5, 6, 7, 8, 9], "finish_reason": "length",
           "text": "xxxxx"}
    B._trim(rec, 3, "stop", FakeTok())
    want = metrics.request_timing(stamps[:3], 0.0)
    assert rec["output_ids"] == [5, 6, 7] and rec["finish_reason"] == "stop"
    assert rec["text"] == "xx\n"  # FakeTok decodes id 7 as a newline
    for key in ("output_tokens", "ttft_s", "e2e_s", "tpot_s", "decode_tps"):
        assert rec[key] == pytest.approx(want[key])
    assert rec["itl_s"] == pytest.approx(want["itl_s"])
    rec2 = {**metrics.request_timing(stamps, 0.0), "output_ids": [1] * 5, "finish_reason": "length", "text": ""}
    B._trim(rec2, 5, "stop", FakeTok())
    assert rec2["output_tokens"] == 5 and rec2["finish_reason"] == "stop"  # nothing to cut: only the reason


# ----------------------------------------------------------------------------- delimiters on decoded text (real ids)


def _enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_emulated_close_is_seen_whatever_ids_spell_it(default_tokenizer):
    """`` </think>`` starts with the id of ' </', not of '</': matching the exact id sequence missed it."""
    tok = default_tokenizer
    fmt = R.thinking_format(tok)
    assert _enc(tok, " </think>")[0] != fmt.close_ids[0] and _enc(tok, "\n</think>")[0] != fmt.close_ids[0]
    for close in ("</think>", " </think>", "\n</think>"):
        think = _enc(tok, "Two plus three is five." + close)
        out = think + _enc(tok, "\nAnswer: 5")
        assert R.split_thinking(out, fmt, R.THINK) == len(think), close
    # ids that spell the delimiter differently from the tokenizer's own encoding ('</' + 'think' + '>')
    spelled = _enc(tok, "five.") + [tok.convert_tokens_to_ids("</")] + _enc(tok, "think") + _enc(tok, ">")
    assert R.split_thinking(spelled + _enc(tok, " 5"), fmt, R.THINK) == len(spelled)


def _drive(tok, spec, script, steps=40):
    """Greedy decode over the default tokenizer's whole vocabulary under budget forcing (emulated, prompt
    in thinking). ``script(text) -> preferred id`` plays the model; id of ' ok' is its second choice."""
    fmt = R.thinking_format(tok)
    eos = {tok.eos_token_id}
    proc = R.BudgetForcingProcessor(fmt, spec, _enc(tok, spec.wait), _enc(tok, spec.handoff), eos, [R.THINK])
    crit = R.AnswerStoppingCriteria(proc, tok, spec.answer_tokens, spec.stop_at_newline)
    ids = torch.full((1, 3), 1, dtype=torch.long)
    out: list[int] = []
    second = _enc(tok, " ok")[0]
    for _ in range(steps):
        scores = torch.zeros((1, len(tok)))
        scores[0, second] = 1.0
        scores[0, script(tok.decode(out))] = 5.0
        nxt = int(proc(ids, scores).argmax(-1))
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        if nxt in eos or bool(crit(ids)[0]):
            break
    return fmt, proc.rows[0], out


def test_close_with_a_leading_space_ends_thinking_and_the_answer_cannot_reopen_it(default_tokenizer):
    tok = default_tokenizer
    spec = R.BudgetSpec(budget=20, answer_tokens=8, stop_at_newline=False)
    close = _enc(tok, " </think>")  # ' </', 'think', '>'
    reopen = _enc(tok, "<think>")  # '<', 'think', '>'

    def model(text):
        if "Answer:" not in text:  # thinks two tokens, then writes " </think>"
            n = len(_enc(tok, text))
            return close[n - 2] if 2 <= n < 5 else _enc(tok, " hmm")[0]
        for written, nxt in (("<think", reopen[2]), ("<", reopen[1])):  # then tries to re-open thinking
            if text.endswith(written):
                return nxt
        return reopen[0]

    fmt, row, out = _drive(tok, spec, model)
    k = R.split_thinking(out, fmt, R.THINK)
    assert out[:k][-3:] == close and k == 5 and row.close_end == 5 and not row.forced_close
    answer = tok.decode(out[k:])
    assert answer.startswith("\nAnswer:") and "<think>" not in answer
    assert row.reopen_blocked >= 1  # the model's top choice ('>' after '<think') was banned


def test_min_budget_catches_a_close_with_a_leading_space(default_tokenizer):
    tok = default_tokenizer
    spec = R.BudgetSpec(budget=20, min_budget=8, answer_tokens=6, stop_at_newline=False)
    close = _enc(tok, " </think>")

    def model(text):  # wants to end thinking with " </think>" from its third token on
        n = len(_enc(tok, text))
        if n < 2:
            return _enc(tok, " hmm")[0]
        for written, nxt in ((" </think", close[2]), (" </", close[1])):
            if text.endswith(written):
                return nxt
        return close[0]

    fmt, row, out = _drive(tok, spec, model)
    k = R.split_thinking(out, fmt, R.THINK)
    assert row.waits >= 1 and out[2:2 + len(_enc(tok, spec.wait))] == _enc(tok, spec.wait)
    assert tok.decode(out[:k]).endswith("</think>") and "</think>" not in tok.decode(out[:k - 3])
    assert row.body >= 8 and not row.forced_close
