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
- ``speedup`` (:func:`speed_table`): baseline ``e2e_s`` over the technique's (a fixed output length: equal work).
  With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`,
  :mod:`workbench.run.design`): interleaved rounds, each workload's plain baseline the marked control of its arms,
  the first baseline again as the A/A control, analysed as a block design (rounds as blocks, one pooled variance,
  simultaneous intervals that agree with their verdicts: direction, equivalent within the margin, or undecided with
  the rounds that would decide it; :mod:`workbench.stats.blocks`), rounds added while a comparison is open. One
  repeat: a Welch interval over repeats (:func:`workbench.stats.evidence.ratio_interval`), no equivalence.
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
import math

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench import checks
from workbench.errors import ParameterError
from workbench.inputs.prompts import LANGUAGES, TASKS, task_prompts
from workbench.measure import guard, models, quality
from workbench.measure.generation import GenerationSettings, check_speculative, generate_measured, warm_up
from workbench.predict import roofline
from workbench.run import design, design_sweep, point_result, sweeps
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig
from workbench.share.plots import label, legend_below, split_by_device
from workbench.stats import comparison, evidence, metrics
from workbench.stats.metrics import acceptance, speedup_bound, verification_mbu
from workbench.techniques import speed

EXPERIMENT = "speed_techniques"
TECHNIQUES = ("none", "prompt_lookup", "draft")
TRUNCATED = "truncated"


@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The speed-techniques sweep (notebook ``12_speed_techniques``).

    With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`): ``repeats``
    rounds first, then up to ``max_rounds`` while a comparison is undecided and ``budget_s`` allows; ``margin`` is
    the equivalence margin.

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
        self.check_design()
        checks.check_choice_list("techniques", self.techniques, TECHNIQUES)
        checks.check_int_list("draft_tokens", self.draft_tokens, 1)
        checks.check_choice_list("tasks", self.tasks, TASKS)
        checks.check_choice_list("languages", self.languages, LANGUAGES)
        if not isinstance(self.quantizations, list) or not self.quantizations:
            raise ParameterError(f"quantizations: must be a non-empty list (got {self.quantizations!r})")
        dev = models.resolve_names(self.device)[0]   # no torch import in the command that validates it
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


E2E = design.Outcome("e2e_s", False, "request latency (e2e)", "time_ratio")


def is_baseline(point: dict) -> bool:
    """True for a workload's plain float baseline (technique ``none``, quantization ``none``)."""
    return point["technique"] == "none" and point["quantization"] == "none"


def sweep_design(loaded, cfg: Config, points: list[dict], state: dict) -> design_sweep.SweepDesign:
    """Every point as an arm of one design (:mod:`workbench.run.design`): each round measures every point once
    (each workload's baseline, techniques and quantizations) and the first workload's baseline again (the A/A
    control), in an order shuffled per round, round ``r`` at seed ``cfg.seed + r``. Each (task, language)'s plain
    float baseline is the marked control of its workload's arms (groups); the primary outcome is the request's
    ``e2e_s`` (a fixed output length: equal work), the speed-up its inverse. The design stops at a look where the
    finding is decided (its ``judge``): a technique faster beyond noise (it pays), or every arm decided. Each arm
    warms up ``cfg.warmup`` times before its first round; the points' ``extra`` adds :func:`point_extra`'s columns and ``speedup`` /
    ``speedup_low`` / ``speedup_high`` (``1 / time_ratio``, the simultaneous interval inverted).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    settings = cfg.settings()
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    by_pid = {pid(p): p for p in points}

    def prepare(p):
        model, _, kw, prompts = arm_setup(loaded, cfg, p, state)
        return warm_up(model, prompts, settings, cfg.warmup, generate_kwargs=kw or None)

    def measure(p, rnd):
        model, _, kw, prompts = arm_setup(loaded, cfg, p, state)
        res = generate_measured(model, prompts, dataclasses.replace(settings, seed=cfg.seed + rnd),
                                generate_kwargs=kw or None)
        for rec in res.records:
            rec.update(batch_size=len(prompts), batch_wall_s=res.wall_s)
        done = [r["e2e_s"] for r in res.records if r.get("output_tokens", 0) >= 1]
        return design.Measured({E2E.name: sum(done) / len(done) if done else float("nan")}, res.records, res.wall_s)

    def extra(point_id, result):
        cols = point_extra(loaded, cfg, by_pid[point_id], state, result.requests.get(point_id, []))
        t, lo, hi = (result.point_columns(point_id).get(k) for k in ("time_ratio", "time_ratio_low",
                                                                     "time_ratio_high"))
        inv = (lambda x: 1.0 / x if x and math.isfinite(x) else float("nan"))
        return {**cols, "speedup": inv(t), "speedup_low": inv(hi), "speedup_high": inv(lo)}

    groups: dict = {}
    for p in points:
        groups.setdefault((p["task"], p["language"]), []).append(p)
    controls = {}
    for members in groups.values():
        base = next((m for m in members if is_baseline(m)), None)
        if base is not None:
            controls[pid(base)] = [pid(m) for m in members]
    first = next(iter(controls))
    holder: dict = {}

    def judge(table, alpha):    # the finding is decided once a technique pays, or once every arm is decided
        an = design.analyse_outcome(table, holder["design"], E2E, alpha)
        if an is None:
            return False
        pays = any(dec.verdict == "direction" and dec.direction == "lower" and "technique=none" not in str(a)
                   for a, dec in an.compared().items())
        return pays or an.decided()

    d = design.Design(EXPERIMENT, [pid(p) for p in points if any(pid(p) in m for m in controls.values())], first,
                      E2E, groups=controls, judge=judge, **cfg.design_kwargs())
    holder["design"] = d
    return design_sweep.SweepDesign(d, measure, prepare, extra)


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every point of ``cfg.grid()`` through :func:`workbench.run.sweeps.run_sweep`: with 2+ points and ``repeats``
    >= 2 as one design (:func:`sweep_design`: every finished round on disk in ``design/speed_techniques.parquet``,
    a resume continues from the last), else point by point (:func:`measure_point`). Returns the points DataFrame."""
    state: dict = {}
    grid = cfg.grid()
    designed = sweep_design(loaded, cfg, grid, state) if len(grid) >= 2 and cfg.repeats >= 2 else None
    return sweeps.run_sweep(run_dir, EXPERIMENT, grid, lambda p: measure_point(loaded, cfg, p, state),
                            resume=resume, info=loaded.info, loaded=loaded, config=cfg, design=designed)


# ----------------------------------------------------------------------------- summaries


KEYS = ("task", "language")


#: the speed table's verdicts: a design's three, in the speed-up's words
VERDICT_WORDS = {("direction", "lower"): "faster", ("direction", "higher"): "slower", ("equivalent", ""): "equivalent",
                 ("undecided", ""): "undecided"}


def speed_table(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each technique or quantization point against the float baseline of its (task, language).

    Usable points only (:func:`workbench.stats.evidence.usable_points`). ``speedup`` = baseline ``e2e_s`` / the
    point's (batch 1, a fixed output length). A run measured as one design (:func:`sweep_design`) reads the design's
    decision: the simultaneous interval and the verdict of its block analysis (``time_ratio``, inverted), so that
    the interval, the verdict and the text agree by construction. One repeat (no design): a Welch interval on log
    e2e over repeats, a direction only when it excludes 1, never equivalent. ``output_agreement``: share of output
    ids equal to the baseline's greedy output, position by position (:func:`workbench.measure.quality.token_agreement`),
    with the first divergence.

    Returns:
        one row per non-baseline point: the point's keys, ``speedup``, ``speedup_low``, ``speedup_high``,
        ``speedup_method``, ``verdict`` (``faster``, ``slower``, ``equivalent``, ``undecided``; :data:`VERDICT_WORDS`),
        ``speedup_text``, ``rounds_needed``, ``output_agreement``, ``first_divergence``, the point's acceptance / guard
        columns and the design's A/A columns where present.
    """
    ok = evidence.usable_points(points)
    rows = []
    keep = ["acceptance_rate", "accepted_length", "mean_acceptance_length", "mean_draft_tokens", "mbu_note",
            "verify_steps_per_token", "acceptance_by_position",
            "speedup_bound", "draft_cost_ratio", "token_agreement", "perplexity_ratio", "perplexity_ratio_high",
            "kl_mean", "top1_agreement", "guard_passed", "guard_reason", "mbu", "weight_bytes",
            "aa_ratio", "aa_low", "aa_high", "aa_verdict", "design", "rounds", "margin", "seconds_per_round",
            "design_seconds", "design_stopped", "round_drift"]
    for _, p in ok.iterrows():
        if is_baseline(p):
            continue
        base = ok[(ok["task"] == p["task"]) & (ok["language"] == p["language"]) & (ok["technique"] == "none")
                  & (ok["quantization"] == "none")]
        if base.empty:
            continue
        r_p = requests[requests["point_id"] == p["point_id"]].sort_values(["repeat", "request_id"])
        r_b = requests[requests["point_id"] == base["point_id"].iloc[0]].sort_values(["repeat", "request_id"])
        d = design.decision_from_row(p, E2E)
        spr = checks.float_or_nan(p.get("seconds_per_round"))
        if d is not None:        # one design: its decision, inverted to a speed-up
            est, lo, hi = (1 / d.estimate if d.estimate else float("nan"), 1 / d.high if d.shown else float("nan"),
                           1 / d.low if d.shown else float("nan"))
            verdict = VERDICT_WORDS.get((d.verdict, d.direction), "undecided")
            text = d.describe("e2e speed-up", invert=True, words=("slower", "faster"), seconds_per_round=spr)
            method, need = d.method if d.shown else d.reason, d.rounds_needed
        else:                    # one repeat: measured point by point
            iv = evidence.ratio_interval(r_b["e2e_s"], r_p["e2e_s"])
            est, lo, hi = iv.estimate, iv.low, iv.high
            verdict = {"higher": "faster", "lower": "slower"}.get(evidence.ratio_verdict(iv), "undecided")
            text, method, need = evidence.describe_ratio(iv, "e2e speed-up"), iv.method or iv.reason, None
        share, first = quality.token_agreement([list(x) for x in r_b["output_ids"]],
                                               [list(x) for x in r_p["output_ids"]])
        rows.append({"point_id": p["point_id"], **{k: p[k] for k in ("task", "language", "technique",
                                                                      "draft_tokens", "quantization")},
                     "ratio_of": "e2e speed-up", "speedup": est, "speedup_low": lo, "speedup_high": hi,
                     "speedup_method": method, "verdict": verdict, "speedup_text": text, "rounds_needed": need,
                     "output_agreement": share, "first_divergence": first, **{k: p[k] for k in keep if k in p}})
    return pd.DataFrame(rows)


def aa_moved(table: pd.DataFrame) -> bool:
    """True when the speed table carries an A/A control that moved (a direction in the design's analysis)."""
    if table is None or table.empty or "aa_verdict" not in table:
        return False
    return bool((table["aa_verdict"] == "direction").any())


def noise_floor(table: pd.DataFrame) -> str:
    """The A/A control's sentence for the finding (empty without a design)."""
    if table is None or table.empty or "aa_low" not in table or not table["design"].notna().any():
        return ""
    r = table[table["design"].notna()].iloc[0]
    if not r["aa_low"] == r["aa_low"]:
        return ""
    moved = " It moved: drift, not techniques; no comparison here is decided." if aa_moved(table) else ""
    return (f"A/A control (the first baseline's latency against itself, {int(r['rounds'])} interleaved rounds): "
            f"{r['aa_ratio']:.2f}x ({r['aa_low']:.2f}-{r['aa_high']:.2f}x), {r.get('aa_verdict') or 'no verdict'}."
            f"{moved}")


def _name(r) -> str:
    if r["technique"] == "none":
        return f"{r['quantization']} quantization"
    return f"{r['technique'].replace('_', ' ')} (k={int(r['draft_tokens'])})"


def finding(table: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """Per technique: the speed-up with its interval and verdict on each workload, the quality cost, and where it
    stops paying; the verdicts are the design's (:func:`speed_table`).

    A technique **pays** on a workload where it is faster beyond noise within the quality guard; it is **shown not
    to pay** where it is slower beyond noise, equivalent within the margin, or refused by the guard
    (:mod:`workbench.measure.guard`); otherwise the workload is **undecided**. The headline is a technique that pays
    (verdict ``direction``); else "none pays here" when every workload of every technique is shown not to pay
    (``direction`` where one is slower, ``equivalent`` when all are equivalent); else "undecided" with the rounds that
    would decide it (the most any open comparison needs). Undecided too when the A/A control moved.

    Args:
        table: :func:`speed_table`.
        points: the run's points (their ids are the evidence).

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    if table is None or table.empty:
        return evidence.Finding("Speed techniques: no usable technique point beside its baseline.", "", False,
                                verdict="undecided")
    parts, ev = [], []
    table = table.assign(name=table.apply(_name, axis=1))
    for name, g in table.groupby("name", sort=False):
        pays, not_pays, open_ = [], [], []
        guard_failed = False
        if "guard_passed" in g and g["guard_passed"].notna().any():
            gp = g[g["guard_passed"].notna()]
            guard_failed = not gp["guard_passed"].astype(bool).all()
        for _, r in g.iterrows():
            iv = (f"interval {r['speedup_low']:.2f}-{r['speedup_high']:.2f}x"
                  if r["speedup_low"] == r["speedup_low"] else "no interval")
            where = f"{r['task']}/{r['language']} {r['speedup']:.2f}x"
            if r["verdict"] == "faster" and not guard_failed:
                pays.append(f"{where} (faster, {iv})")
            elif r["verdict"] in ("slower", "equivalent") or guard_failed:
                not_pays.append(f"{where} ({r['verdict']}, {iv})")
            else:
                open_.append(f"{where} ({iv})")
            ev.append(f"{name} {r['task']}/{r['language']}: {r['speedup_text']}")
        quality_cost = (f"greedy output identical to plain greedy on {int((g['output_agreement'] == 1).sum())} of "
                        f"{len(g)} workloads")
        if "guard_passed" in g and g["guard_passed"].notna().any():
            gp = g[g["guard_passed"].notna()]
            quality_cost += (f"; guard {'FAILED' if guard_failed else 'passed'} (perplexity "
                             f"x{gp['perplexity_ratio'].max():.4g}, upper 95% bound "
                             f"{gp['perplexity_ratio_high'].max():.4g}; mean KL {gp['kl_mean'].max():.3g} nats vs "
                             f"float32; greedy agreement {gp['token_agreement'].min():.2f})")
        if "acceptance_rate" in g and g["acceptance_rate"].notna().any():
            quality_cost += "; acceptance " + ", ".join(
                f"{r['task']}/{r['language']} {r['acceptance_rate']:.2f}" for _, r in g.iterrows())
        faster = [i for i in (pays + not_pays) if "(faster" in i]
        if guard_failed and faster:   # faster, at a quality the guard refuses: it does not pay
            text = f"{name}: faster ({'; '.join(faster)}) but fails the quality guard: does not pay"
        elif pays:
            text = f"{name}: pays on " + "; ".join(pays)
        elif open_:
            text = f"{name}: undecided on " + "; ".join(open_)
        else:
            text = f"{name}: does not pay"
        rest = [i for i in not_pays if not (guard_failed and i in faster)]
        if rest:
            text += "; not on " + "; ".join(rest)
        if open_ and pays:
            text += "; undecided on " + "; ".join(open_)
        parts.append((bool(pays), f"{text} ({quality_cost}).", not open_, name, g))
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else tuple(table["point_id"])
    paying = any(pt[0] for pt in parts)
    texts = [pt[1] for pt in sorted(parts, key=lambda pt: not pt[0])]
    open_rows = table[(table["verdict"] == "undecided") & ~table["name"].isin(
        [pt[3] for pt in parts if pt[4].get("guard_passed", pd.Series(dtype=object)).eq(False).any()])]
    needs = pd.to_numeric(open_rows.get("rounds_needed", pd.Series(dtype=float)), errors="coerce")
    need = int(needs.max()) if needs.notna().any() and not needs.isna().any() else None
    if paying:
        verdict = "direction"
    elif len(open_rows):
        verdict = "undecided"
        more = f"; about {need} rounds would decide it at the observed spread" if need else ""
        texts.insert(0, f"Speed techniques: undecided: none is shown faster within the quality guard yet, and "
                        f"{', '.join(dict.fromkeys(open_rows['name']))} not shown slower or equivalent either{more}.")
    else:
        slower = (table["verdict"] == "slower").any() or any(
            pt[4].get("guard_passed", pd.Series(dtype=object)).eq(False).any() for pt in parts)
        verdict = "direction" if slower else "equivalent"
        texts.insert(0, "Speed techniques: none pays here (each is slower beyond noise, equivalent within the margin "
                        "or refused by the quality guard).")
    floor = noise_floor(table)
    if floor:
        texts.append(floor)
    fields: dict = {"verdict": verdict}
    row = table[table["design"].notna()].iloc[0] if "design" in table and table["design"].notna().any() else None
    if row is not None:
        fields = design.finding_fields(row, verdict=verdict, rounds_needed=need)
        if aa_moved(table):
            fields["verdict"] = "undecided"
        ev.append(design.evidence_text(row))
    else:
        texts.append("Measured point by point (one repeat): Welch intervals over repeats, no rounds, no A/A control.")
    return evidence.Finding(" ".join(texts), "; ".join(ev), True, ids, **fields)


# ----------------------------------------------------------------------------- figures


def fig_speedup(table: pd.DataFrame) -> go.Figure:
    """Measured speed-up per workload and technique with the interval its verdict was read from (a design's
    simultaneous interval), the Leviathan bound beside it, the equivalence band (dashed) and the A/A control's
    interval as a speed-up (grey)."""
    df = table.assign(name=table.apply(_name, axis=1), workload=table["task"] + "/" + table["language"])
    fig = go.Figure()
    colours = px.colors.qualitative.Safe
    for i, (name, g) in enumerate(df.groupby("name", sort=False)):
        c = colours[i % len(colours)]
        fig.add_trace(go.Bar(x=g["workload"], y=g["speedup"], name=f"{name} measured", marker_color=c,
                             customdata=g["verdict"], hovertemplate="%{x}: %{y:.2f}x %{customdata}",
                             error_y=dict(type="data", symmetric=False, array=(g["speedup_high"] - g["speedup"]),
                                          arrayminus=(g["speedup"] - g["speedup_low"]))))
        if "speedup_bound" in g and g["speedup_bound"].notna().any():
            fig.add_trace(go.Scatter(x=g["workload"], y=g["speedup_bound"], mode="markers", name=f"{name} bound",
                                     marker=dict(symbol="line-ew-open", size=28, color=c, line=dict(width=3))))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="baseline")
    if "margin" in df and df["margin"].notna().any():
        m = float(df["margin"].dropna().iloc[0])
        for y in (1 / m, m):
            fig.add_hline(y=y, line_dash="dash", line_color="#aaa", line_width=1)
    if "aa_low" in df and df["aa_low"].notna().any():  # the A/A control (a time ratio) as a speed-up
        comparison.add_noise_band(fig, low=1 / df["aa_high"].dropna().iloc[0], high=1 / df["aa_low"].dropna().iloc[0])
    fig.update_layout(barmode="group", title="Speed-up over plain greedy float32 (simultaneous interval; dashed: the "
                      "equivalence band; grey: the A/A control) and the upper bound",
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
