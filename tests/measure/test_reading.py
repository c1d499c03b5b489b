"""Tests for workbench.measure.reading: reader metrics from display updates (English, Chinese), per granularity."""

import math

import pytest

from workbench.measure import reading


def test_first_word_and_sentence_english():
    ups = [(1.0, "Hel"), (1.1, "lo"), (1.2, " world"), (1.3, ". Next"), (2.0, " one.")]
    m = reading.reader_metrics(ups, t_submit=0.5)
    assert m["first_word_s"] == pytest.approx(0.7)  # "Hello" complete once the space follows
    assert m["first_sentence_s"] == pytest.approx(0.8)  # ". " ends the first sentence
    assert m["stalls"] == 1 and m["longest_stall_s"] == pytest.approx(0.7)
    assert m["language"] == "en" and m["reading_speed_per_min"] == 238 and "Brysbaert" in m["reading_speed_source"]


def test_chinese_counts_characters_and_full_stops():
    ups = [(0.2, "大"), (0.3, "海很"), (0.4, "蓝。"), (0.5, "我")]
    m = reading.reader_metrics(ups, t_submit=0.0)
    assert m["first_word_s"] == pytest.approx(0.2) and m["first_sentence_s"] == pytest.approx(0.4)
    assert m["language"] == "zh" and m["reading_speed_unit"] == "characters" and "IReST" in m["reading_speed_source"]
    assert m["units"] == 5 and m["stalls"] == 0


def test_end_of_stream_completes_word_and_sentence_and_margin():
    m = reading.reader_metrics([(1.0, "Yes")], t_submit=0.0)
    assert m["first_word_s"] == 1.0 and m["first_sentence_s"] == 1.0 and math.isnan(m["longest_stall_s"])
    # 40 words delivered over 2 s after the first update: 20 words/s against 238/60 words/s
    ups = [(0.0, "start ")] + [(0.05 * (i + 1), "word ") for i in range(40)]
    m = reading.reader_metrics(ups, t_submit=0.0)
    assert m["delivered_units_per_s"] == pytest.approx(20.0) and m["reading_margin"] == pytest.approx(20 / (238 / 60))
    assert m["reader_wait_s"] == 0.0
    slow = [(float(i), "word ") for i in range(5)]  # one word per second: slower than reading
    s = reading.reader_metrics(slow, t_submit=0.0)
    assert s["reading_margin"] < 1 and s["reader_wait_s"] > 0 and s["stalls"] == 4


def test_empty_stream_is_nan():
    m = reading.reader_metrics([], t_submit=0.0)
    assert math.isnan(m["first_word_s"]) and m["stalls"] == 0


@pytest.mark.model
def test_granularities_from_a_token_timeline(loaded):
    tok = loaded.tokenizer
    text = "The sea is calm. 大海很蓝。 🌊 Waves roll in."
    ids = tok.encode(text, add_special_tokens=False)
    stamps = [0.1 * (i + 1) for i in range(len(ids))]
    rows = reading.reader_rows(tok, ids, stamps, 0.0, ["token", "4 tokens", "300 ms"])
    by = {r["granularity"]: r for r in rows}
    assert set(by) == {"token", "4 tokens", "300 ms"}
    for g in by:
        ups = reading.display_updates(tok, ids, stamps, g, 0.0)
        assert "".join(s for _, s in ups) == tok.decode(ids)  # nothing lost on the way to the screen
    assert by["token"]["updates"] > by["4 tokens"]["updates"]
    assert by["token"]["first_word_s"] <= by["4 tokens"]["first_word_s"]
    assert by["300 ms"]["longest_stall_s"] >= 0.3 - 1e-9


def test_chunk_timeline_granularities_count_chunks():
    """An HTTP stream's chunks (one may hold several tokens) are the display units: ``chunk`` shows each chunk
    as it arrives, ``2 chunks`` every second one (the rest at the end), ``100 ms`` the first chunk at least 100 ms
    after the send and then the first one 100 ms after the previous update; the labels say chunks, not tokens."""
    chunks = [(1.00, "The sky"), (1.02, " is"), (1.05, " blue"), (1.30, ". It")]
    rows = {r["granularity"]: r for r in reading.chunk_reader_rows(chunks, 0.85, ["token", "2 tokens", "100 ms"])}
    assert set(rows) == {"chunk", "2 chunks", "100 ms"}
    assert rows["chunk"]["updates"] == 4 and rows["2 chunks"]["updates"] == 2 and rows["100 ms"]["updates"] == 2
    assert rows["chunk"]["first_word_s"] == pytest.approx(0.15)  # "The" is complete in the first chunk
    assert rows["2 chunks"]["first_word_s"] == pytest.approx(0.17)  # shown with the second chunk
    assert rows["chunk"]["first_sentence_s"] == pytest.approx(0.45)
    ups = reading.chunk_display_updates(chunks, "100 ms", 0.85)
    assert [t for t, _ in ups] == [1.00, 1.30] and "".join(x for _, x in ups) == "The sky is blue. It"
    assert reading.chunk_label("4 tokens") == "4 chunks" and reading.chunk_label("250 ms") == "250 ms"
