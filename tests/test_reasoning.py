"""Tests for workbench.reasoning: budget forcing, thinking detection, splitting, tasks and scoring.

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

from workbench import reasoning as R
from workbench.errors import ParameterError

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


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(budgets=[-4]), "budgets"),
        (dict(budgets=[0, 8, 8]), "budgets"),
        (dict(budgets=[0, 8], min_budget=9), "min_budget"),
        (dict(budgets=[0, 16, 64], min_budget=20), "min_budget"),
        (dict(batch_sizes=[0]), "batch_sizes"),
        (dict(thinking="yes"), "thinking"),
        (dict(num_tasks=0), "num_tasks"),
        (dict(task_kinds=["poetry"]), "task_kinds"),
        (dict(budgets=[9000]), "budgets"),
    ],
)
def test_config_rejects_bad_parameters_in_one_line(kwargs, name):
    with pytest.raises(ParameterError) as exc:
        R.ReasoningConfig(**kwargs)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(f"{name}: ")


def test_config_grid_and_specs():
    cfg = R.ReasoningConfig(budgets=[0, 16], batch_sizes=[1, 4], min_budget=4)
    assert cfg.grid() == [{"reasoning_budget": 0, "batch_size": 1}, {"reasoning_budget": 0, "batch_size": 4},
                          {"reasoning_budget": 16, "batch_size": 1}, {"reasoning_budget": 16, "batch_size": 4}]
    assert cfg.spec(0).min_budget == 0 and cfg.spec(16).min_budget == 4


def test_figures_from_tables():
    import pandas as pd

    rows = []
    for b in (0, 8):
        for i in range(4):
            rows.append(dict(reasoning_budget=b, batch_size=2, repeat=0, task_id=f"t{i}", gold="1", prediction="1",
                             exact_match=i % 2 == 0, gold_logprob=-1.0 - i - b / 8, thinking_tokens=0 if b == 0 else 11,
                             answer_tokens=5, ttft_s=0.1, ttfat_s=0.1 + b * 0.01, e2e_s=0.2 + b * 0.01,
                             thinking_text="", answer_text="\nAnswer: 1"))
    req = pd.DataFrame(rows)
    pts = pd.DataFrame([dict(reasoning_budget=b, batch_size=2, status="ok", ttft_s_p50=0.1, ttfat_s_p50=0.1 + b * 0.01,
                             e2e_s_p50=0.2 + b * 0.01, output_throughput_tps=10.0 + b) for b in (0, 8)])
    summary = R.quality_summary(req)
    acc = summary[(summary.metric == "exact_match") & (summary.reasoning_budget == 0)].iloc[0]
    assert acc["mean"] == 0.5 and acc["ci_low"] <= 0.5 <= acc["ci_high"] and acc["n"] == 4
    figs = R.reasoning_figures(pts, req)
    assert list(figs) == ["reasoning_latency_vs_budget", "reasoning_quality_vs_budget", "reasoning_thinking_tokens",
                          "reasoning_throughput_vs_budget"]
    for fig in figs.values():
        assert fig.layout.title.text and len(fig.data) > 0
    assert "## B = 8" in R.examples_markdown(req)


def test_budget_spec_sizes_max_new_tokens():
    spec = R.BudgetSpec(budget=16, answer_tokens=24)
    assert spec.total_new_tokens(EMULATED) == 16 + 3 + 24
    assert spec.total_new_tokens(NATIVE, opens_in_output=True) == 1 + 16 + 1 + 24
    assert R.BudgetSpec(budget=40, answer_tokens=24, max_new_tokens=64).total_new_tokens(NATIVE) == 64


def test_tasks_are_seeded_and_checkable():
    a, b = R.make_tasks(12, seed=3), R.make_tasks(12, seed=3)
    assert a == b and a != R.make_tasks(12, seed=4)
    assert {t.language for t in a} == {"en", "zh"} and {t.kind for t in a} == set(R.TASK_KINDS)
    for t in a:
        if t.kind == "counting" and "letter" in t.question:
            letter, word = t.question.split("'")[1], t.question.split("'")[3]
            assert t.answer == str(word.count(letter))
        if t.kind == "logic":
            assert t.answer in t.choices
    with pytest.raises(ParameterError, match="^languages: "):
        R.make_tasks(2, languages=["fr"])


def test_extract_answer():
    num = R.Task("t", "arithmetic", "en", "q", "15")
    assert R.extract_answer("\nAnswer: 15\n", num) == "15"
    assert R.extract_answer("I think 3. Answer: 1,234", num) == "1234"
    assert R.extract_answer("\nAnswer: none", num) is None
    names = R.Task("t", "logic", "zh", "q", "小强", ("小丽", "小华", "小强"))
    assert R.extract_answer("Answer: 小强比小丽高", names) == "小强"


# ----------------------------------------------------------------------------- with tokenizers and models


@pytest.fixture(scope="module")
def default_tokenizer():
    from transformers import AutoTokenizer

    from workbench.models import default_model_dir

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


def test_build_inputs_sets_phases(default_tokenizer, think_tokenizer):
    tasks = R.make_tasks(2)
    nat = R.thinking_format(think_tokenizer)
    _, phases = R.build_inputs(think_tokenizer, tasks, nat, budget=8)
    assert phases == [R.PRE, R.PRE]
    ids, phases = R.build_inputs(think_tokenizer, tasks, nat, budget=0)
    assert phases == [R.ANSWER, R.ANSWER] and nat.close_ids[0] in ids[0]
    emu = R.thinking_format(default_tokenizer)
    ids, phases = R.build_inputs(default_tokenizer, tasks, emu, budget=8)
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

    from workbench.models import LoadedModel

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
    recs, wall = R.run_reasoning_batch(tiny_native, R.make_tasks(3), spec, temperature=temperature,
                                       extra_processors=[PreferOpenFirst(o, c)])
    assert wall > 0
    for rec in recs:
        assert rec["thinking_mode"] == "native" and rec["output_ids"][0] == o
        assert rec["thinking_tokens"] == 1 + 7 + 1 and rec["output_ids"][8] == c
        assert rec["forced_close"]
        assert rec["thinking_tokens"] + rec["answer_tokens"] == rec["output_tokens"] == len(rec["output_ids"])
        assert rec["answer_tokens"] <= spec.answer_tokens
        assert rec["ttfat_s"] >= rec["ttft_s"] and rec["e2e_s"] >= rec["ttfat_s"]
        assert rec["e2e_s"] == pytest.approx(rec["ttft_s"] + sum(rec["itl_s"]))
        assert rec["gold_logprob"] < 0


def test_native_budget_zero_has_no_thinking(tiny_native):
    vocab = tiny_native.tokenizer.get_vocab()
    recs, _ = R.run_reasoning_batch(tiny_native, R.make_tasks(2), R.BudgetSpec(budget=0, answer_tokens=5),
                                    extra_processors=[PreferOpenFirst(vocab["<think>"], vocab["</think>"])])
    for rec in recs:
        assert rec["thinking_tokens"] == 0 and rec["answer_tokens"] == rec["output_tokens"] > 0
        assert rec["ttfat_s"] == rec["ttft_s"]


@pytest.mark.model
def test_default_model_emulated_budget(loaded):
    tasks = R.make_tasks(2, seed=1)
    close = len(R.thinking_format(loaded.tokenizer).close_ids)
    for budget in (0, 8):
        spec = R.BudgetSpec(budget=budget, answer_tokens=8)
        recs, _ = R.run_reasoning_batch(loaded, tasks, spec)
        for rec in recs:
            assert rec["thinking_mode"] == "emulated"
            assert rec["thinking_tokens"] <= budget + close
            assert (rec["thinking_tokens"] == 0) == (budget == 0)
            assert rec["thinking_tokens"] + rec["answer_tokens"] == rec["output_tokens"]
            assert 0 < rec["answer_tokens"] <= 8
            assert rec["output_ids"][rec["thinking_tokens"]:][:3] == loaded.tokenizer.encode("\nAnswer:")
            assert rec["ttfat_s"] >= rec["ttft_s"]
            assert rec["e2e_s"] == pytest.approx(rec["ttft_s"] + sum(rec["itl_s"]))
            assert rec["finish_reason"] in ("stop", "length") and rec["gold_logprob"] < 0


@pytest.mark.model
def test_gold_logprobs_match_unbatched_forward(loaded):
    tok = loaded.tokenizer
    ctx = [tok.encode("Question: 2 + 3 = ?\nAnswer:"), tok.encode("Count: a b c.\nAnswer:")]
    gold = [tok.encode(" 5"), tok.encode(" 3")]
    batched = R.gold_logprobs(loaded, ctx, gold)
    for c, g, got in zip(ctx, gold, batched):
        with torch.inference_mode():
            logits = loaded.model(torch.tensor([c + g])).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        want = sum(float(lp[len(c) - 1 + i, t]) for i, t in enumerate(g))
        assert got == pytest.approx(want, abs=1e-3)


@pytest.mark.notebook
def test_notebook_runs_quick_and_writes_rows_and_figures():
    from pathlib import Path

    from workbench import results, sweeps

    nb = Path(__file__).resolve().parents[1] / "notebooks" / "05_reasoning_budget.ipynb"
    params = {"budgets": [0, 8], "batch_sizes": [2], "num_tasks": 2, "answer_tokens": 8, "warmup": 0}
    sweeps.validate_parameters(nb, params)
    run = results.open_run()
    sweeps.execute_notebook(nb, params, run, log_output=False)
    points = results.read_points(run, "reasoning")
    assert sorted(points["reasoning_budget"]) == [0, 8] and set(points["status"]) == {"ok"}
    req = results.read_requests(run, "reasoning")
    assert len(req) == 4
    assert (req["thinking_tokens"] + req["answer_tokens"] == req["output_tokens"]).all()
    assert (req.loc[req.reasoning_budget == 0, "thinking_tokens"] == 0).all()
    assert (req["ttfat_s"] >= req["ttft_s"]).all()
    for name in ("reasoning_latency_vs_budget", "reasoning_quality_vs_budget", "reasoning_thinking_tokens",
                 "reasoning_throughput_vs_budget"):
        assert (run / "figures" / f"{name}.html").exists()
    assert (run / "reasoning" / "examples.md").exists()
