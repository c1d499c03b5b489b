"""Tests for workbench.streaming: detokenising, display granularity, outlines, long-output strategies."""

from pathlib import Path

import pytest
import torch

from workbench.errors import ParameterError
from workbench.generation import BatchResult, GenerationSettings
from workbench.streaming import (
    DisplayBuffer,
    Granularity,
    IncrementalDetokenizer,
    LongOutputPlan,
    StreamTap,
    cross_section_repetition,
    measure_granularity,
    parse_outline,
    run_long_output,
    section_coverage,
    split_sections,
    text_units,
)

TEXTS = {
    "english": "Streaming text, one token at a time: it's fast!",
    "chinese": "流式输出让用户更早看到文字，汉字常被拆成多个字节。",
    "emoji": "Party 🎉🚀 family 👩‍👩‍👧 sparkle ✨ done",
}


# ------------------------------------------------------------------ display buffers (no model)


def test_granularity_parse():
    assert Granularity.parse("token") == Granularity("token", 1)
    assert Granularity.parse("1 token") == Granularity("token", 1)
    assert Granularity.parse("4 tokens").label == "4 tokens"
    assert Granularity.parse("100 ms") == Granularity("ms", 100.0)
    for bad in ("fast", "0 ms", "-3 tokens", ""):
        with pytest.raises(ParameterError, match="granularity"):
            Granularity.parse(bad)


def test_every_n_tokens_counts_updates_and_lag_by_hand():
    buf = DisplayBuffer("2 tokens")
    outs = [buf.feed(p, t) for p, t in [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0), ("e", 5.0)]]
    assert outs == [None, "ab", None, "cd", None]
    assert buf.close(5.5) == "e"
    assert [u.tokens for u in buf.updates] == [2, 2, 1]
    # lags: a 1.0, b 0.0, c 1.0, d 0.0, e 0.5
    assert buf.lags == pytest.approx([1.0, 0.0, 1.0, 0.0, 0.5])
    s = buf.summary(t_submit=0.0)
    assert s["updates"] == 3 and s["first_display_s"] == 2.0
    assert s["display_lag_mean_s"] == pytest.approx(2.5 / 5)


def test_every_t_ms_flushes_on_first_token_past_the_interval():
    buf = DisplayBuffer("100 ms", t0=0.0)
    stamps = [0.05, 0.08, 0.12, 0.15, 0.26]
    outs = [buf.feed(str(i), t) for i, t in enumerate(stamps)]
    assert outs == [None, None, "012", None, "34"]
    assert buf.close(0.30) is None
    assert buf.lags == pytest.approx([0.07, 0.04, 0.0, 0.11, 0.0])


def test_held_piece_waits_for_the_completing_token():
    buf = DisplayBuffer("token")
    assert buf.feed("", 1.0) is None  # first half of a character
    assert buf.feed("你", 1.5) == "你"
    assert buf.lags == pytest.approx([0.5, 0.0])


# ------------------------------------------------------------------ detokeniser with the real tokenizer


@pytest.mark.model
@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("gran", ["token", "3 tokens", "7 tokens", "1 ms"])
def test_granularity_concatenates_to_final_decode(loaded, name, gran):
    tok = loaded.tokenizer
    ids = tok.encode(TEXTS[name], add_special_tokens=False) + [tok.eos_token_id]
    final = tok.decode(ids, skip_special_tokens=True)
    assert final == TEXTS[name]
    tap = StreamTap(tok, 1, [gran], eos_ids={tok.eos_token_id}, t0=0.0)
    for i, tid in enumerate(ids):
        tap(torch.tensor([tid]), 0.001 * (i + 1))
    tap(torch.tensor([tok.eos_token_id]), 1.0)  # padding after EOS is ignored
    buf = tap.buffers[0][Granularity.parse(gran).label]
    assert buf.text == final
    assert all("\ufffd" not in u.text for u in buf.updates)
    assert buf.n_tokens == len(ids) and len(buf.lags) == len(ids)


@pytest.mark.model
def test_detokenizer_holds_split_characters(loaded):
    tok = loaded.tokenizer
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1  # the emoji is split across byte tokens
    det = IncrementalDetokenizer(tok)
    pieces = [det.push(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🎉"
    assert det.finish() == ""


@pytest.mark.model
def test_stream_cut_inside_a_character_matches_the_record_text(loaded):
    tok = loaded.tokenizer
    ids = tok.encode("ok 🎉", add_special_tokens=False)[:-1]  # the length limit cuts the emoji
    assert tok.decode(ids).endswith("\ufffd")
    tap = StreamTap(tok, 1, ["token", "3 tokens"], eos_ids={tok.eos_token_id})
    for i, tid in enumerate(ids):
        tap(torch.tensor([tid]), float(i))
    tap.close(10.0)
    for lab in ("token", "3 tokens"):
        assert tap.buffers[0][lab].text == tok.decode(ids).rstrip("\ufffd") == "ok "


@pytest.mark.model
def test_measure_granularity_on_the_model(loaded):
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    out = measure_granularity(loaded, ["Say hi.", "用中文说你好。"], settings,
                              ["token", "4 tokens", "50 ms"], repeats=1, warmup=0)
    assert list(out) == ["token", "4 tokens", "50 ms"]
    for lab, m in out.items():
        assert m["extra"]["text_equal"] is True
        for q in m["requests"]:
            assert q["text_equal"] and q["output_tokens"] == 8
            assert 1 <= q["updates"] <= 8
            assert q["first_display_s"] >= q["ttft_s"]
    assert all(q["updates"] <= 2 for q in out["4 tokens"]["requests"])  # 8 / 4
    with pytest.raises(ParameterError):
        measure_granularity(loaded, ["x"], settings, ["token", "1 token"])


# ------------------------------------------------------------------ outlines and quality proxies


@pytest.mark.parametrize("text,expected", [
    ("Here is the outline:\n1. Causes of heat\n   - sub point\n2) **Cooling centres**\n3、Water", ["Causes of heat", "Cooling centres", "Water"]),
    ("- Early warning\n* Shade and trees\n• Night cooling", ["Early warning", "Shade and trees", "Night cooling"]),
    ("一、高温的成因\n二、预警系统\n（三）社区互助", ["高温的成因", "预警系统", "社区互助"]),
    ("第一部分：背景\n第二部分：措施", ["背景", "措施"]),
    ("## Section 1: Intro\n## Section 2: Plan", ["Intro", "Plan"]),
])
def test_parse_outline_formats(text, expected):
    assert parse_outline(text) == expected


def test_parse_outline_fewer_and_more_than_asked():
    assert parse_outline("1. Only one section", 4) == ["Only one section"]
    assert parse_outline("1. a\n2. b\n3. c\n4. d\n5. e", 3) == ["a", "b", "c"]
    assert parse_outline("no list here at all", 3) == []
    assert parse_outline("1. Same\n2. same\n3. Other") == ["Same", "Other"]


def test_split_sections_coverage_and_repetition_by_hand():
    text = "intro line\n## Alpha\none two three four five six seven eight nine ten\n## Beta\nshort\n**Gamma**\n" + \
           "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    secs = split_sections(text)
    assert [h for h, _ in secs] == ["Alpha", "Beta", "Gamma"]
    cov = section_coverage(text, 4)
    assert cov == {"sections_found": 2, "coverage": 0.5}  # Beta's body is under 10 units
    assert split_sections("just text") == [("", "just text")]
    assert split_sections("## Plan\n1. first step\n2. second step") == [("Plan", "1. first step\n2. second step")]
    assert [h for h, _ in split_sections("1. First\nbody\n2. Second\nmore")] == ["First", "Second"]
    # units: CJK characters count one each
    assert text_units("Heat 高温 wave") == ["heat", "高", "温", "wave"]
    # repetition: A has 3-grams {abc, bcd}; B {abc, bcx}; -> A shares 1/2, B shares 1/2
    assert cross_section_repetition(["a b c d", "a b c x"]) == pytest.approx(0.5)
    assert cross_section_repetition(["a b c d"]) == 0.0
    assert cross_section_repetition(["p q r", "s t u"]) == 0.0


def test_plan_splits_the_budget():
    p = LongOutputPlan.make(256, 4)
    assert p.outline_tokens + 4 * p.section_tokens <= 256
    with pytest.raises(ParameterError, match="budget_tokens"):
        LongOutputPlan.make(40, 8)
    with pytest.raises(ParameterError, match="n_sections"):
        LongOutputPlan.make(100, 0)


class FakeGen:
    """Stands in for generate_measured: outlines with two titles, sections echo their title; rows come back reversed."""

    def __init__(self, outline="1. Alpha\n2. Beta"):
        self.outline = outline
        self.calls = []

    def __call__(self, loaded, prompts, settings):
        self.calls.append((list(prompts), settings.max_new_tokens))
        recs = []
        for i, p in enumerate(prompts):
            if "outline" in p and "Write section" not in p:
                text = self.outline
            elif "Write section" in p:
                title = p.split('"')[3]
                text = f"This part is about {title} " + " ".join(f"w{title}{k}" for k in range(12))
            else:
                text = "## Alpha\n" + "a " * 20 + "\n## Beta\n" + "b " * 20
            recs.append({"request_id": i, "text": text, "ttft_s": 0.01 * (i + 1), "output_tokens": 5, "prompt_tokens": 7})
        return BatchResult(records=recs[::-1], t_submit=0.0, wall_s=0.1, preprocess_s=0.0, prefill_s=0.0)


@pytest.mark.parametrize("strategy", ["outline_batch", "outline_sequential"])
def test_outline_strategies_keep_outline_order_with_fewer_sections(strategy):
    gen = FakeGen()
    plan = LongOutputPlan.make(200, 4)
    res = run_long_output(None, strategy, "Heat", plan, generate=gen)
    assert res.titles == ["Alpha", "Beta"]  # model gave 2 of the 4 sections asked
    assert [b.split()[4] for b in res.bodies] == ["Alpha", "Beta"]
    assert res.text.index("## Alpha") < res.text.index("## Beta")
    assert res.row["sections_planned"] == 2 and res.row["sections_found"] == 2 and res.row["coverage"] == 0.5
    assert res.row["output_tokens"] == 5 * 3 and res.row["prompt_tokens"] == 7 * 3
    assert sum(len(p) * n for p, n in gen.calls) <= 200  # never above the budget
    assert gen.calls[0][1] == plan.outline_tokens
    if strategy == "outline_sequential":
        assert len(gen.calls) == 3 and "previous section" in gen.calls[2][0][0]
    else:
        assert len(gen.calls) == 2 and len(gen.calls[1][0]) == 2


def test_outline_fallback_and_one_shot():
    gen = FakeGen(outline="I cannot make lists.")
    res = run_long_output(None, "outline_batch", "Heat", LongOutputPlan.make(120, 3), generate=gen)
    assert res.titles == ["Part 1", "Part 2", "Part 3"]
    one = run_long_output(None, "one_shot", "Heat", LongOutputPlan.make(120, 2), generate=FakeGen())
    assert one.row["coverage"] == 1.0 and one.row["generate_calls"] == 1
    assert one.row["ttft_s"] == one.row["first_section_s"]
    with pytest.raises(ParameterError, match="strategy"):
        run_long_output(None, "magic", "Heat", LongOutputPlan.make(120, 2), generate=gen)


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
QUICK_07 = {"budget_tokens": 48, "n_sections": 2, "outline_tokens": 16, "languages": ["en"],
            "strategies": ["one_shot", "outline_batch", "outline_sequential"], "warmup": 0}


@pytest.mark.notebook
def test_long_output_notebook(tmp_path, monkeypatch):
    from workbench import results, sweeps

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.open_run("", label="nb07")
    sweeps.execute_notebook(NOTEBOOKS / "07_long_output.ipynb", sweeps.validate_parameters(
        NOTEBOOKS / "07_long_output.ipynb", QUICK_07), run, log_output=False)
    req = results.read_requests(run, experiment="long_output")
    assert sorted(req["strategy"]) == sorted(QUICK_07["strategies"])
    assert (req["output_tokens"] <= 48).all() and req["coverage"].between(0, 1).all()
    assert (run / "figures" / "long_output.html").exists()
    texts = sorted(p.name for p in (run / "texts").iterdir())
    assert texts == sorted(f"long_output_{s}_en_r0.md" for s in QUICK_07["strategies"])
