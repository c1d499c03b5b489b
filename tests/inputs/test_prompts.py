"""Exact-length prompts (English, Chinese, random ids), characters per token, the temperature prompt families."""
import math

import pytest

from workbench import ParameterError
from workbench.inputs import prompts
from workbench.measure.generation import count_prompt_tokens


@pytest.fixture(scope="module")
def tok(loaded):
    return loaded.tokenizer


@pytest.mark.model
@pytest.mark.parametrize("source", ["en", "zh"])
@pytest.mark.parametrize("n", [64, 333, 1024, 4096, 8000])
def test_build_prompt_exact_token_count(tok, source, n):
    text = prompts.build_prompt(tok, n, source=source)
    assert count_prompt_tokens(tok, text, chat=True) == n
    if source == "zh":
        assert "\ufffd" not in text and sum("\u4e00" <= ch <= "\u9fff" for ch in text) > n // 5


@pytest.mark.model
@pytest.mark.parametrize("source", ["en", "zh"])
def test_exact_count_with_instruction_and_without_template(tok, source):
    text = prompts.build_prompt(tok, 300, source=source, instruction="Summarise the text above.")
    assert text.endswith("Summarise the text above.") and count_prompt_tokens(tok, text, chat=True) == 300
    raw = prompts.build_prompt(tok, 300, source=source, chat=False)
    assert count_prompt_tokens(tok, raw, chat=False) == 300


@pytest.mark.model
@pytest.mark.parametrize("source", ["en", "zh"])
def test_batch_rows_differ_and_ids_match_text(tok, source):
    texts = prompts.build_batch(tok, 3, 200, source=source)
    assert len(set(texts)) == 3
    ids = prompts.build_batch_ids(tok, 3, 200, source=source)
    assert [len(x) for x in ids] == [200, 200, 200]


@pytest.mark.model
def test_random_ids_exact_and_seeded(tok):
    a = prompts.build_batch_ids(tok, 2, 150, source="random", seed=1)
    b = prompts.build_batch_ids(tok, 2, 150, source="random", seed=1)
    assert a == b and a[0] != a[1] and [len(x) for x in a] == [150, 150]
    head = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False)
    pre = tok(head.split("x")[0], add_special_tokens=False)["input_ids"]
    assert a[0][: len(pre)] == pre  # the chat template's own ids open the prompt
    body = a[0][len(pre) : len(pre) + 100]
    assert not set(body) & set(tok.all_special_ids) and len(set(body)) > 90  # random, no special ids


@pytest.mark.model
def test_random_batch_is_templated_inside_the_clock(loaded, monkeypatch):
    """Random-token prompts are templated after t_submit, like text prompts: a slow chat template
    (0.2 s) shows in TTFT. Built eagerly (build_batch_ids), the template ran before the clock started."""
    import time

    from workbench.measure.generation import GenerationSettings, generate_measured

    tok = loaded.tokenizer
    batch = prompts.random_batch(tok, 2, 60, seed=3)
    assert batch() == prompts.build_batch_ids(tok, 2, 60, source="random", seed=3)
    real = tok.apply_chat_template
    calls = []

    def slow_template(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(tok, "apply_chat_template", slow_template)
    settings = GenerationSettings(max_new_tokens=2)
    eager = generate_measured(loaded, [""] * 2, settings, input_ids=prompts.build_batch_ids(tok, 2, 60, "random"))
    assert calls and max(calls) < eager.t_submit  # the old path: templated before the clock started
    calls.clear()
    res = generate_measured(loaded, [""] * 2, settings, input_ids=batch)
    assert calls and min(calls) >= res.t_submit and res.preprocess_s >= 0.2
    assert all(r["ttft_s"] >= 0.2 and r["prompt_tokens"] == 60 for r in res.records)
    with pytest.raises(ParameterError, match="^prompt_tokens: "):
        prompts.random_batch(tok, 2, 3)


@pytest.mark.model
def test_bad_requests_are_one_line_errors(tok):
    for call in (
        lambda: prompts.build_prompt(tok, 5),
        lambda: prompts.build_prompt(tok, 100, source="random"),
        lambda: prompts.build_prompt(tok, 100, source="fr"),
        lambda: prompts.build_prompt(tok, 10**6),
        lambda: prompts.random_token_ids(tok, 3),
    ):
        with pytest.raises(ParameterError) as err:
            call()
        assert "\n" not in str(err.value)


def test_zh_source_is_long_enough_for_8k_prompts():
    text = prompts.source_text("zh")
    assert len(text) > 8000 and text.count("\n\n") >= 9


@pytest.mark.model
def test_chars_per_token_and_max_new_tokens(tok):
    text = "hello world " * 50
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    assert prompts.chars_per_token(tok, text=text) == pytest.approx(len(text) / n)
    cpt_en, cpt_zh = prompts.chars_per_token(tok, "en"), prompts.chars_per_token(tok, "zh")
    assert cpt_en > 2 > 1 > cpt_zh > 0.2  # Chinese costs more than one token per character here
    assert prompts.max_new_tokens_for_chars(tok, 1000, "zh", margin=1.0) == math.ceil(1000 / cpt_zh)
    assert prompts.max_new_tokens_for_chars(tok, 1000, "en") == math.ceil(1000 / cpt_en * 1.1)
    with pytest.raises(ParameterError, match="^n_chars:"):
        prompts.max_new_tokens_for_chars(tok, 0)


def test_report_and_factual_families():
    p = prompts.report_prompt("tea", 4, "en")
    assert "4 sections" in p and "## Section k:" in p
    assert "4个部分" in prompts.report_prompt("茶", 4, "zh")
    fam = prompts.report_prompts(2, 3)
    assert [d["language"] for d in fam] == ["en", "en", "zh", "zh"] and all(d["n_sections"] == 3 for d in fam)
    qa = prompts.load_factual_qa()
    assert sum(r["language"] == "en" for r in qa) >= 20 and sum(r["language"] == "zh" for r in qa) >= 20
    assert len({r["id"] for r in qa}) == len(qa)
    fq = prompts.factual_prompts(2, ["zh"])
    assert len(fq) == 2 and fq[0]["answers"] and fq[0]["prompt"].endswith("请用几个字回答。")
    with pytest.raises(ParameterError, match="^n_factual_prompts:"):
        prompts.factual_prompts(99)
    with pytest.raises(ParameterError, match="^language:"):
        prompts.report_prompt("x", 2, "fr")
