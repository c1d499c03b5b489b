"""Tests for workbench.inputs.haystack: seeded long-context tasks over real text (tokenizer only, no model)."""

import pytest

from workbench.errors import ParameterError
from workbench.inputs import haystack as tasks
from workbench.measure import models


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.default_model_dir())


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("length", [128, 700])
def test_needle_length_answer_and_depth(tok, language, length):
    for depth in (0.0, 0.5, 1.0):
        t = tasks.needle_task(tok, length, depth=depth, seed=3, language=language)
        assert t.kind == "needle" and t.answer.isdigit() and len(t.answer) == 5
        assert t.answer in t.context and t.needle in t.context and t.answer in t.needle
        assert t.context.count(t.answer) == 1
        # measured length: at most the request, within a sentence or so of it
        assert t.context_tokens == n_tokens(tok, t.context)
        assert length - 80 <= t.context_tokens <= length
        # the needle sits near the requested depth (fraction of characters)
        where = t.context.index(t.needle) / max(1, len(t.context) - len(t.needle))
        assert abs(where - depth) < 0.25, (depth, where)
        assert "\ufffd" not in t.context


def test_tasks_are_seeded(tok):
    a = tasks.needle_task(tok, 256, 0.5, seed=1)
    b = tasks.needle_task(tok, 256, 0.5, seed=1)
    c = tasks.needle_task(tok, 256, 0.5, seed=2)
    assert a.context == b.context and a.answer == b.answer
    assert (c.context, c.answer) != (a.context, a.answer)


def test_english_haystack_is_python_docs(tok):
    from pydoc_data.topics import topics

    t = tasks.needle_task(tok, 400, 0.5, seed=0)
    sentence = max(t.context.replace(t.needle, "").split("\n"), key=len).strip()
    assert any(sentence in v for v in topics.values())


def test_chinese_has_no_spaces_or_replacement_chars(tok):
    for kind in tasks.KINDS:
        t = tasks.make_task(kind, tok, 300, depth=0.4, seed=5, language="zh")
        texts = [t.context] if isinstance(t.context, str) else [m["content"] for m in t.context]
        for text in texts + [t.question]:
            assert "\ufffd" not in text and " " not in text


@pytest.mark.parametrize("language", ["en", "zh"])
def test_multikey_distractors(tok, language):
    t = tasks.multikey_task(tok, 400, depth=0.3, seed=4, language=language, n_distractors=3)
    assert len(t.distractors) == 3
    keys = [t.answer] + ["".join(ch for ch in d if ch.isdigit()) for d in t.distractors]
    assert len(set(keys)) == 4  # distinct passkeys
    for d in t.distractors:
        assert d in t.context
    assert t.needle in t.context
    # the question names the target: it shares the needle's name, not a distractor's
    name = t.needle.split(" is ")[0].replace("The passkey for the ", "") if language == "en" else t.needle.split("的")[0]
    assert name in t.question
    for d in t.distractors:
        other = d.split(" is ")[0].replace("The passkey for the ", "") if language == "en" else d.split("的")[0]
        assert other not in t.question


def test_chat_history_fact_in_early_turn(tok):
    t = tasks.chat_task(tok, 500, depth=0.0, seed=2)
    assert isinstance(t.context, list) and t.is_chat
    assert [m["role"] for m in t.context[:4]] == ["user", "assistant", "user", "assistant"]
    assert t.answer in t.context[0]["content"]
    assert all(t.answer not in m["content"] for m in t.context[1:])
    assert t.context_tokens == sum(n_tokens(tok, m["content"]) for m in t.context)
    assert 400 <= t.context_tokens <= 500
    late = tasks.chat_task(tok, 500, depth=0.5, seed=2)
    pos = next(i for i, m in enumerate(late.context) if late.answer in m["content"])
    assert 0 < pos < len(late.context) - 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"context_tokens": 10}, "context_tokens"),
        ({"context_tokens": 256.0}, "context_tokens"),
        ({"depth": 1.5}, "depth"),
        ({"depth": -0.1}, "depth"),
        ({"seed": -1}, "seed"),
        ({"language": "fr"}, "language"),
    ],
)
def test_invalid_parameters_one_line(tok, kwargs, name):
    args = {"context_tokens": 256, "depth": 0.5, "seed": 0, "language": "en", **kwargs}
    with pytest.raises(ParameterError) as err:
        tasks.needle_task(tok, **args)
    msg = str(err.value)
    assert msg.startswith(name + ":") and "\n" not in msg


def test_unknown_kind(tok):
    with pytest.raises(ParameterError, match="^task: must be one of"):
        tasks.make_task("haystack", tok, 256)


def test_record_leaves_out_context(tok):
    rec = tasks.needle_task(tok, 128, 0.5).to_record()
    assert "context" not in rec and rec["kind"] == "needle" and rec["requested_tokens"] == 128
