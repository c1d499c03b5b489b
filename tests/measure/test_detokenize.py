"""Tests for workbench.measure.detokenize: incremental detokenising and display granularity."""

import pytest
import torch

from workbench.errors import ParameterError
from workbench.measure.detokenize import DisplayBuffer, Granularity, IncrementalDetokenizer, StreamTap

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
    assert s["display_lag_s_mean"] == pytest.approx(2.5 / 5)


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
def test_first_text_index_waits_for_a_whole_character(loaded):
    from workbench.measure.detokenize import first_text_index

    tok = loaded.tokenizer
    ids = tok.encode("长城", add_special_tokens=False)
    assert len(ids) > 3 and first_text_index(tok, ids) == 2  # 长 is three ids; the first two show nothing
    assert first_text_index(tok, tok.encode(" \n", add_special_tokens=False)) is None  # blank is not text
    assert first_text_index(tok, tok.encode("Hi", add_special_tokens=False)) == 0
