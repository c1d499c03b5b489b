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
  quality guard (:func:`workbench.measure.quality.quality_guard`: greedy agreement and log-prob drift against the
  float32 model) and MBU from the bytes the quantized model reads per step. torch's dynamic kernels quantize
  each Linear's input activations per call as well (not pure weight-only; torchao's int8 weight-only is not
  installed): that rounding drives the log-prob drift, and the per-call quantize / dequantize work is what can
  make int8 slower than float32 on a CPU where a 135M model's decode is not purely memory bound.

Assisted generation is batch 1 in ``transformers``: ``batch_size > 1`` with a technique is refused before
any model loads, as are ``k <= 0``, a draft whose tokenizer differs from the target's, and a quantization
scheme without a CPU kernel here.

Workloads (:func:`task_prompts`): copy-heavy tasks built from the shipped documentation text (``summarise``,
``extract``: quote sentences, ``edit``: rewrite with one small change), English (Python's pydoc topics) and
Chinese (``data/zh`` essays), next to ``free`` generation (a short story), where there is nothing to copy.

Metrics of a speculative point (:func:`acceptance`), from the per-step counts that
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
- ``speedup_bound``: the simple upper bound of Leviathan et al. 2023 (eq. 1 and theorem 3.8): with
  acceptance ``a`` and ``k`` draft tokens a step yields ``(1 - a^(k+1)) / (1 - a)`` tokens for ``1 + k c``
  target-step costs, ``c`` the draft / target cost ratio. Decode is memory bound, so ``c`` is the draft's
  weight bytes read per step over the target's (0 for prompt lookup) and a verification of ``k + 1`` tokens
  is assumed to cost one decode step; real verification costs more on a CPU, so the measured speed-up sits
  below the bound.

Timing stays per generated token id: the ``k`` ids of one verification step share one stamp, so ``itl_s``
holds zeros between ids of one step and the step's whole time on its first id; TPOT is e2e minus TTFT over
output ids minus one, as everywhere (:func:`workbench.stats.metrics.request_timing`). ``prefill_s`` of a speculative point is the first target forward, which
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

from workbench.techniques import speed
from workbench import checks
from workbench.stats import evidence, metrics
from workbench.measure import models, quality
from workbench.predict import roofline
from workbench.run import sweeps
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, check_speculative
from workbench.share.plots import label, legend_below, split_by_device
from workbench.inputs.prompts import build_batch, source_text
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig

EXPERIMENT = "speed_techniques"
TECHNIQUES = ("none", "prompt_lookup", "draft")
TASKS = ("summarise", "extract", "edit", "free")
COPY_TASKS = ("summarise", "extract", "edit")
LANGUAGES = ("en", "zh")
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
        min_token_agreement, max_logprob_drift: the guard's limits (engine tuning's defaults).
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
    min_token_agreement: float = 0.9
    max_logprob_drift: float = 0.05

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
        checks.check_float("min_token_agreement", self.min_token_agreement, 0, 1)
        checks.check_float("max_logprob_drift", self.max_logprob_drift, 0)
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
        """Greedy settings (speculative greedy decoding is exact, so outputs are comparable token for token)."""
        return GenerationSettings(max_new_tokens=max_new_tokens or self.max_new_tokens, seed=self.seed)


# ----------------------------------------------------------------------------- workloads


INSTRUCTIONS = {
    "summarise": {"en": "Summarise the following text in two or three sentences, reusing its own wording.",
                  "zh": "用两三句话概括下面的文字，尽量使用原文的词句。"},
    "extract": {"en": "Quote, word for word, the first three sentences of the following text.",
                "zh": "逐字摘录下面文字的前三句话。"},
    "edit": {"en": "Rewrite the following text exactly, changing only \"the\" to \"THE\".",
             "zh": "原样重写下面的文字，只把“的”改成“之”。"},
}
FREE = {"en": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "zh": "写一个短故事：一位灯塔看守人捡到了一个漂流瓶。"}


def passages(language: str, n: int, chars: int) -> list[str]:
    """``n`` passages of the shipped text (whole paragraphs, at most ``chars`` characters; Chinese ``chars // 3``),
    taken evenly through the source so different prompts quote different text."""
    limit = chars if language == "en" else max(20, chars // 3)
    paras = [p.strip() for p in source_text(language).split("\n\n") if len(p.strip()) >= limit // 3]
    picked = []
    step = max(1, len(paras) // max(n, 1))
    for i in range(0, len(paras), step):
        text = ""
        for p in paras[i:]:
            if len(text) + len(p) > limit:
                break
            text = f"{text}\n\n{p}" if text else p
        picked.append(text or paras[i][:limit])
        if len(picked) == n:
            break
    return picked


def task_prompts(task: str, language: str, n: int = 1, passage_chars: int = 600) -> list[str]:
    """``n`` prompts of a task: an instruction over a passage of documentation (copy-heavy) or a free request.

    Raises:
        ParameterError: an unknown task or language.
    """
    checks.check_choice("task", task, TASKS)
    checks.check_choice("language", language, LANGUAGES)
    if task == "free":
        return [FREE[language]] * n
    return [f"{INSTRUCTIONS[task][language]}\n\n{p}" for p in passages(language, n, passage_chars)]


# ----------------------------------------------------------------------------- acceptance and the bound


def acceptance(proposed: list[list[int]], emitted: list[list[int]]) -> dict:
    """Acceptance figures of speculative requests from their per-step counts.

    Args:
        proposed: per request, the draft tokens each verification step checked (>= 0 each).
        emitted: per request, the ids each step added to the output (>= 1 each; the last step may be cut at
            EOS or the length cap).

    Returns:
        ``proposed_tokens``, ``accepted_tokens`` (per step ``min(emitted - 1, proposed)``), ``verify_steps``,
        ``output_tokens``; ``acceptance_rate`` (accepted / proposed, NaN with no proposal), ``accepted_length``
        (output ids / steps: mean ids per verification step), ``verify_steps_per_token`` (steps / output ids)
        and ``acceptance_by_position`` (list: position ``i`` accepted / proposed, over steps that proposed
        at least ``i + 1`` tokens).
    """
    prop = acc = steps = out = 0
    by_prop: list[int] = []
    by_acc: list[int] = []
    for p_req, e_req in zip(proposed, emitted):
        for p, e in zip(p_req, e_req):
            a = max(0, min(e - 1, p))
            prop, acc, steps, out = prop + p, acc + a, steps + 1, out + e
            while len(by_prop) < p:
                by_prop.append(0)
                by_acc.append(0)
            for i in range(p):
                by_prop[i] += 1
                by_acc[i] += i < a
    nan = float("nan")
    return {"proposed_tokens": prop, "accepted_tokens": acc, "verify_steps": steps, "output_tokens": out,
            "acceptance_rate": acc / prop if prop else nan,
            "accepted_length": out / steps if steps else nan,
            "verify_steps_per_token": steps / out if out else nan,
            "acceptance_by_position": [a / p for a, p in zip(by_acc, by_prop)]}


def speedup_bound(acceptance_rate: float, draft_tokens: int, cost_ratio: float) -> float:
    """Upper bound of the speed-up of speculative decoding (Leviathan et al. 2023, "Fast Inference from
    Transformers via Speculative Decoding", eq. 1 and theorem 3.8).

    ``(1 - a^(k+1)) / ((1 - a) (1 + k c))``: expected tokens per verification step over its cost in target
    decode steps (``k`` draft steps at ``c`` each plus one verification, assumed to cost one decode step).
    ``a = 1`` gives ``(k + 1) / (1 + k c)``. NaN on missing input.
    """
    a, k, c = acceptance_rate, draft_tokens, cost_ratio
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (a, k, c)) or k < 1:
        return float("nan")
    tokens = k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    return tokens / (1 + k * c)


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
            ``guard_reference`` (:func:`workbench.measure.quality.guard_reference` of the float model), ``peaks``.

    Returns:
        :class:`workbench.run.point_result.PointResult`; ``extra`` holds, for a speculative point, :func:`acceptance`
        (``acceptance_by_position`` as comma-separated text), ``draft_cost_ratio`` and ``speedup_bound``; for
        a quantized point, the guard's columns, ``weight_bytes`` read per step and ``mbu`` from them.
    """
    prompts = task_prompts(point["task"], point["language"], cfg.batch_size, cfg.passage_chars)
    model, extra, draft = loaded, {}, None
    if point["quantization"] != "none":
        model = state.setdefault("quantized", {}).get(point["quantization"])
        if model is None:
            model = state["quantized"][point["quantization"]] = speed.quantize_int8(loaded)
    if point["technique"] == "draft":
        draft = draft_of(loaded, cfg, state)
    gen_kwargs = generate_kwargs(point, draft)
    out = sweeps.measure_generation(model, prompts, cfg.settings(), cfg.repeats, cfg.warmup,
                                    generate_kwargs=gen_kwargs or None)
    for rec in out.requests:
        rec.update(task=point["task"], language=point["language"], technique=point["technique"],
                   quantization=point["quantization"])
    if point["technique"] != "none":
        acc = acceptance([r.get("draft_proposed", []) for r in out.requests],
                         [r.get("draft_emitted", []) for r in out.requests])
        c = draft.info.weight_bytes / loaded.info.weight_bytes if draft is not None else 0.0
        extra.update({k: v for k, v in acc.items() if k not in ("acceptance_by_position", "output_tokens")},
                     acceptance_by_position=",".join(f"{x:.3f}" for x in acc["acceptance_by_position"]),
                     draft_cost_ratio=c,
                     speedup_bound=speedup_bound(acc["acceptance_rate"], int(point["draft_tokens"]), c))
        if draft is not None:
            extra["draft_name"] = draft.info.name
    if point["quantization"] != "none":
        if "guard_reference" not in state:
            state["guard_reference"] = quality.guard_reference(
                loaded, build_batch(loaded.tokenizer, cfg.guard_prompts, 48), cfg.settings(cfg.guard_tokens))
        extra.update(quality.quality_guard(model, state["guard_reference"], cfg.settings(cfg.guard_tokens),
                                           cfg.min_token_agreement, cfg.max_logprob_drift))
        extra["weight_bytes"] = model.info.weight_bytes
        req = pd.DataFrame(out.requests)
        done = req[req["output_tokens"] >= 2]
        summary = {f"{c}_p50": metrics.percentiles(done[c].tolist(), (50,))["p50"] for c in ("tpot_s", "prefill_s")}
        extra.update(metrics.utilisation(req, summary, model.info, _peaks(loaded, state)))
    else:
        extra["weight_bytes"] = loaded.info.weight_bytes
    out.extra = extra
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every point of ``cfg.grid()`` through :func:`workbench.run.sweeps.run_sweep`; returns the points DataFrame."""
    state: dict = {}
    return sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_point(loaded, cfg, p, state),
                            resume=resume, info=loaded.info, loaded=loaded, config=cfg)


# ----------------------------------------------------------------------------- summaries


KEYS = ("task", "language")


def speed_table(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each technique or quantization point against the float baseline of its (task, language).

    Usable points only (:func:`workbench.stats.evidence.usable_points`). Speculative points: ``speedup`` = baseline
    ``e2e_s`` / the point's (per repeat, batch 1), Welch interval on log values; int8 points: the point's
    ``decode_tps`` / the baseline's. ``output_agreement``: share of output ids equal to the baseline's greedy
    output, position by position (:func:`workbench.measure.quality.token_agreement`), with the first divergence.

    Returns:
        one row per non-baseline point: the point's keys, ``speedup``, ``speedup_low``, ``speedup_high``,
        ``speedup_method``, ``verdict`` (:func:`workbench.stats.evidence.ratio_verdict`), ``output_agreement``,
        ``first_divergence`` and the point's acceptance / guard columns where present.
    """
    ok = evidence.usable_points(points)
    rows = []
    keep = ["acceptance_rate", "accepted_length", "verify_steps_per_token", "acceptance_by_position",
            "speedup_bound", "draft_cost_ratio", "token_agreement", "logprob_drift", "guard_passed", "guard_reason",
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
        if p["technique"] != "none":
            iv = evidence.ratio_interval(r_b["e2e_s"], r_p["e2e_s"])
            what = "e2e speed-up"
        else:
            iv = evidence.ratio_interval(r_p["decode_tps"], r_b["decode_tps"])
            what = "decode tokens/s ratio"
        share, first = quality.token_agreement([list(x) for x in r_b["output_ids"]],
                                               [list(x) for x in r_p["output_ids"]])
        rows.append({"point_id": p["point_id"], **{k: p[k] for k in ("task", "language", "technique",
                                                                      "draft_tokens", "quantization")},
                     "ratio_of": what, "speedup": iv.estimate, "speedup_low": iv.low, "speedup_high": iv.high,
                     "speedup_method": iv.method or iv.reason, "verdict": evidence.ratio_verdict(iv),
                     "speedup_text": evidence.describe_ratio(iv, what), "output_agreement": share,
                     "first_divergence": first, **{k: p[k] for k in keep if k in p}})
    return pd.DataFrame(rows)


def _name(r) -> str:
    if r["technique"] == "none":
        return f"{r['quantization']} quantization"
    return f"{r['technique'].replace('_', ' ')} (k={int(r['draft_tokens'])})"


def finding(table: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """Per technique: the speed-up with its interval on each task, the quality cost, and where it stops paying.

    "faster" / "slower" only when the speed-up's 95% interval excludes 1 (:func:`workbench.stats.evidence.ratio_verdict`);
    a technique "stops paying" on the tasks (and ``k``) where its interval does not lie above 1.

    Args:
        table: :func:`speed_table`.
        points: the run's points (their ids are the evidence).

    Returns:
        :class:`workbench.stats.evidence.Finding`; supported when at least one verdict carries a direction.
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
            supported |= r["verdict"] in ("higher", "lower")
            (pays if r["verdict"] == "higher" else not_pays).append(f"{where} {r['speedup']:.2f}x ({word})")
            ev.append(f"{name} {where}: {r['speedup_text']}")
        quality_cost = (f"greedy output identical to plain greedy on {int((g['output_agreement'] == 1).sum())} of "
                        f"{len(g)} workloads")
        if "guard_passed" in g and g["guard_passed"].notna().any():
            gp = g[g["guard_passed"].notna()]
            quality_cost += (f"; guard {'passed' if gp['guard_passed'].astype(bool).all() else 'FAILED'} (agreement "
                             f"{gp['token_agreement'].min():.2f}, log-prob drift {gp['logprob_drift'].max():.3f} nats)")
        if "acceptance_rate" in g and g["acceptance_rate"].notna().any():
            quality_cost += "; acceptance " + ", ".join(
                f"{r['task']}/{r['language']} {r['acceptance_rate']:.2f}" for _, r in g.iterrows())
        text = f"{name}: " + ("; ".join(pays) if pays else "faster on no workload")
        if not_pays:
            text += "; stops paying on " + "; ".join(not_pays)
        parts.append(f"{text} ({quality_cost}).")
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else tuple(table["point_id"])
    return evidence.Finding(" ".join(parts), "; ".join(ev), supported, ids)


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
    fig.update_layout(barmode="group", title="Speed-up over plain greedy float32 (95% interval) and the upper bound",
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
