"""Experiment 12: techniques that make decoding faster, each against its baseline with a quality guard
(notebook ``12_speed_techniques``).

Techniques, all through ``transformers``' own ``generate``:

- ``prompt_lookup``: prompt-lookup decoding (``prompt_lookup_num_tokens = k``): the candidate generator
  copies the ``k`` tokens that followed the last matching n-gram of the prompt (or of the output so far);
  no draft model. Pays when the answer quotes its input.
- ``draft``: assisted generation (``assistant_model``) with ``k`` draft tokens per step (constant schedule,
  no confidence cut-off, so every step proposes ``k`` unless the length cap is near). On the embedded
  SmolLM2-135M, the smallest of its family, the draft is a layer-truncated copy of the model sharing its
  embedding, head and tokenizer (:func:`workbench.techniques.speed.truncated_draft`, ``draft_model = "truncated"``);
  it was not trained to exit early, so its acceptance is low and reported as such. A GPU suite names a real
  pair (``draft_model: Qwen/Qwen3-0.6B`` for ``model: Qwen/Qwen3-4B``).
- ``int8_dynamic`` quantization (an engine-tuning-style axis, technique ``none``): ``torch.ao``'s
  ``quantize_dynamic`` on every ``nn.Linear`` (:func:`workbench.techniques.speed.quantize_int8`), with engine tuning's
  quality guard (:mod:`workbench.measure.guard`: perplexity ratio and mean KL divergence against the float32 model on
  held-out text, greedy agreement as the strict view) and MBU from the bytes the quantized model reads per step. torch's dynamic kernels quantize
  each Linear's input activations per call as well (not pure weight-only; torchao's int8 weight-only is not
  installed): that rounding drives the log-prob drift, and the per-call quantize / dequantize work is what can
  make int8 slower than float32 on a CPU where a 135M model's decode is not purely memory bound.

Assisted generation is batch 1 in ``transformers``: ``batch_size > 1`` with a technique is refused before
any model loads, as are ``k <= 0``, a draft whose tokenizer differs from the target's, and a quantization
scheme without a CPU kernel here.

Workloads (:func:`workbench.inputs.prompts.task_prompts`): copy-heavy tasks built from the shipped documentation text (``summarise``,
``extract``: quote sentences, ``edit``: rewrite with one small change), English (Python's pydoc topics) and
Chinese (``data/zh`` essays), next to ``free`` generation (a short story), where there is nothing to copy.

Metrics of a speculative point (:func:`workbench.stats.metrics.acceptance`), from the per-step counts that
:func:`workbench.measure.generation.generate_measured` records (``draft_proposed``: candidates the target verified in
each step, from the target's forward; ``draft_emitted``: ids the step added):

- ``acceptance_rate``: accepted draft tokens / proposed (accepted = emitted - 1 per step: the last id of a
  step is the target's own token);
- ``accepted_length``: mean ids emitted per verification step (1 = no gain);
- ``acceptance_by_position``: for draft position ``i``, steps that accepted it / steps that proposed it;
- ``verify_steps_per_token``: target forwards per output id (1 for plain decoding);
- ``speedup`` (:func:`speed_table`): baseline ``e2e_s`` over the technique's, the ratio of geometric means
  over repeats with a Welch interval (:func:`workbench.stats.evidence.ratio_interval`); int8 is judged on decode
  tokens/s (``decode_tps``) against float32.
- ``speedup_bound``: the simple upper bound of Leviathan et al. 2023 (eq. 1 and theorem 3.8) from the measured
  mean acceptance length ``tau`` over steps that proposed (vLLM's and AIPerf's definition): a step yields
  ``tau`` tokens for ``1 + k c`` target-step costs, ``k`` the mean draft tokens proposed, ``c`` the draft /
  target cost ratio (:func:`workbench.stats.metrics.speedup_bound`). Decode is memory bound, so ``c`` is the draft's
  weight bytes read per step over the target's (0 for prompt lookup) and a verification of ``k + 1`` tokens
  is assumed to cost one decode step; real verification costs more on a CPU, so the measured speed-up sits
  below the bound.

Timing: the ``k`` ids of one verification step share one stamp; ``itl_s`` holds the gaps between
verification steps (:func:`workbench.stats.metrics.step_gaps`, vLLM's and AIPerf's definition); TPOT is e2e minus
TTFT over output ids minus one, as everywhere (:func:`workbench.stats.metrics.request_timing`). Outputs have a fixed
length (``ignore_eos``), so the speed-ups compare equal work. MBU of a speculative point is per verification
step (:func:`workbench.stats.metrics.verification_mbu`). ``prefill_s`` of a speculative point is the first target forward, which
also verifies the first step's candidates.

Entry points: :class:`Config`, :func:`measure_point`, :func:`run`, :func:`speed_table`, :func:`finding`,
:func:`figures`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.techniques import speed
from workbench.measure import contention
from workbench.run import point_result
from workbench import checks
from workbench.stats import comparison, evidence, metrics
from workbench.stats.metrics import acceptance, speedup_bound, verification_mbu
from workbench.measure import guard, models, quality
from workbench.run import results, sweeps
from workbench.predict import roofline
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, check_speculative, generate_measured, warm_up
from workbench.share.plots import label, legend_below, split_by_device
from workbench.inputs.prompts import LANGUAGES, TASKS, build_batch, task_prompts
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig

EXPERIMENT = "speed_techniques"
TECHNIQUES = ("none", "prompt_lookup", "draft")
TRUNCATED = "truncated"


@dataclasses.dataclass
class Config(SweepConfig):
    """The speed-techniques sweep (notebook ``12_speed_techniques``).

    Attributes:
        techniques: from ``none`` (the baseline, always measured), ``prompt_lookup``, ``draft``.
        draft_tokens: draft tokens per verification step ``k`` (each >= 1), for both techniques.
        tasks: from ``summarise``, ``extract``, ``edit`` (copy-heavy) and ``free``.
        languages: ``en`` and / or ``zh``.
        quantizations: from :data:`workbench.techniques.speed.QUANTIZATIONS`; ``none`` is float (the baseline), others
            are measured with technique ``none`` on every task.
        draft_model: ``truncated`` (the target's first ``draft_layers`` layers) or a model spec with the
            target's tokenizer.
        draft_layers: layers of the truncated draft (1 .. the model's layers - 1).
        batch_size: prompts per batch; assisted generation needs 1.
        passage_chars: characters of source text in a copy-heavy prompt (Chinese: a third of it).
        max_new_tokens: new-token cap (>= 2).
        guard_prompts, guard_tokens: the int8 guard's prompts and greedy tokens per prompt.
        guard_text_tokens, guard_window: held-out tokens per language and per window of the guard.
        max_perplexity_ratio, max_kl_mean: the guard's limits (:class:`workbench.measure.guard.Limits`).
    """

    techniques: list = dataclasses.field(default_factory=lambda: ["none", "prompt_lookup", "draft"])
    draft_tokens: list = dataclasses.field(default_factory=lambda: [4])
    tasks: list = dataclasses.field(default_factory=lambda: ["extract", "free"])
    languages: list = dataclasses.field(default_factory=lambda: ["en"])
    quantizations: list = dataclasses.field(default_factory=lambda: ["none", "int8_dynamic"])
    draft_model: str = TRUNCATED
    draft_layers: int = 10
    batch_size: int = 1
    passage_chars: int = 600
    max_new_tokens: int = 32
    repeats: int = 3
    guard_prompts: int = 2
    guard_tokens: int = 16
    guard_text_tokens: int = 512
    guard_window: int = 128
    max_perplexity_ratio: float = guard.MAX_PERPLEXITY_RATIO
    max_kl_mean: float = guard.MAX_KL_MEAN

    def __post_init__(self):
        super().__post_init__()
        checks.check_choice_list("techniques", self.techniques, TECHNIQUES)
        checks.check_int_list("draft_tokens", self.draft_tokens, 1)
        checks.check_choice_list("tasks", self.tasks, TASKS)
        checks.check_choice_list("languages", self.languages, LANGUAGES)
        if not isinstance(self.quantizations, list) or not self.quantizations:
            raise ParameterError(f"quantizations: must be a non-empty list (got {self.quantizations!r})")
        dev = models.pick_device(self.device)
        for q in self.quantizations:
            speed.check_quantization(q, dev)
        checks.check_int("batch_size", self.batch_size, 1)
        for t in self.techniques:
            if t != "none":
                key = "prompt_lookup_num_tokens" if t == "prompt_lookup" else "assistant_model"
                check_speculative(self.batch_size, {key: 1})
        checks.check_int("draft_layers", self.draft_layers, 1)
        checks.check_int("passage_chars", self.passage_chars, 60, 4000)
        checks.check_int("max_new_tokens", self.max_new_tokens, 2)
        checks.check_int("guard_prompts", self.guard_prompts, 1, 8)
        checks.check_int("guard_tokens", self.guard_tokens, 1)
        checks.check_int("guard_text_tokens", self.guard_text_tokens, 32)
        checks.check_int("guard_window", self.guard_window, 16, self.guard_text_tokens)
        guard.Limits(self.max_perplexity_ratio, self.max_kl_mean)
        if not isinstance(self.draft_model, str) or not self.draft_model:
            raise ParameterError("draft_model: 'truncated' or a model directory / cached hub id")
        if "draft" in self.techniques and self.draft_model != TRUNCATED:
            speed.check_draft_tokenizer(self.model, self.draft_model)

    def grid(self) -> list[dict]:
        """Per (task, language): the float baseline first, then each technique x ``k``, then each quantization."""
        out = []
        for task in self.tasks:
            for lang in self.languages:
                base = {"task": task, "language": lang, "technique": "none", "draft_tokens": 0,
                        "quantization": "none"}
                out.append(base)
                out += [{**base, "technique": t, "draft_tokens": int(k)}
                        for t in self.techniques if t != "none" for k in self.draft_tokens]
                out += [{**base, "quantization": q} for q in self.quantizations if q != "none"]
        return out

    def settings(self, max_new_tokens: int | None = None) -> GenerationSettings:
        """Greedy settings at a fixed output length (``ignore_eos``: every technique decodes ``max_new_tokens``
        ids, so an e2e ratio compares equal work; speculative greedy decoding is exact, so outputs are
        comparable token for token)."""
        return GenerationSettings(max_new_tokens=max_new_tokens or self.max_new_tokens, seed=self.seed,
                                  ignore_eos=True)  # a fixed output length: speed-ups compare equal work


# ----------------------------------------------------------------------------- models of a point


def draft_of(loaded, cfg: Config, state: dict):
    """The draft model (memoised in ``state``): the truncated copy or ``cfg.draft_model`` loaded beside the target."""
    if "draft" not in state:
        if cfg.draft_model == TRUNCATED:
            state["draft"] = speed.truncated_draft(loaded, cfg.draft_layers)
        else:
            state["draft"] = models.load_model(cfg.draft_model, cfg.device, cfg.dtype)
    return state["draft"]


def generate_kwargs(point: dict, draft=None) -> dict:
    """``generate`` keywords of a point's technique (the draft's generation config is set to ``k`` here)."""
    k = int(point.get("draft_tokens") or 0)
    if point["technique"] == "prompt_lookup":
        return {"prompt_lookup_num_tokens": k}
    if point["technique"] == "draft":
        gc = draft.model.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
        return {"assistant_model": draft.model}
    return {}


def _peaks(loaded, state: dict) -> dict:
    if "peaks" not in state:
        dev = roofline.Device.probe(loaded.info.device.split(":")[0], loaded.info.dtype)
        state["peaks"] = {"bandwidth_bytes_per_s": dev.bandwidth_bytes_per_s, "flops_per_s": dev.flops_at(None)}
    return state["peaks"]


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One (task, language, technique, k, quantization) point: ``repeats`` greedy batches, timed per token id.

    Args:
        loaded: the float target model.
        cfg: the sweep's config.
        point: a :meth:`Config.grid` entry.
        state: shared by the sweep's points: ``draft`` (:func:`draft_of`), ``quantized`` (per scheme),
            ``guard_reference`` (:func:`workbench.measure.guard.reference` of the float model), ``peaks``.

    Returns:
        :class:`workbench.run.point_result.PointResult`; ``extra`` holds, for a speculative point, :func:`workbench.stats.metrics.acceptance`
        (``acceptance_by_position`` as comma-separated text), ``draft_cost_ratio`` and ``speedup_bound``; for
        a quantized point, the guard's columns, ``weight_bytes`` read per step and ``mbu`` from them.
    """
    model, draft, gen_kwargs, prompts = arm_setup(loaded, cfg, point, state)
    out = sweeps.measure_generation(model, prompts, cfg.settings(), cfg.repeats, cfg.warmup,
                                    generate_kwargs=gen_kwargs or None)
    out.extra = point_extra(loaded, cfg, point, state, out.requests)
    return out


def arm_setup(loaded, cfg: Config, point: dict, state: dict) -> tuple:
    """What measuring a point needs: ``(model, draft or None, generate kwargs, prompts)``; the int8 model and
    the draft are built once per sweep (kept in ``state``)."""
    prompts = task_prompts(point["task"], point["language"], cfg.batch_size, cfg.passage_chars)
    model, draft = loaded, None
    if point["quantization"] != "none":
        model = state.setdefault("quantized", {}).get(point["quantization"])
        if model is None:
            model = state["quantized"][point["quantization"]] = speed.quantize_int8(loaded)
    if point["technique"] == "draft":
        draft = draft_of(loaded, cfg, state)
    return model, draft, generate_kwargs(point, draft), prompts


def point_extra(loaded, cfg: Config, point: dict, state: dict, requests: list[dict]) -> dict:
    """A point's own columns from its measured requests (tagged here with the point's keys): acceptance, the
    bound and MBU per verification step for a speculative point; the guard, weight bytes and MBU for a
    quantized one."""
    model, draft, _, _ = arm_setup(loaded, cfg, point, state)
    extra: dict = {}
    for rec in requests:
        rec.update(task=point["task"], language=point["language"], technique=point["technique"],
                   quantization=point["quantization"])
    if point["technique"] != "none":
        acc = acceptance([r.get("draft_proposed", []) for r in requests],
                         [r.get("draft_emitted", []) for r in requests])
        c = draft.info.weight_bytes / loaded.info.weight_bytes if draft is not None else 0.0
        extra.update({k: v for k, v in acc.items() if k not in ("acceptance_by_position", "output_tokens")},
                     acceptance_by_position=",".join(f"{x:.3f}" for x in acc["acceptance_by_position"]),
                     draft_cost_ratio=c,
                     speedup_bound=speedup_bound(acc["mean_acceptance_length"], acc["mean_draft_tokens"], c))
        extra.update(verification_mbu(loaded, requests, acc, draft, _peaks(loaded, state)))
        if draft is not None:
            extra["draft_name"] = draft.info.name
    if point["quantization"] != "none":
        if "guard_reference" not in state:
            state["guard_reference"] = guard.reference(loaded, tokens=cfg.guard_text_tokens, window=cfg.guard_window,
                                                       greedy_prompts=cfg.guard_prompts, greedy_tokens=cfg.guard_tokens)
        extra.update(guard.judge(model, state["guard_reference"],
                                 guard.Limits(cfg.max_perplexity_ratio, cfg.max_kl_mean)))
        extra["weight_bytes"] = model.info.weight_bytes
        req = pd.DataFrame(requests)
        done = req[req["output_tokens"] >= 2]
        summary = {f"{c}_p50": metrics.percentiles(done[c].tolist(), (50,))["p50"] for c in ("tpot_s", "prefill_s")}
        extra.update(metrics.utilisation(req, summary, model.info, _peaks(loaded, state)))
    else:
        extra["weight_bytes"] = loaded.info.weight_bytes
    return extra


def measure_interleaved(loaded, cfg: Config, points: list[dict], state: dict) -> dict[str, PointResult]:
    """Measure every point of the grid as interleaved arms (:mod:`workbench.stats.comparison`), with the A/A control.

    Every round measures every point once (each workload's baseline, techniques and quantizations, across
    workloads) plus the first workload's baseline a second time (:data:`workbench.stats.comparison.AA`: the
    experiment's noise floor), in an order shuffled per round from ``cfg.seed``; ``cfg.repeats`` rounds, round
    ``r`` at seed ``cfg.seed + r``. Each arm warms up ``cfg.warmup`` times before round 0. Per workload, each
    arm is judged against its baseline from the paired within-round ratios, Holm over that workload's arms:
    speculative arms on request speed (baseline ``e2e_s`` / the arm's, a fixed output length), quantized ones
    on ``decode_tps``.

    Returns:
        ``{point_id: PointResult}``: requests (``repeat`` = round), ``extra`` with :func:`point_extra`'s columns,
        ``speedup`` / ``speedup_low`` / ``speedup_high`` / ``speedup_p_holm`` (NaN for a baseline) and the A/A
        columns (:data:`workbench.stats.comparison.COLUMNS`); ``contamination`` over all rounds.
    """
    settings = cfg.settings()
    pids = [point_result.point_id(EXPERIMENT, p) for p in points]
    by_pid = dict(zip(pids, points))
    is_base = {pid: p["technique"] == "none" and p["quantization"] == "none" for pid, p in by_pid.items()}
    first_base = next((pid for pid in pids if is_base[pid]), None)
    arms = pids + ([comparison.AA] if first_base else [])
    monitor = contention.LoadMonitor()
    setup, got = {}, {pid: {"requests": [], "wall_s": 0.0} for pid in pids}
    for pid in pids:
        setup[pid] = arm_setup(loaded, cfg, by_pid[pid], state)
        model, _, kw, prompts = setup[pid]
        got[pid]["warmup_s"] = warm_up(model, prompts, settings, cfg.warmup, generate_kwargs=kw or None)
    rows = []
    for rnd, arm in comparison.schedule(arms, cfg.repeats, cfg.seed):
        pid = first_base if arm == comparison.AA else arm
        model, _, kw, prompts = setup[pid]
        res = generate_measured(model, prompts, dataclasses.replace(settings, seed=cfg.seed + rnd),
                                generate_kwargs=kw or None)
        done = [r for r in res.records if r.get("output_tokens", 0) >= 1]
        e2e = sum(r["e2e_s"] for r in done) / len(done) if done else float("nan")
        tps = [r["decode_tps"] for r in done if r.get("decode_tps") == r.get("decode_tps")]
        rows.append({"arm": arm, "round": rnd, "speed": 1.0 / e2e if e2e > 0 else float("nan"),
                     "decode_tps": float(np.mean(tps)) if tps else float("nan")})
        if arm != comparison.AA:
            for rec in res.records:
                rec.update(repeat=rnd, batch_size=len(prompts), batch_wall_s=res.wall_s)
            got[pid]["requests"] += res.records
            got[pid]["wall_s"] += res.wall_s
    contamination = monitor.stop()
    table = pd.DataFrame(rows)
    verdicts, aa_cols = {}, {}
    for key in dict.fromkeys((p["task"], p["language"]) for p in points):
        mine = [pid for pid in pids if (by_pid[pid]["task"], by_pid[pid]["language"]) == key]
        base = next((pid for pid in mine if is_base[pid]), None)
        if base is None:
            continue
        spec = [pid for pid in mine if by_pid[pid]["technique"] != "none"]
        quant = [pid for pid in mine if by_pid[pid]["technique"] == "none" and not is_base[pid]]
        aa = comparison.AA if base == first_base else None
        # one family per workload: speculative arms on speed, quantized ones on decode tokens/s, Holm over both
        sub = table[table["arm"].isin([base, *spec, *quant, comparison.AA])]
        both = pd.concat([sub[sub["arm"].isin([base, *spec, comparison.AA])].assign(value=lambda d: d["speed"]),
                          sub[sub["arm"].isin(quant)].assign(value=lambda d: d["decode_tps"])])
        if quant:  # the baseline's decode tokens/s under another name, so each quantized arm pairs with it
            both = pd.concat([both, sub[sub["arm"] == base].assign(arm="_base_tps", value=lambda d: d["decode_tps"])])
        c_speed = comparison.compare(both[both["arm"].isin([base, *spec, comparison.AA])], base, aa, adjust=False)
        c_quant = (comparison.compare(both[both["arm"].isin(["_base_tps", *quant])], "_base_tps", None, adjust=False)
                   if quant else None)
        results_ = {**c_speed.arms, **(c_quant.arms if c_quant else {})}
        ps = [results_[pid].p for pid in [*spec, *quant]]
        adjusted, levels = evidence.holm(ps), evidence.holm_levels(ps)
        for pid, pa, level in zip([*spec, *quant], adjusted, levels):
            num, den = _pairs(both, pid, "_base_tps" if pid in quant else base)
            iv = evidence.paired_ratio_interval(num, den, level, "rounds")
            verdicts[pid] = (iv, pa)
        if aa is not None:
            aa_cols = c_speed.columns()
    out = {}
    for pid, p in by_pid.items():
        iv, pa = verdicts.get(pid, (None, float("nan")))
        nan = float("nan")
        sp = {"speedup": iv.estimate if iv else nan, "speedup_low": iv.low if iv else nan,
              "speedup_high": iv.high if iv else nan, "speedup_p_holm": pa,
              "speedup_method": (f"{iv.method}, Holm-adjusted p {pa:.3g}" if iv and iv.shown else
                                 (iv.reason if iv else ""))}
        no_aa = {"aa_ratio": nan, "aa_low": nan, "aa_high": nan, "design": "interleaved", "rounds": cfg.repeats,
                 "round_drift": nan}
        extra = {**point_extra(loaded, cfg, p, state, got[pid]["requests"]), **sp, **(aa_cols or no_aa)}
        out[pid] = PointResult(requests=got[pid]["requests"], wall_s=got[pid]["wall_s"],
                               warmup_s=got[pid]["warmup_s"], extra=extra, contamination=contamination)
    return out


def _pairs(both: pd.DataFrame, arm, base) -> tuple:
    """Per round, an arm's value and its baseline's (rounds where both were measured)."""
    a = both[both["arm"] == arm].groupby("round")["value"].mean()
    b = both[both["arm"] == base].groupby("round")["value"].mean()
    common = a.index.intersection(b.index)
    return a.loc[common].to_numpy(), b.loc[common].to_numpy()


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every point of ``cfg.grid()`` through :func:`workbench.run.sweeps.run_sweep`; returns the points DataFrame."""
    state: dict = {}

    def measure(p):  # the first point measures every point interleaved by round (issue 32)
        return sweeps.block_share(state, point_result.point_id(EXPERIMENT, p),
                                  lambda: measure_interleaved(loaded, cfg, cfg.grid(), state))

    return sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure,
                            resume=resume, info=loaded.info, loaded=loaded, config=cfg)


# ----------------------------------------------------------------------------- summaries


KEYS = ("task", "language")


def speed_table(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each technique or quantization point against the float baseline of its (task, language).

    Usable points only (:func:`workbench.stats.evidence.usable_points`). Speculative points: ``speedup`` = baseline
    ``e2e_s`` / the point's (batch 1, a fixed output length); int8 points: the point's ``decode_tps`` / the
    baseline's. A run measured interleaved (:func:`measure_interleaved`) carries the paired within-round
    interval at its Holm level (the verdict from the Holm-adjusted p) and the A/A columns; older runs: a Welch
    interval on log values over repeats. ``output_agreement``: share of output ids equal to the baseline's greedy
    output, position by position (:func:`workbench.measure.quality.token_agreement`), with the first divergence.

    Returns:
        one row per non-baseline point: the point's keys, ``speedup``, ``speedup_low``, ``speedup_high``,
        ``speedup_method``, ``verdict`` (:func:`workbench.stats.evidence.ratio_verdict`), ``output_agreement``,
        ``first_divergence`` and the point's acceptance / guard columns where present.
    """
    ok = evidence.usable_points(points)
    rows = []
    keep = ["acceptance_rate", "accepted_length", "mean_acceptance_length", "mean_draft_tokens", "mbu_note",
            "verify_steps_per_token", "acceptance_by_position",
            "speedup_bound", "draft_cost_ratio", "token_agreement", "perplexity_ratio", "perplexity_ratio_high",
            "kl_mean", "top1_agreement", "guard_passed", "guard_reason",
            "mbu", "weight_bytes"]
    for _, p in ok.iterrows():
        if p["technique"] == "none" and p["quantization"] == "none":
            continue
        base = ok[(ok["task"] == p["task"]) & (ok["language"] == p["language"]) & (ok["technique"] == "none")
                  & (ok["quantization"] == "none")]
        if base.empty:
            continue
        r_p = requests[requests["point_id"] == p["point_id"]].sort_values(["repeat", "request_id"])
        r_b = requests[requests["point_id"] == base["point_id"].iloc[0]].sort_values(["repeat", "request_id"])
        what = "e2e speed-up" if p["technique"] != "none" else "decode tokens/s ratio"
        holm_p = float("nan")
        if isinstance(p.get("design"), str) and p.get("speedup") == p.get("speedup"):  # interleaved (issue 32)
            holm_p = float(p.get("speedup_p_holm", float("nan")))
            iv = evidence.Interval(float(p["speedup"]), float(p["speedup_low"]), float(p["speedup_high"]),
                                   int(p.get("rounds") or 0), str(p.get("speedup_method") or ""),
                                   reason="" if p["speedup_low"] == p["speedup_low"] else "1 round")
        elif p["technique"] != "none":
            iv = evidence.ratio_interval(r_b["e2e_s"], r_p["e2e_s"])
        else:
            iv = evidence.ratio_interval(r_p["decode_tps"], r_b["decode_tps"])
        verdict = evidence.ratio_verdict(iv)
        if holm_p == holm_p and holm_p >= 1 - evidence.CONFIDENCE and verdict in ("higher", "lower"):
            verdict = "no difference beyond noise"  # a later Holm step did not reject
        share, first = quality.token_agreement([list(x) for x in r_b["output_ids"]],
                                               [list(x) for x in r_p["output_ids"]])
        rows.append({"point_id": p["point_id"], **{k: p[k] for k in ("task", "language", "technique",
                                                                      "draft_tokens", "quantization")},
                     "ratio_of": what, "speedup": iv.estimate, "speedup_low": iv.low, "speedup_high": iv.high,
                     "speedup_method": iv.method or iv.reason, "verdict": verdict,
                     "speedup_text": evidence.describe_ratio(iv, what), "output_agreement": share,
                     "first_divergence": first, **{k: p[k] for k in keep if k in p},
                     **{k: p[k] for k in comparison.COLUMNS if k in p}})
    return pd.DataFrame(rows)


def aa_moved(table: pd.DataFrame) -> bool:
    """True when the speed table carries an A/A control whose interval excludes 1."""
    if table is None or table.empty or "aa_low" not in table:
        return False
    lo, hi = table["aa_low"].dropna(), table["aa_high"].dropna()
    return bool(len(lo) and (lo.iloc[0] > 1 or hi.iloc[0] < 1))


def noise_floor(table: pd.DataFrame) -> str:
    """The A/A noise floor sentence of the finding (empty without the control)."""
    if table is None or table.empty or "aa_low" not in table or not table["design"].notna().any():
        return ""
    r = table[table["design"].notna()].iloc[0]
    aa = evidence.Interval(r["aa_ratio"], r["aa_low"], r["aa_high"], int(r["rounds"]), "", reason="1 round")
    moved = f" Comparisons: {comparison.AA_MOVED}." if aa_moved(table) else ""
    return (f"{comparison.noise_floor_text(aa, str(r['design']), int(r['rounds']))}; intervals Holm-adjusted over "
            f"each workload's arms.{moved}")


def _name(r) -> str:
    if r["technique"] == "none":
        return f"{r['quantization']} quantization"
    return f"{r['technique'].replace('_', ' ')} (k={int(r['draft_tokens'])})"


def finding(table: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """Per technique: the speed-up with its interval on each task, the quality cost, and where it stops paying.

    "faster" / "slower" only when the speed-up's 95% interval excludes 1 (:func:`workbench.stats.evidence.ratio_verdict`);
    a technique "stops paying" on the tasks (and ``k``) where its interval does not lie above 1, and does not pay
    where it is faster but fails the quality guard (:mod:`workbench.measure.guard`). The headline is a technique that
    pays, or "none pays here" (each shown slower or refused by the guard), or "not supported: none is shown faster"
    (a technique without a direction either way).

    Args:
        table: :func:`speed_table`.
        points: the run's points (their ids are the evidence).

    Returns:
        :class:`workbench.stats.evidence.Finding`; supported when its first sentence is: a technique pays (faster
        beyond noise within the quality guard), or none pays and each is shown not to (slower beyond noise on every
        workload, or refused by the guard); not supported while a technique's interval still straddles 1 and none
        pays; never when the A/A control moved.
    """
    if table is None or table.empty:
        return evidence.Finding("Speed techniques: not supported: no usable technique point beside its baseline.",
                                "", False)
    parts, ev, supported = [], [], False
    table = table.assign(name=table.apply(_name, axis=1))
    for name, g in table.groupby("name", sort=False):
        pays, not_pays = [], []
        for _, r in g.iterrows():
            where = f"{r['task']}/{r['language']}"
            word = {"higher": "faster", "lower": "slower"}.get(r["verdict"], r["verdict"])
            (pays if r["verdict"] == "higher" else not_pays).append(f"{where} {r['speedup']:.2f}x ({word})")
            ev.append(f"{name} {where}: {r['speedup_text']}")
        quality_cost = (f"greedy output identical to plain greedy on {int((g['output_agreement'] == 1).sum())} of "
                        f"{len(g)} workloads")
        guard_failed = False
        if "guard_passed" in g and g["guard_passed"].notna().any():
            gp = g[g["guard_passed"].notna()]
            guard_failed = not gp["guard_passed"].astype(bool).all()
            quality_cost += (f"; guard {'FAILED' if guard_failed else 'passed'} (perplexity "
                             f"x{gp['perplexity_ratio'].max():.4g}, upper 95% bound "
                             f"{gp['perplexity_ratio_high'].max():.4g}; mean KL {gp['kl_mean'].max():.3g} nats vs "
                             f"float32; greedy agreement {gp['token_agreement'].min():.2f})")
        if "acceptance_rate" in g and g["acceptance_rate"].notna().any():
            quality_cost += "; acceptance " + ", ".join(
                f"{r['task']}/{r['language']} {r['acceptance_rate']:.2f}" for _, r in g.iterrows())
        if pays and guard_failed:  # faster, at a quality the guard refuses: it does not pay
            text = f"{name}: faster ({'; '.join(pays)}) but fails the quality guard: does not pay"
        else:
            text = f"{name}: " + ("; ".join(pays) if pays else "not supported: faster on no workload")
        if not_pays:
            text += "; stops paying on " + "; ".join(not_pays)
        # shown not to pay: the guard refuses it, or it is slower beyond noise on every workload
        refuted = guard_failed or bool((g["verdict"] == "lower").all())
        parts.append((bool(pays) and not guard_failed, f"{text} ({quality_cost}).", refuted, name))
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else tuple(table["point_id"])
    # the headline is the technique that pays (faster within the quality guard) first; when none does, saying so
    paying = any(pt[0] for pt in parts)
    open_ = [pt[3] for pt in parts if not pt[0] and not pt[2]]  # neither pays nor shown not to
    texts = [pt[1] for pt in sorted(parts, key=lambda pt: not pt[0])]
    if not paying and open_:  # "none is faster" is not shown while a technique's interval still reaches above 1
        texts.insert(0, f"Speed techniques: not supported: none is shown faster within the quality guard here "
                        f"({', '.join(open_)}: no difference beyond noise).")
        supported = False
    elif not paying:
        texts.insert(0, "Speed techniques: none pays here (each is slower beyond noise or fails the quality guard).")
        supported = True
    else:
        supported = True
    floor = noise_floor(table)
    if floor:
        texts.append(floor)
    supported = supported and not aa_moved(table)
    return evidence.Finding(" ".join(texts), "; ".join(ev), supported, ids)


# ----------------------------------------------------------------------------- figures


def fig_speedup(table: pd.DataFrame) -> go.Figure:
    """Measured speed-up (95% interval) per workload and technique, with the Leviathan bound beside it."""
    df = table.assign(name=table.apply(_name, axis=1), workload=table["task"] + "/" + table["language"])
    fig = go.Figure()
    colours = px.colors.qualitative.Safe
    for i, (name, g) in enumerate(df.groupby("name", sort=False)):
        c = colours[i % len(colours)]
        fig.add_trace(go.Bar(x=g["workload"], y=g["speedup"], name=f"{name} measured", marker_color=c,
                             error_y=dict(type="data", symmetric=False, array=(g["speedup_high"] - g["speedup"]),
                                          arrayminus=(g["speedup"] - g["speedup_low"]))))
        if "speedup_bound" in g and g["speedup_bound"].notna().any():
            fig.add_trace(go.Scatter(x=g["workload"], y=g["speedup_bound"], mode="markers", name=f"{name} bound",
                                     marker=dict(symbol="line-ew-open", size=28, color=c, line=dict(width=3))))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="baseline")
    if "aa_low" in df and df["aa_low"].notna().any():  # the A/A noise floor a speed-up must clear
        comparison.add_noise_band(fig, low=df["aa_low"].dropna().iloc[0], high=df["aa_high"].dropna().iloc[0])
    fig.update_layout(barmode="group", title="Speed-up over plain greedy float32 (interval; grey band: the A/A noise floor) and the upper bound",
                      xaxis_title="task / language", yaxis_title="speed-up (x)")
    return legend_below(fig)


def fig_acceptance(table: pd.DataFrame) -> go.Figure:
    """Acceptance by draft position per speculative point."""
    rows = []
    for _, r in table[table["technique"] != "none"].iterrows():
        for i, v in enumerate(str(r.get("acceptance_by_position") or "").split(",")):
            if v:
                rows.append({"position": i + 1, "acceptance": float(v),
                             "point": f"{_name(r)} {r['task']}/{r['language']}"})
    df = pd.DataFrame(rows, columns=["position", "acceptance", "point"])
    fig = px.line(df, x="position", y="acceptance", color="point", markers=True,
                  labels={"position": "draft position", "acceptance": label("acceptance_rate")},
                  title="Acceptance by draft position")
    return legend_below(fig)


def fig_tpot(points: pd.DataFrame) -> go.Figure:
    """TPOT p50 per point (speculative steps give several ids per stamp, so TPOT is the mean per id)."""
    df = points[points["status"] == "ok"].copy()
    df["name"] = df.apply(_name, axis=1).where(~((df["technique"] == "none") & (df["quantization"] == "none")),
                                               "plain greedy")
    df["workload"] = df["task"] + "/" + df["language"]
    fig = px.bar(df, x="workload", y="tpot_s_p50", color="name", barmode="group",
                 labels={"tpot_s_p50": label("tpot_s_p50"), "workload": "task / language"},
                 title="Time per output token by technique")
    return legend_below(fig)


@split_by_device
def figures(points: pd.DataFrame, table: pd.DataFrame) -> dict:
    """Every figure of the notebook, by name, in report order."""
    figs = {"speed_techniques_tpot": fig_tpot(points)}
    if table is not None and not table.empty:
        figs["speed_techniques_speedup"] = fig_speedup(table)
        if (table["technique"] != "none").any():
            figs["speed_techniques_acceptance"] = fig_acceptance(table)
    return figs
