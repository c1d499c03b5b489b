"""Quality metrics on hand-made inputs with values computed by hand (English and Chinese)."""
import gzip
import math

import numpy as np
import pandas as pd
import pytest

from workbench.measure import quality


def test_units_words_and_cjk_characters():
    assert quality.units("Hello, World! It's 42.") == ["hello", "world", "it", "s", "42"]
    assert quality.units("我爱北京。Tea 茶") == ["我", "爱", "北", "京", "tea", "茶"]
    assert quality.units("") == []


def test_distinct_n_by_hand():
    # "the cat the cat the dog": 6 words, 3 distinct; bigrams: (the,cat) x2, (cat,the) x2, (the,dog) -> 3/5
    text = "the cat the cat the dog"
    assert quality.distinct_n(text, 1) == pytest.approx(3 / 6)
    assert quality.distinct_n(text, 2) == pytest.approx(3 / 5)
    # Chinese: characters are words. "好好学习好好" -> 好 好 学 习 好 好: 3 distinct of 6; bigrams
    # 好好, 好学, 学习, 习好, 好好 -> 4 distinct of 5
    assert quality.distinct_n("好好学习好好", 1) == pytest.approx(3 / 6)
    assert quality.distinct_n("好好学习好好", 2) == pytest.approx(4 / 5)
    assert math.isnan(quality.distinct_n("one", 2))


def test_repeated_ngram_rate_by_hand():
    # a b c d a b c d: 4-grams abcd, bcda, cdab, dabc, abcd -> 1 repeat of 5
    assert quality.repeated_ngram_rate("a b c d a b c d", 4) == pytest.approx(1 / 5)
    assert quality.repeated_ngram_rate("a b c d e", 4) == 0.0
    # 一二三一二三: 2-grams 一二 二三 三一 一二 二三 -> 2 repeats of 5
    assert quality.repeated_ngram_rate("一二三一二三", 2) == pytest.approx(2 / 5)
    assert math.isnan(quality.repeated_ngram_rate("a b", 4))


def test_compression_ratio():
    text = "ab" * 500
    expected = 1000 / len(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    assert quality.compression_ratio(text) == pytest.approx(expected)
    assert quality.compression_ratio(text) > 10 > quality.compression_ratio("A varied sentence, with few repeats.")
    zh = "重复" * 200
    zipped = gzip.compress(zh.encode(), 9, mtime=0)
    assert quality.compression_ratio(zh) == pytest.approx(len(zh.encode()) / len(zipped))
    assert math.isnan(quality.compression_ratio(""))


def test_section_coverage_numbered_and_titled():
    en = "## Section 1: History\ntext\n1. a list item\n## Section 3: Future\n"
    assert quality.section_coverage(en, 3) == pytest.approx(2 / 3)  # list item "1." does not count as section 2
    assert quality.section_coverage("1. Intro\n2. Body\n", 4) == pytest.approx(2 / 4)
    zh = "## 第一部分：历史\n内容\n## 第2部分：现状\n## 第三部分：展望"
    assert quality.section_coverage(zh, 3) == 1.0
    assert quality.section_coverage("no headings at all", 2) == 0.0
    assert quality.section_coverage("## Section 5: extra", 3) == 0.0
    titles = ["history", "future plans", "costs"]
    assert quality.section_coverage("We cover History and then the Future Plans.", titles) == pytest.approx(2 / 3)
    assert quality.section_coverage("首先谈历史，再谈未来。", ["历史", "未来", "成本"]) == pytest.approx(2 / 3)


def test_exact_and_substring_match():
    assert quality.exact_match("The Paris.", ["paris"]) == 1.0  # article and punctuation dropped (SQuAD)
    assert quality.exact_match("Paris, France", ["Paris"]) == 0.0
    assert quality.substring_match("The capital is Paris, of course.", ["Paris"]) == 1.0
    assert quality.substring_match("There are 17 of them", ["7"]) == 0.0  # whole words only
    assert quality.substring_match("There are 7 of them", ["7", "seven"]) == 1.0
    assert quality.substring_match("中国的首都是北京。", ["北京"]) == 1.0
    assert quality.exact_match("北 京！", ["北京"]) == 1.0
    assert quality.substring_match("上海", ["北京"]) == 0.0
    assert quality.substring_match("H₂O", ["H2O"]) == 1.0  # NFKC folds the subscript


def test_rouge_l_on_words_and_characters():
    # LCS("the cat sat", "the cat") = 2: P = 2/3, R = 1, F = 0.8
    assert quality.rouge_l("the cat sat", "the cat") == pytest.approx(0.8)
    # characters: 北京是首都 vs 北京: LCS 2, P = 2/5, R = 1, F = 2PR/(P+R) = 4/7
    assert quality.rouge_l("北京是首都", "北京") == pytest.approx(4 / 7)


def test_score_output_columns():
    row = quality.score_output("## Section 1: x\nthe cat", "length", n_sections=2)
    assert row["truncated"] == 1.0 and row["section_coverage"] == 0.5 and math.isnan(row["exact_match"])
    row = quality.score_output("Paris", "stop", answers=["Berlin", "Paris"])
    assert row["truncated"] == 0.0 and row["exact_match"] == row["substring_match"] == row["rouge_l"] == 1.0
    assert math.isnan(row["section_coverage"])


class _UniformLM:
    """A fake causal LM whose next-token distribution is uniform over V ids: perplexity is exactly V."""

    def __init__(self, vocab):
        import torch

        self.vocab, self.device = vocab, torch.device("cpu")

    def __call__(self, input_ids, **kwargs):
        import torch

        class Out:
            logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)

        return Out()


def test_perplexity_uniform_model_is_vocab_size():
    from types import SimpleNamespace

    lm = SimpleNamespace(model=_UniformLM(7), tokenizer=SimpleNamespace(pad_token_id=0))
    assert quality.perplexity(lm, [1, 2], [3, 4, 5]) == pytest.approx(7.0)
    assert quality.token_nlls(lm, [1], [2]) == [pytest.approx(math.log(7))]
    assert math.isnan(quality.perplexity(lm, [1], []))


@pytest.mark.model
def test_perplexity_of_greedy_text_is_low(loaded):
    from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured

    rec = generate_measured(loaded, ["Name three colours."], GenerationSettings(max_new_tokens=8)).records[0]
    ids = encode_prompts(loaded.tokenizer, ["Name three colours."])["input_ids"][0].tolist()
    ppl = quality.perplexity(loaded, ids, rec["output_ids"])
    assert 1.0 <= ppl < 10.0  # greedy picks high-probability tokens


def test_perplexities_in_batches_equal_one_pass_each(loaded):
    """The temperature experiment's batched scoring gives each answer the perplexity it gets alone: prompts and
    answers of different lengths (left padding), an empty answer NaN, batches that split the list unevenly."""
    from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured

    texts = ["Name three colours.", "Write one long sentence about the history of the river and its bridges.",
             "Why?"]
    prompts = [encode_prompts(loaded.tokenizer, [t])["input_ids"][0].tolist() for t in texts]
    answers = [generate_measured(loaded, [t], GenerationSettings(max_new_tokens=n, temperature=1.0, seed=3))
               .records[0]["output_ids"] for t, n in zip(texts, (3, 9, 6))]
    prompts, answers = prompts + [prompts[0]], answers + [[]]
    alone = [quality.perplexity(loaded, p, a) for p, a in zip(prompts, answers)]
    batched = quality.perplexities(loaded, prompts, answers, batch_size=3)
    assert math.isnan(alone[-1]) and math.isnan(batched[-1])
    assert batched[:-1] == pytest.approx(alone[:-1], rel=1e-4)
    assert len({round(x, 3) for x in alone[:-1]}) == 3          # three different answers, three different values
    with pytest.raises(ValueError, match="one prompt per answer"):
        quality.perplexities(loaded, prompts, answers[:2])


def test_mean_ci_is_wilson_for_shares_and_t_otherwise():
    from scipy import stats

    mean, lo, hi = quality.mean_ci([0, 1, 1, 0, 1, 1, 1, 0])
    w = stats.binomtest(5, 8).proportion_ci(method="wilson")
    assert (mean, lo, hi) == pytest.approx((5 / 8, w.low, w.high))
    assert quality.mean_ci([0, 0, 0, 0])[2] > 0.3  # no answer right out of 4 does not mean the share is 0
    m, lo, hi = quality.mean_ci([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) / math.sqrt(3)
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    m, lo, hi = quality.mean_ci([3.0, float("nan")])
    assert m == 3.0 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(v) for v in quality.mean_ci([]))


@pytest.mark.parametrize("n", [4, 8])
def test_mean_ci_covers_at_least_90_percent_at_a_few_prompts(n):
    rng = np.random.default_rng(3)
    trials = 2000
    shares = sum(lo <= 0.3 <= hi for _, lo, hi in (quality.mean_ci(rng.random(n) < 0.3) for _ in range(trials)))
    scores = sum(lo <= 0.5 <= hi for _, lo, hi in (quality.mean_ci(rng.normal(0.5, 0.2, n)) for _ in range(trials)))
    assert shares / trials >= 0.90 and scores / trials >= 0.90


def test_summarize_groups_and_metrics():
    df = pd.DataFrame({"temperature": [0, 0, 1, 1], "distinct_1": [0.5, 0.5, 0.8, 1.0], "other": [1, 2, 3, 4]})
    s = quality.summarize(df, ["temperature"])
    assert list(s["metric"].unique()) == ["distinct_1"]
    row = s[s["temperature"] == 1].iloc[0]
    assert row["mean"] == pytest.approx(0.9) and row["n"] == 2 and row["ci_low"] <= 0.9 <= row["ci_high"]
    assert s[s["temperature"] == 0].iloc[0][["mean", "ci_low", "ci_high"]].tolist() == [0.5, 0.5, 0.5]


@pytest.mark.model
def test_continuation_logprobs_batched_equals_alone_and_prefix_cache(loaded):
    """Left-padded batch rows score as if alone; a reused prefix cache gives the same values."""
    import torch

    tok = loaded.tokenizer
    ctx = [tok("The capital of France is")["input_ids"], tok("One, two, three, four, five, six")["input_ids"]]
    cont = [tok(" Paris.")["input_ids"], tok(", seven")["input_ids"]]
    batched = quality.continuation_logprobs(loaded, ctx, cont)
    alone = [quality.continuation_logprobs(loaded, [c], [g])[0] for c, g in zip(ctx, cont)]
    assert [len(x) for x in batched] == [len(g) for g in cont]
    for b, a in zip(batched, alone):
        assert b == pytest.approx(a, abs=1e-3)
    assert all(x < 0 for row in batched for x in row)
    # independent check: log_softmax of a plain forward pass
    ids = torch.tensor([ctx[0] + cont[0]])
    with torch.inference_mode():
        logp = torch.log_softmax(loaded.model(input_ids=ids).logits[0].float(), -1)
    n = len(ctx[0])
    ref = [float(logp[n - 1 + j, t]) for j, t in enumerate(cont[0])]
    assert alone[0] == pytest.approx(ref, abs=1e-4)
    # a prefix cache of the first k context ids
    from transformers import DynamicCache

    k = len(ctx[0]) - 2
    cache = DynamicCache()
    with torch.inference_mode():
        from workbench.measure.generation import cache_kwarg

        loaded.model(input_ids=torch.tensor([ctx[0][:k]]), use_cache=True, **{cache_kwarg(loaded.model): cache})
    cached = quality.continuation_logprobs(loaded, [ctx[0]], [cont[0]], past_key_values=cache, prefix_len=k)[0]
    assert cached == pytest.approx(ref, abs=1e-3)
    assert quality.continuation_logprobs(loaded, [ctx[0]], [[]]) == [[]]
