"""Tests for workbench.techniques.long_form: outlines, sections and the long-output strategies (a fake generator)."""

import time

import pytest

from workbench.errors import ParameterError
from workbench.measure import quality
from workbench.measure.generation import BatchResult
from workbench.techniques.long_form import LongOutputPlan, parse_outline, run_long_output, split_sections, token_stamps

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
    assert quality.sections_with_body(text, split_sections, 10) == 2  # Beta's body is under 10 units
    assert quality.section_coverage(text, 4, split=split_sections, min_body_units=10) == 0.5
    assert quality.section_coverage(text, 1, split=split_sections) == 1.0  # capped at the sections asked
    assert split_sections("just text") == [("", "just text")]
    assert split_sections("## Plan\n1. first step\n2. second step") == [("Plan", "1. first step\n2. second step")]
    assert [h for h, _ in split_sections("1. First\nbody\n2. Second\nmore")] == ["First", "Second"]
    # units: CJK characters count one each
    assert quality.units("Heat 高温 wave") == ["heat", "高", "温", "wave"]
    # repetition: A has 3-grams {abc, bcd}; B {abc, bcx}; -> A shares 1/2, B shares 1/2
    assert quality.cross_section_repetition(["a b c d", "a b c x"]) == pytest.approx(0.5)
    assert quality.cross_section_repetition(["a b c d"]) == 0.0
    assert quality.cross_section_repetition(["p q r", "s t u"]) == 0.0


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
            recs.append({"request_id": i, "text": text, "ttft_s": 0.01 * (i + 1), "output_tokens": 5,
                         "itl_s": [0.002] * 4, "prompt_tokens": 7, "e2e_s": 0.01 * (i + 1) + 0.008,
                         "tpot_s": 0.002, "decode_tps": 500.0, "prefill_s": 0.001})
        return BatchResult(records=recs[::-1], t_submit=time.perf_counter(), wall_s=0.1, preprocess_s=0.0,
                           prefill_s=0.0)


@pytest.mark.parametrize("strategy", ["outline_batch", "outline_sequential"])
def test_outline_strategies_keep_outline_order_with_fewer_sections(strategy):
    gen = FakeGen()
    plan = LongOutputPlan.make(200, 4)
    res = run_long_output(None, strategy, "Heat", plan, generate=gen)
    assert res.titles == ["Alpha", "Beta"]  # model gave 2 of the 4 sections asked
    assert [b.split()[4] for b in res.bodies] == ["Alpha", "Beta"]
    assert res.text.index("## Alpha") < res.text.index("## Beta")
    assert res.row["sections_planned"] == 2 and res.row["sections_found"] == 2 and res.row["coverage"] == 0.5
    assert res.row["output_tokens"] == 5 * 3 and res.row["prompt_tokens_total"] == 7 * 3
    r = res.row  # several requests: no single TTFT / e2e / ITL list under the per-request names
    assert 0 < r["first_text_s"] < r["first_section_s"] and r["wall_s"] > 0  # (the fake's stamps run ahead of wall)
    assert r["ttft_s"] != r["ttft_s"] and r["e2e_s"] != r["e2e_s"] and r["itl_s"] is None
    assert r["prompt_tokens"] == 7  # mean prompt of the requests that shared a forward pass
    # TPOT is a request's own (every fake request: 4 gaps of 2 ms), not the merged text's 1/sections of it
    assert r["tpot_s"] == pytest.approx(0.002)
    assert r["n_requests"] == 3
    assert sum(len(p) * n for p, n in gen.calls) <= 200  # never above the budget
    assert gen.calls[0][1] == plan.outline_tokens
    if strategy == "outline_sequential":
        assert len(gen.calls) == 3 and "previous section" in gen.calls[2][0][0]
        assert r["batch_size"] == 1  # one request at a time
    else:
        assert len(gen.calls) == 2 and len(gen.calls[1][0]) == 2
        assert r["batch_size"] == 2  # the two sections were decoded together


def test_outline_fallback_and_one_shot():
    gen = FakeGen(outline="I cannot make lists.")
    res = run_long_output(None, "outline_batch", "Heat", LongOutputPlan.make(120, 3), generate=gen)
    assert res.titles == ["Part 1", "Part 2", "Part 3"]
    one = run_long_output(None, "one_shot", "Heat", LongOutputPlan.make(120, 2), generate=FakeGen())
    assert one.row["coverage"] == 1.0 and one.row["generate_calls"] == 1
    assert one.row["first_text_s"] == one.row["first_section_s"]
    assert one.row["batch_size"] == 1 and one.row["itl_s"] == [0.002] * 4  # one request: its own timings
    assert len(one.row["itl_s"]) == one.row["output_tokens"] - 1
    with pytest.raises(ParameterError, match="strategy"):
        run_long_output(None, "magic", "Heat", LongOutputPlan.make(120, 2), generate=gen)



def test_token_stamps_rebuild_the_clock_of_each_token():
    b = BatchResult(records=[], t_submit=10.0, wall_s=1.0, preprocess_s=0.0, prefill_s=0.0)
    assert token_stamps(b, {"output_tokens": 3, "ttft_s": 0.5, "itl_s": [0.25, 0.25]}) == [10.5, 10.75, 11.0]
    assert token_stamps(b, {"output_tokens": 0, "ttft_s": float("nan"), "itl_s": []}) == []


@pytest.mark.model
@pytest.mark.parametrize("strategy", ["one_shot", "outline_batch", "outline_sequential"])
def test_long_output_rows_name_their_quantities_on_the_model(loaded, strategy):
    """Issue 11 fault 3: multi-request quantities get their own names; itl_s only where it is one request's."""
    from workbench.measure.generation import generate_measured

    calls = []

    def gen(lm, prompts, settings):
        b = generate_measured(lm, prompts, settings)
        calls.append(b)
        return b

    plan = LongOutputPlan.make(48, 2, 16)
    r = run_long_output(loaded, strategy, "Heat", plan, generate=gen).row
    recs = [rec for b in calls for rec in b.records]
    assert r["output_tokens"] == sum(rec["output_tokens"] for rec in recs)
    assert 0 < r["first_text_s"] <= r["wall_s"]
    if r["itl_s"] is not None:  # the invariant every request row keeps
        assert len(r["itl_s"]) == r["output_tokens"] - 1
    if strategy == "one_shot":
        rec = recs[0]
        assert r["batch_size"] == 1 and r["ttft_s"] == rec["ttft_s"] and r["tpot_s"] == rec["tpot_s"]
    else:
        assert r["itl_s"] is None and r["ttft_s"] != r["ttft_s"]
        section = [rec for b in calls[1:] for rec in b.records]
        assert r["batch_size"] == (len(calls[1].records) if strategy == "outline_batch" else 1)
        shared = section if strategy == "outline_batch" else recs
        tpots = sorted(x["tpot_s"] for x in shared)
        assert tpots[0] <= r["tpot_s"] <= tpots[-1]  # a per-request TPOT, not one over the merged tokens
        merged = (max(rec["e2e_s"] + b.t_submit for b in calls for rec in b.records) -
                  min(rec["ttft_s"] + b.t_submit for b in calls for rec in b.records)) / (r["output_tokens"] - 1)
        if strategy == "outline_batch":
            assert r["tpot_s"] > merged  # the old figure divided the batch's step time by the sections
