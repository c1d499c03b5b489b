"""The quality guard of any speed technique: perplexity and KL divergence against the float32 reference.

One home for judging a faster configuration of the same model (engine tuning's rungs, speed techniques, any
future technique): the measures the field uses for quantization (llama.cpp's ``perplexity --kl-divergence``,
torchao's and GPTQ's evaluations), on shipped held-out text (``data/heldout``: English and Chinese, public
domain, never drawn on by the prompts), teacher-forced over fixed windows.

Per window of ``window`` tokens (the reference and the candidate read the same ids; each window is scored as
its own sequence from position 0, like llama.cpp's ``perplexity`` chunks):

- ``perplexity``: the candidate's ``exp(mean NLL)`` over every scored token of every window
  (:func:`workbench.measure.quality.perplexity_from_nll`, the one formula); ``perplexity_ref`` the reference's.
- ``perplexity_ratio``: ``perplexity / perplexity_ref`` = ``exp(mean NLL_cand - mean NLL_ref)``; its interval
  is a Student-t interval over the windows' NLL differences, back-transformed (windows are the independent
  units; tokens inside a window are not).
- ``kl_mean``: mean over tokens of ``KL(P_ref || P_cand) = sum_v p_ref(v) (log p_ref(v) - log p_cand(v))``
  (nats; llama.cpp's "Mean KLD"); its interval a t-interval over the windows' means.
- ``top1_agreement``: share of positions whose argmax equals the reference's (llama.cpp's "Same top p").
- The strict view, reported and never judged: greedy continuations of ``greedy_prompts`` held-out prefixes
  (``token_agreement``, ``first_divergence``: :func:`workbench.measure.quality.token_agreement`). Greedy output
  diverges after the first near-tie, so a sound int8 model can differ at token 4; the field judges by the
  distributions instead.

Verdict: ``guard_passed`` when the upper 95% bound of ``perplexity_ratio`` is <= ``max_perplexity_ratio`` and
the upper bound of ``kl_mean`` is <= ``max_kl_mean`` (defaults 1.05 and 0.05 nats: llama.cpp's Q8_0 sits near
+0.1% and KL ~0.001, Q4_K_M near +2-5% and KL ~0.03-0.07 on 7B models). A point estimate inside the tolerance
with an interval reaching past it fails, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

from workbench.errors import ParameterError
from workbench.measure import quality

#: held-out text per language (files under ``data/heldout``)
HELD_OUT = {"en": "en_us_founding_texts.txt", "zh": "zh_daodejing.txt"}
#: the guard's default tolerances (see the module docstring)
#: the most bytes of reference log-probabilities a :class:`Reference` keeps between judgements (above it, each
#: judgement recomputes them: a large vocabulary or many windows)
REFERENCE_LOG_PROBS_BYTES = 256 * 2**20
MAX_PERPLEXITY_RATIO = 1.05
MAX_KL_MEAN = 0.05

#: the guard's row columns
COLUMNS = ("perplexity", "perplexity_ref", "perplexity_ratio", "perplexity_ratio_low", "perplexity_ratio_high",
           "kl_mean", "kl_mean_low", "kl_mean_high", "top1_agreement", "token_agreement", "first_divergence",
           "guard_windows", "guard_passed", "guard_reason")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The guard's tolerances, validated where built.

    Attributes:
        max_perplexity_ratio: upper bound allowed on the perplexity ratio's interval (>= 1).
        max_kl_mean: upper bound allowed on the mean KL divergence's interval (nats/token, > 0).
        confidence: the intervals' nominal coverage, in (0, 1).
    """

    max_perplexity_ratio: float = MAX_PERPLEXITY_RATIO
    max_kl_mean: float = MAX_KL_MEAN
    confidence: float = 0.95

    def __post_init__(self):
        from workbench import checks

        checks.check_float("max_perplexity_ratio", self.max_perplexity_ratio, 1.0, 100.0)
        checks.check_float("max_kl_mean", self.max_kl_mean, 1e-9, 100.0)
        checks.check_float("confidence", self.confidence, 0.5, 0.999)


@dataclasses.dataclass
class Reference:
    """The float32 reference a guard judges against (:func:`reference`).

    Attributes:
        model: the reference :class:`workbench.measure.models.LoadedModel`.
        windows: ``(language, ids)`` per window.
        nll: per window, the reference's per-token NLLs (nats), ``len(ids) - 1`` each.
        prompts, outputs: the strict view's held-out prefixes (ids) and the reference's greedy continuations.
        greedy_tokens: continuation length.
        log_probs: per window, the reference's log-softmax (``[len(ids) - 1, vocab]``, float32, on the model's
            device), kept when all of them fit :data:`REFERENCE_LOG_PROBS_BYTES` (windows x tokens x vocabulary
            floats: 100 MB for the default suite's 4 windows of 128 tokens); None: recomputed at each judgement.
            The reference's forward passes are deterministic, so a kept copy and a recomputation are the same
            numbers; keeping them spares every judgement after the first its reference passes.
    """

    model: object
    windows: list
    nll: list
    prompts: list
    outputs: list
    greedy_tokens: int
    log_probs: list | None = None


def held_out_text(language: str) -> str:
    """The shipped held-out text of ``language`` (``en`` or ``zh``).

    Raises:
        ParameterError: an unknown language or a missing file.
    """
    from workbench.paths import data_dir

    if language not in HELD_OUT:
        raise ParameterError(f"guard_languages: {language!r} is not one of {', '.join(HELD_OUT)}")
    path = Path(data_dir()) / "heldout" / HELD_OUT[language]
    if not path.exists():
        raise ParameterError(f"guard_languages: no held-out text for {language!r} at {path}")
    return path.read_text(encoding="utf-8")


def windows(tokenizer, languages: Sequence[str] = ("en", "zh"), tokens: int = 2048, window: int = 256) -> list:
    """Cut the first ``tokens`` ids of each language's held-out text into whole windows of ``window`` ids.

    Returns:
        ``[(language, ids)]``, ``tokens // window`` per language (fewer when the text is shorter).

    Raises:
        ParameterError: ``window`` < 16 or > ``tokens``, or a language that yields no window.
    """
    if not isinstance(window, int) or not 16 <= window <= tokens:
        raise ParameterError(f"guard_window: must be an integer in [16, guard_tokens={tokens}] (got {window!r})")
    out = []
    for lang in languages:
        ids = tokenizer(held_out_text(lang), add_special_tokens=False)["input_ids"][:tokens]
        n = len(ids) // window
        if n < 1:
            raise ParameterError(f"guard_window: {lang} held-out text has {len(ids)} tokens, fewer than {window}")
        out += [(lang, list(ids[i * window:(i + 1) * window])) for i in range(n)]
    return out


def _log_probs(loaded, ids: Sequence[int]):
    """Log-softmax (float32, ``[len(ids) - 1, vocab]``) of the next-token distributions at every position but
    the last, for one window scored from position 0."""
    import torch

    model = loaded.model
    x = torch.tensor([list(ids)], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=x, use_cache=False).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


def _nll(logp, ids):
    import torch

    target = torch.tensor(list(ids[1:]), device=logp.device)[:, None]
    return (-logp.gather(-1, target)[:, 0]).tolist()


def reference(loaded, languages: Sequence[str] = ("en", "zh"), tokens: int = 2048, window: int = 256,
              greedy_prompts: int = 2, greedy_tokens: int = 16) -> Reference:
    """Score the held-out windows under the reference model (the float32 model) and record its greedy
    continuations for the strict view.

    Args:
        loaded: the reference :class:`workbench.measure.models.LoadedModel` (float32, no technique applied).
        languages: held-out texts to use (``en``, ``zh``).
        tokens: ids read per language (>= ``window``).
        window: ids per window (>= 16).
        greedy_prompts: held-out prefixes for the strict view (0: no greedy view).
        greedy_tokens: greedy tokens per prefix (>= 1).

    Raises:
        ParameterError: bad arguments (before any forward pass).
    """

    if not isinstance(greedy_prompts, int) or greedy_prompts < 0:
        raise ParameterError(f"guard_prompts: must be an integer >= 0 (got {greedy_prompts!r})")
    if not isinstance(greedy_tokens, int) or greedy_tokens < 1:
        raise ParameterError(f"guard_tokens: must be an integer >= 1 (got {greedy_tokens!r})")
    wins = windows(loaded.tokenizer, languages, tokens, window)
    kept, nll, size = [], [], 0
    for _, ids in wins:
        lp = _log_probs(loaded, ids)
        nll.append(_nll(lp, ids))
        size += lp.numel() * lp.element_size()
        kept.append(lp)
    kept = kept if size <= REFERENCE_LOG_PROBS_BYTES else None
    prompts = [ids[: min(64, window // 2)] for _, ids in wins[:: max(1, len(wins) // max(greedy_prompts, 1))]]
    prompts = prompts[:greedy_prompts]
    outputs = []
    if prompts:
        outputs = _greedy(loaded, prompts, greedy_tokens)
    return Reference(model=loaded, windows=wins, nll=nll, prompts=prompts, outputs=outputs,
                     greedy_tokens=greedy_tokens, log_probs=kept)


def _greedy(loaded, prompts: list, n: int, gen_kwargs: dict | None = None) -> list[list[int]]:
    """Greedy continuations of raw id prefixes (no chat template), one at a time (no padding effects)."""
    import torch

    out = []
    kwargs = {"disable_compile": True, **(gen_kwargs or {})}
    for p in prompts:
        x = torch.tensor([p], device=loaded.model.device)
        with torch.inference_mode():
            y = loaded.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False,
                                      pad_token_id=loaded.tokenizer.pad_token_id, **kwargs)
        out.append(y[0, len(p):].tolist())
    return out


def judge(loaded, ref: Reference, limits: Limits | None = None, gen_kwargs: dict | None = None) -> dict:
    """Judge a configuration of the reference's model (``loaded``: dtype, kernel, quantization applied)
    against ``ref``; see the module docstring for every column.

    Args:
        loaded: the configuration's model; it must share the reference's tokenizer (same vocabulary).
        ref: :func:`reference`.
        limits: :class:`Limits` (defaults when None).
        gen_kwargs: further ``generate`` keywords for the strict greedy view (e.g. a static cache).

    Returns:
        a dict of :data:`COLUMNS` (floats; ``guard_passed`` bool, ``guard_reason`` empty when it passes).

    Raises:
        ParameterError: the vocabularies differ (not the same model).
    """

    from workbench.stats.evidence import paired_ratio_interval, t_interval

    limits = limits or Limits()
    nll_c, kl_w, top1, n_tok = [], [], 0, 0
    for i, ((_, ids), nll_r) in enumerate(zip(ref.windows, ref.nll)):
        lp_r = ref.log_probs[i] if ref.log_probs is not None else _log_probs(ref.model, ids)
        lp_c = _log_probs(loaded, ids)
        if lp_c.shape[-1] != lp_r.shape[-1]:
            # some checkpoints pad the head; compare the shared vocabulary only when the tokenizer covers it
            v = min(lp_c.shape[-1], lp_r.shape[-1])
            if len(loaded.tokenizer) > v:
                raise ParameterError("model: the guard compares configurations of one model (vocabularies differ)")
            lp_r, lp_c = lp_r[:, :v], lp_c[:, :v]
        nll_c.append(_nll(lp_c, ids))
        kl = (lp_r.exp() * (lp_r - lp_c)).sum(-1)
        kl_w.append(float(kl.mean()))
        top1 += int((lp_r.argmax(-1) == lp_c.argmax(-1)).sum())
        n_tok += lp_r.shape[0]
        del lp_r, lp_c
    all_c = [x for w in nll_c for x in w]
    all_r = [x for w in ref.nll for x in w]
    ppl_c, ppl_r = quality.perplexity_from_nll(all_c), quality.perplexity_from_nll(all_r)
    # per-window perplexities, paired: the geometric mean ratio and its t-interval over windows
    ratio_iv = paired_ratio_interval([quality.perplexity_from_nll(w) for w in nll_c],
                                     [quality.perplexity_from_nll(w) for w in ref.nll], limits.confidence, "windows")
    kl_iv = t_interval(kl_w, limits.confidence, "windows")
    out = {"perplexity": ppl_c, "perplexity_ref": ppl_r, "perplexity_ratio": ppl_c / ppl_r,
           "perplexity_ratio_low": ratio_iv.low, "perplexity_ratio_high": ratio_iv.high,
           "kl_mean": kl_iv.estimate, "kl_mean_low": kl_iv.low, "kl_mean_high": kl_iv.high,
           "top1_agreement": top1 / n_tok if n_tok else float("nan"),
           "token_agreement": float("nan"), "first_divergence": float("nan"), "guard_windows": len(ref.windows)}
    if ref.prompts:
        share, first = quality.token_agreement(ref.outputs, _greedy(loaded, ref.prompts, ref.greedy_tokens,
                                                                    gen_kwargs))
        out.update(token_agreement=share, first_divergence=first)
    out.update(verdict(out, limits))
    return out


def verdict(row: dict, limits: Limits) -> dict:
    """``{"guard_passed", "guard_reason"}`` of a row holding the guard's columns: the upper bounds (the
    estimate where no interval exists) against the limits; a NaN measure fails."""
    reasons = []
    for name, hi_col, lim in (("perplexity ratio", "perplexity_ratio_high", limits.max_perplexity_ratio),
                              ("mean KL", "kl_mean_high", limits.max_kl_mean)):
        est = row[hi_col.replace("_high", "")]
        hi = row.get(hi_col)
        bound = hi if hi is not None and math.isfinite(hi) else est
        if not (bound <= lim):
            what = "upper 95% bound" if bound is hi else "estimate"
            reasons.append(f"{name} {est:.4g} ({what} {bound:.4g}) > {lim:g}")
    return {"guard_passed": not reasons, "guard_reason": "; ".join(reasons)}


def describe(row: dict) -> str:
    """One line of evidence: ``perplexity x1.004 (95% 1.001-1.007 over 16 windows), mean KL 0.002 nats,
    top-1 agreement 0.97, greedy agreement 0.81``."""
    def iv(lo, hi, fmt):
        return f" (95% {fmt.format(lo)}-{fmt.format(hi)})" if math.isfinite(lo) and math.isfinite(hi) else ""

    return (f"perplexity x{row['perplexity_ratio']:.4g}"
            f"{iv(row['perplexity_ratio_low'], row['perplexity_ratio_high'], '{:.4g}')} over "
            f"{row['guard_windows']} windows, mean KL {row['kl_mean']:.3g} nats"
            f"{iv(row['kl_mean_low'], row['kl_mean_high'], '{:.3g}')}, top-1 agreement {row['top1_agreement']:.3f}, "
            f"greedy agreement {row['token_agreement']:.2f}")
