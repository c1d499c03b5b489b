"""Jobs know their model (issue 36): a job continues only on the model, tokenizer, dtype and engine that wrote its
stored token ids (409 naming the difference otherwise); ``exact_resume`` tells the truth; settings the engine
cannot honour are a 400 naming the field before any work."""

import dataclasses
import json
import sqlite3
import types

import httpx
import pytest

from workbench.measure.generation import GenerationSettings
from workbench.serving import engine_kinds
from workbench.serving.job_store import JobError
from workbench.serving.jobs import JobStore, model_identity
from workbench.serving.options import EngineOptions
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _interrupt(db, jid, keep=None):
    """What a killed server leaves: the job interrupted (with only its first ``keep`` tokens stored)."""
    con = sqlite3.connect(db)
    if keep is not None:
        ids = json.loads(con.execute("SELECT output_ids FROM jobs WHERE id=?", (jid,)).fetchone()[0])[:keep]
        con.execute("UPDATE jobs SET output_ids=? WHERE id=?", (json.dumps(ids), jid))
    con.execute("UPDATE jobs SET status='interrupted' WHERE id=?", (jid,))
    con.commit()
    con.close()


def test_a_job_written_on_one_engine_is_not_continued_on_another(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    with ServerThread(loaded, engine="fifo", jobs={"path": db}) as a:
        jid = httpx.post(a.base_url + "/v1/jobs", timeout=60,
                         json={"messages": MESSAGES, "max_tokens": 6, "ignore_eos": True}).json()["id"]
        st = a.app.state.jobs.wait(jid)
        assert st["model"]["engine"] == "fifo" and st["model"]["weights_sha256"] == loaded.info.weights_sha256
        assert st["exact_resume"] is True
    _interrupt(db, jid, keep=3)
    with ServerThread(loaded, engine="static", jobs={"path": db}) as b:
        st = httpx.get(f"{b.base_url}/v1/jobs/{jid}", timeout=30).json()
        assert st["exact_resume"] is False  # not on this server
        r = httpx.post(f"{b.base_url}/v1/jobs/{jid}/continue", timeout=30)
        assert r.status_code == 409, r.text
        msg = r.json()["error"]["message"]
        assert "engine 'fifo' -> 'static'" in msg and "\n" not in msg
        assert httpx.get(f"{b.base_url}/v1/jobs/{jid}", timeout=30).json()["status"] == "interrupted"  # untouched


def test_a_job_written_by_other_weights_is_refused_naming_them(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    with engine_kinds.FifoEngine(loaded) as eng:
        store = JobStore(eng, path=db)
        jid = store.submit({"messages": MESSAGES, "max_tokens": 3})["id"]
        store.wait(jid)
        store.close()
    _interrupt(db, jid)
    other = types.SimpleNamespace(model=loaded.model, tokenizer=loaded.tokenizer,
                                  info=dataclasses.replace(loaded.info, weights_sha256="0" * 16, dtype="bfloat16"))
    with engine_kinds.FifoEngine(other) as eng:
        store = JobStore(eng, path=db)
        try:
            with pytest.raises(JobError) as err:
                store.continue_job(jid)
            assert err.value.status == 409
            assert f"weights_sha256 '{loaded.info.weights_sha256}' -> '{'0' * 16}'" in err.value.message
            assert "dtype 'float32' -> 'bfloat16'" in err.value.message
        finally:
            store.close()


def test_a_job_from_before_identities_is_refused(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    with engine_kinds.FifoEngine(loaded) as eng:
        store = JobStore(eng, path=db)
        jid = store.submit({"messages": MESSAGES, "max_tokens": 2})["id"]
        store.wait(jid)
        store.close()
        con = sqlite3.connect(db)
        con.execute("UPDATE jobs SET status='interrupted', model='' WHERE id=?", (jid,))
        con.commit()
        con.close()
        store = JobStore(eng, path=db)
        try:
            with pytest.raises(JobError) as err:
                store.continue_job(jid)
            assert err.value.status == 409 and "recorded" in err.value.message
        finally:
            store.close()


def test_model_identity_names_path_weights_tokenizer_dtype_engine(loaded):
    with engine_kinds.FifoEngine(loaded) as eng:
        ident = model_identity(loaded, eng)
    assert set(ident) == {"model_path", "weights_sha256", "tokenizer", "dtype", "engine"}
    assert ident["engine"] == "fifo" and ident["dtype"] == "float32" and ident["tokenizer"].count(":") == 2


def test_continuous_engine_seeded_job_is_400_and_a_sampled_job_continues(loaded, tmp_path):
    """Before: a seeded job was 202 then failed, and a sampled job could never be continued on the continuous
    engine (its continuation's seed, seed + stored tokens, is not the engine's one generator's)."""
    db = tmp_path / "jobs.sqlite3"
    eng = engine_kinds.make_engine(EngineOptions(engine="continuous", max_batch_size=2, max_seq_tokens=512), loaded,
                              settings=GenerationSettings(max_new_tokens=8))
    store = JobStore(eng, path=db)
    try:
        with pytest.raises(JobError) as err:
            store.submit({"messages": MESSAGES, "max_tokens": 6, "temperature": 0.8, "seed": 7})
        assert err.value.status == 400 and err.value.param == "seed"
        assert store.list() == []  # nothing stored
        with pytest.raises(JobError) as err:
            store.submit({"strategy": "outline_sequential", "topic": "Tides", "max_tokens": 200, "temperature": 0.8})
        assert err.value.status == 400 and err.value.param == "temperature"
        jid = store.submit({"messages": MESSAGES, "max_tokens": 6, "temperature": 0.8, "ignore_eos": True})["id"]
        assert store.wait(jid)["status"] == "done"
        _interrupt(db, jid, keep=3)
        st = store.continue_job(jid)
        assert st["exact_resume"] is False
        st = store.wait(jid)
        assert st["status"] == "done" and st["output_tokens"] == 6, st
    finally:
        store.close()
        eng.stop()
