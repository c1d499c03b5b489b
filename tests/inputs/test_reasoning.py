"""Tests for workbench.inputs.reasoning: seeded tasks, answer extraction, scoring a batch under a budget.

A tiny random Llama on the default tokenizer (emulated thinking) checks the
scoring columns in seconds; the real default model runs under ``@pytest.mark.model``.
"""

from __future__ import annotations

import pytest
import torch

from workbench.errors import ParameterError
from workbench.inputs import reasoning as R
from workbench.measure import quality
from workbench.techniques import budget_batch, budget_forcing
from workbench.techniques.budget_forcing import BudgetSpec


def test_tasks_are_seeded_and_checkable():
    a, b = R.make_tasks(12, seed=3), R.make_tasks(12, seed=3)
    assert a == b and a != R.make_tasks(12, seed=4)
    assert {t.language for t in a} == {"en", "zh"} and {t.kind for t in a} == set(R.REASONING_KINDS)
    for t in a:
        if t.kind == "counting" and "letter" in t.question:
            letter, word = t.question.split("'")[1], t.question.split("'")[3]
            assert t.answer == str(word.count(letter))
        if t.kind == "logic":
            assert t.answer in t.choices
    with pytest.raises(ParameterError, match="^languages: "):
        R.make_tasks(2, languages=["fr"])
    with pytest.raises(ParameterError, match="^num_tasks: "):
        R.make_tasks(0)


def test_one_step_tasks_have_checkable_answers():
    """lookup / copy / list_count: the gold answer follows from the question text alone, in both languages."""
    import re

    tasks = R.make_tasks(60, seed=7, kinds=["lookup", "copy", "list_count"])
    assert {(t.kind, t.language) for t in tasks} == {(k, lang) for k in ("lookup", "copy", "list_count")
                                                     for lang in ("en", "zh")}
    for t in tasks:
        if t.kind == "lookup":  # "key = value" pairs, then the key asked for
            pairs = dict(re.findall(r"(\w+) = (\d)", t.question))
            asked = re.search(r"for (\w+)\?$", t.question) or re.search(r"。(\w+?)的代码", t.question)
            assert len(pairs) == 3 and len(set(pairs.values())) == 3 and t.answer == pairs[asked.group(1)]
        elif t.kind == "copy":
            assert re.findall(r"\d+", t.question) == [t.answer] and len(t.answer) == 5
        else:
            listed = re.split(r"[:：]", t.question)[1].rstrip("?？")
            items = re.split(r", |、", listed)
            assert t.answer == str(len(items)) and len(set(items)) == len(items) and 2 <= len(items) <= 5
        assert R.extract_answer(f"\nAnswer: {t.answer}\n", t) == t.answer  # the answer format reads back
    assert R.make_tasks(6, seed=1) == R.make_tasks(6, seed=1, kinds=R.REASONING_KINDS)  # old default unchanged
    with pytest.raises(ParameterError, match="^task_kinds: "):
        R.make_tasks(2, kinds=["poetry"])


def test_extract_answer():
    num = R.Task("t", "arithmetic", "en", "q", "15")
    assert R.extract_answer("\nAnswer: 15\n", num) == "15"
    assert R.extract_answer("I think 3. Answer: 1,234", num) == "1234"
    assert R.extract_answer("\nAnswer: none", num) is None
    names = R.Task("t", "logic", "zh", "q", "小强", ("小丽", "小华", "小强"))
    assert R.extract_answer("Answer: 小强比小丽高", names) == "小强"


def test_task_prompt_asks_for_the_answer_format():
    emu = budget_forcing.ThinkingFormat("emulated", (1,), (2,))
    nat = budget_forcing.ThinkingFormat("native", (1,), (2,))
    for t in R.make_tasks(6):
        assert R.task_prompt(t, emu).startswith(t.question) and "<think>" in R.task_prompt(t, emu)
        assert "<think>" not in R.task_prompt(t, nat) and "Answer: <" in R.task_prompt(t, nat)


@pytest.fixture(scope="module")
def tiny_emulated():
    """A 1-layer random Llama with the default tokenizer: emulated thinking, fast on CPU."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workbench.measure.models import LoadedModel, default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    tok.padding_side = "left"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LoadedModel(LlamaForCausalLM(cfg).eval(), tok, None)


def test_run_reasoning_batch_scores_each_request(tiny_emulated):
    tasks = R.make_tasks(3, seed=2)
    spec = BudgetSpec(budget=4, answer_tokens=5)
    recs, wall = R.run_reasoning_batch(tiny_emulated, tasks, spec)
    assert wall > 0 and len(recs) == 3
    for rec, task in zip(recs, tasks):
        assert rec["thinking_mode"] == "emulated" and rec["task_id"] == task.task_id and rec["gold"] == task.answer
        assert rec["prediction"] == R.extract_answer(rec["answer_text"], task)
        want = quality.exact_match(rec["prediction"], [task.answer]) if rec["prediction"] is not None else 0.0
        assert rec["exact_match"] == want and rec["exact_match"] in (0.0, 1.0)
        assert rec["gold_logprob"] < 0 and rec["gold_tokens"] == len(
            tiny_emulated.tokenizer.encode(" " + task.answer, add_special_tokens=False))
    unscored, _ = R.run_reasoning_batch(tiny_emulated, tasks[:1], spec, score=False)
    assert "gold_logprob" not in unscored[0]


def test_gold_logprob_is_the_summed_continuation_logprob(tiny_emulated):
    """gold_logprob = sum of quality.continuation_logprobs of the gold tokens after the answer context."""
    tasks = R.make_tasks(2, seed=5)
    spec = BudgetSpec(budget=3, answer_tokens=4)
    recs, _ = R.run_reasoning_batch(tiny_emulated, tasks, spec)
    batch = budget_batch.generate_with_budget(
        tiny_emulated, [R.task_prompt(t, budget_forcing.thinking_format(tiny_emulated.tokenizer)) for t in tasks], spec)
    tok = tiny_emulated.tokenizer
    golds = [tok.encode(" " + t.answer, add_special_tokens=False) for t in tasks]
    per_token = quality.continuation_logprobs(tiny_emulated, batch.answer_contexts, golds)
    for rec, lp, out in zip(recs, per_token, batch.records):
        assert out["output_ids"] == rec["output_ids"]  # greedy: the same generation
        assert rec["gold_logprob"] == pytest.approx(sum(lp), abs=1e-4)


@pytest.mark.model
def test_default_model_emulated_budget(loaded):
    tasks = R.make_tasks(2, seed=1)
    close = len(budget_forcing.thinking_format(loaded.tokenizer).close_ids)
    for budget in (0, 8):
        spec = BudgetSpec(budget=budget, answer_tokens=8)
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
def test_default_suite_tasks_are_solved_some_of_the_time_at_budget_0(loaded):
    """The default suite's tasks are neither beyond the embedded model nor trivial for it at budget 0, so
    the budget curve can move (the multi-step kinds scored 0% at every budget)."""
    from workbench.run import notebooks

    entry = next(e for e in notebooks.load_suite("default")["notebooks"] if "05_reasoning" in e["notebook"])
    merged = notebooks.validate_parameters(entry["notebook"], entry["parameters"])
    cfg = notebooks.notebook_config_class(entry["notebook"]).from_namespace(merged)
    assert 0 in cfg.budgets
    recs, _ = R.run_reasoning_batch(loaded, cfg.tasks(), cfg.spec(0), cfg.thinking, score=False)
    accuracy = sum(r["exact_match"] for r in recs) / len(recs)
    assert 0 < accuracy < 1


@pytest.mark.model
def test_templating_counts_in_ttft_and_rows_record_their_batch(loaded, monkeypatch):
    """t_submit is read before the chat template runs: a template that sleeps 0.2 s per message shows in
    every row's TTFT (templating used to happen before the clock). Each row records the batch it shared."""
    import time

    from workbench.measure import generation

    tok = loaded.tokenizer
    real_template, real_generate = tok.apply_chat_template, generation.generate_measured
    calls, submits = [], []

    def slow_template(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(0.2)
        return real_template(*args, **kwargs)

    def spy_generate(*args, **kwargs):
        res = real_generate(*args, **kwargs)
        submits.append(res.t_submit)
        return res

    monkeypatch.setattr(tok, "apply_chat_template", slow_template)
    monkeypatch.setattr(generation, "generate_measured", spy_generate)
    recs, wall = R.run_reasoning_batch(loaded, R.make_tasks(2, seed=1), BudgetSpec(budget=0, answer_tokens=2),
                                       score=False)
    assert len(calls) == 2 and len(submits) == 1
    assert submits[0] <= min(calls)  # the clock started before the first message was templated
    assert wall >= 0.4
    for rec in recs:
        assert rec["ttft_s"] >= 0.4 and rec["e2e_s"] >= rec["ttft_s"]  # both sleeps are inside TTFT
        assert rec["batch_size"] == 2


@pytest.mark.model
def test_gold_logprobs_match_unbatched_forward(loaded):
    tok = loaded.tokenizer
    ctx = [tok.encode("Question: 2 + 3 = ?\nAnswer:"), tok.encode("Count: a b c.\nAnswer:")]
    gold = [tok.encode(" 5"), tok.encode(" 3")]
    batched = [sum(lp) for lp in quality.continuation_logprobs(loaded, ctx, gold)]
    for c, g, got in zip(ctx, gold, batched):
        with torch.inference_mode():
            logits = loaded.model(torch.tensor([c + g])).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        want = sum(float(lp[len(c) - 1 + i, t]) for i, t in enumerate(g))
        assert got == pytest.approx(want, abs=1e-3)
