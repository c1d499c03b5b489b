"""A run's findings as the report shows them: each experiment's finding (a claim sentence, its supported / not
supported mark from :class:`workbench.stats.evidence.Finding`, its evidence and the points it rests on) split for
display (:func:`split_finding`: the claim, the per-arm figures as a small table, the caveats as notes), the report's
opening summary (per experiment its claim and verdict), the findings list of a run's section,
the same findings as a table for pandas (:func:`findings_table`), and the anchors that link a finding to its
experiment's heading and its points' rows. Presentation only: the text is the experiment's own, nothing is
recomputed; :mod:`workbench.share.report` assembles the page.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd

from workbench.run import results
from workbench.stats import evidence


def point_anchor(run: Path, point_id) -> str:
    """The id of a point's row in the point table (what a finding links to)."""
    return "pt-" + re.sub(r"[^A-Za-z0-9_.-]", "-", f"{run.name}-{point_id}")


def exp_anchor(run: Path, exp: str) -> str:
    """The id of an experiment's heading in a run's section."""
    return "exp-" + re.sub(r"[^A-Za-z0-9_.-]", "-", f"{run.name}-{exp}")


_SENTENCE_END = re.compile(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.!?])\s+(?=\S)")
_ITEM_SPLIT = re.compile(r"(?<=[.;])\s+(?=[A-Za-z\[(])")
_ARM = re.compile(r"^([A-Za-z0-9_][\w .+/=,()\-]{0,60}?):\s+(.+)$", re.S)
# an estimate as written: a ratio (1.59x, x4.06) first, else the first number that is not part of a name (p90, k=4)
_RATIO = re.compile(r"(?<![\w.])(?:x\d+(?:\.\d+)?|\d+(?:\.\d+)?x)(?![\w-])")
_ESTIMATE = re.compile(r"(?<![\w.=\-])\d+(?:\.\d+)?x?")
_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)x?\s*[-–]\s*(\d+(?:\.\d+)?)x?")
_VERDICTS = ("guard FAILED", "invalid", "misses the SLO", "no difference beyond noise", "not supported", "faster",
             "slower", "helps", "hurts", "lower", "higher", "no interval")


def _items(rest: str) -> list[str]:
    """``rest`` split at ``. `` / ``; `` outside parentheses (an interval's "(t over 3 rounds, 2 dof; Holm over 2
    comparisons)" stays with its arm)."""
    out, start = [], 0
    for m in _ITEM_SPLIT.finditer(rest):
        head = rest[start:m.start()]
        if rest[:m.start()].count("(") <= rest[:m.start()].count(")"):
            out.append(head)
            start = m.end()
    return out + [rest[start:]]


def split_finding(text: str) -> tuple[str, list[dict], list[str]]:
    """A finding's text as the report shows it: the claim (its first sentence), the per-arm figures the rest
    lists as ``ARM: figures`` items with an interval or a verdict (``[{"arm", "estimate", "interval", "verdict",
    "detail"}]``, estimate and interval as written, e.g. ``1.59x`` and ``1.41-1.79x``), and the other sentences
    (caveats, per-arm values that compare nothing, the A/A floor) as notes, each once.
    Presentation only: the text is the experiment's own, nothing is recomputed."""
    text = " ".join(str(text).split())
    parts = _SENTENCE_END.split(text, maxsplit=1)
    claim, rest = parts[0], parts[1] if len(parts) > 1 else ""
    rows, notes = [], []
    for item in (i.strip().rstrip(".;") for i in _items(rest) if i.strip()):
        m = _ARM.match(item)
        # a colon inside parentheses ("A/A noise floor 1.01-1.07x (moved: excludes 1)") names no arm, and the A/A
        # control is the noise floor beside the arms, not one of them
        if not m or m.group(1).lower().startswith(("caveat", "note", "evidence", "a/a")) \
                or m.group(1).count("(") != m.group(1).count(")"):
            notes.append(item + ".")
            continue
        arm, detail = m.group(1), m.group(2)
        group = arm
        inner = _ARM.match(detail)
        if inner and " vs " in inner.group(1):                 # "policy: metric vs base: figures"
            arm, detail = f"{arm} · {inner.group(1)}", inner.group(2)
        elif " vs " in arm and rows and rows[-1].get("group") and " vs " not in rows[-1]["group"]:
            # "metric vs base: figures" of the same policy (a comparison arm is no group of the next one)
            group = rows[-1]["group"]
            arm = f"{group} · {arm}"
        est = _RATIO.search(detail) or _ESTIMATE.search(detail)
        iv = _INTERVAL.search(detail)
        verdict = next((v for v in _VERDICTS if v in detail), "")
        if not verdict and iv:   # as written: which side of 1 the stated interval lies
            lo, hi = float(iv.group(1)), float(iv.group(2))
            verdict = "below 1" if hi < 1 else "above 1" if lo > 1 else "includes 1"
        if not verdict and not iv:   # "before it: direct, ..." or "buffering_on: TTFT 1.913 s, ...": no comparison
            notes.append(item + ".")
            continue
        rows.append({"arm": arm, "group": group, "estimate": (est.group(0) if est else ""),
                     "interval": (iv.group(0) if iv else ""), "verdict": verdict, "detail": detail})
    return claim, rows, list(dict.fromkeys(notes))   # a clause every arm repeats (its A/A floor) shown once


def _arms_table(rows: list[dict]) -> str:
    """The per-arm figures of a finding: arm, estimate, interval, verdict (the full phrase on hover)."""
    body = "".join(f"<tr title='{html.escape(r['detail'])}'><td>{html.escape(r['arm'])}</td>"
                   f"<td>{html.escape(r['estimate'])}</td><td>{html.escape(r['interval'])}</td>"
                   f"<td>{html.escape(r['verdict'])}</td></tr>" for r in rows)
    return ("<table class='arms'><thead><tr><th>arm</th><th>estimate</th><th>interval</th><th>verdict</th></tr>"
            f"</thead><tbody>{body}</tbody></table>")


def finding_html(run: Path, exp: str, value, tag: str = "li") -> str:
    """One finding: one claim sentence and its supported / not supported mark, the per-arm figures in a small
    table beneath (:func:`split_finding`), other sentences as notes, its evidence, and links to its points."""
    f = evidence.Finding.from_value(value)
    word = f.verdict or ("supported" if f.supported else "not supported")
    mark = (f"<span class='supported'>{html.escape(word)}</span>" if f.supported
            else f"<span class='unsupported'>{html.escape(word)}</span>")
    if not f.evidence and not f.point_ids and isinstance(value, str):
        mark = ""  # an old manifest's plain sentence: its support was never recorded
    claim, rows, notes = split_finding(f.text)
    if len(rows) < 2:   # one item is not a table: keep the sentence whole
        claim, rows, notes = f.text, [], []
    body = f"<b><a href='#{exp_anchor(run, exp)}'>{html.escape(exp)}</a></b>: {mark} {html.escape(claim)}"
    if rows:
        body += _arms_table(rows)
    if notes:
        body += f"<div class='evidence'>{html.escape(' '.join(notes))}</div>"
    if f.evidence:
        body += f"<div class='evidence'>Evidence: {html.escape(f.evidence)}</div>"
    if f.point_ids:
        links = ", ".join(f"<a href='#{point_anchor(run, p)}'>{html.escape(p)}</a>" for p in f.point_ids)
        body += (f"<details class='evidence'><summary>rests on {len(f.point_ids)} point"
                 f"{'s' if len(f.point_ids) != 1 else ''}</summary>{links}</details>")
    return f"<{tag} class='finding'>{body}</{tag}>"


def summary_html(run: Path) -> str:
    """The report's opening screen: per experiment its claim with the finding's verdict (``direction``,
    ``equivalent``, ``undecided``; "no supported effect" for a finding recorded without one), each linking to its
    section."""
    manifest = results.read_manifest(run)
    findings = manifest.get("findings", {}) or {}
    exps = list(dict.fromkeys(list(manifest.get("experiments", {})) + list(findings)))
    if not exps:
        return ""
    items, bare = [], []
    # the findings in the order they were recorded (the notebooks' order), then one line for the experiments with
    # none of their own (a notebook's parts, e.g. 04's streaming / granularity / http under streaming_anatomy)
    for exp in [e for e in findings] + [e for e in exps if e not in findings]:
        value = findings.get(exp)
        link = f"<a href='#{exp_anchor(run, exp)}'>{html.escape(exp)}</a>"
        if value is None:
            bare.append(link)
            continue
        f = evidence.Finding.from_value(value)
        claim = split_finding(f.text)[0]
        if f.supported or isinstance(value, str):
            badge = f"<span class='supported'>{html.escape(f.verdict)}</span> " if f.verdict else ""
            items.append(f"<li>{link}: {badge}{html.escape(claim)}</li>")
        else:   # the finding's own verdict word (issue 49: three verdicts, the same in the summary and the list)
            items.append(f"<li>{link}: <span class='unsupported'>{html.escape(f.verdict or 'no supported effect')}"
                         f"</span> <span class='meta'>{html.escape(claim)}</span></li>")
    if bare:
        items.append(f"<li><span class='meta'>no finding recorded of their own (parts of a notebook whose finding is "
                     f"above, or a notebook that stopped before its finding):</span> {', '.join(bare)}</li>")
    return f"<div class='summary'><h2>Summary</h2><ul>{''.join(items)}</ul></div>"


def findings_table(run_dir) -> pd.DataFrame:
    """The run's findings as the report prints them: one row per experiment with ``experiment``, ``finding``
    (the sentence), ``evidence``, ``supported`` (None for an old manifest's plain sentence) and ``points``
    (how many points it rests on)."""
    rows = []
    for exp, value in results.read_manifest(run_dir).get("findings", {}).items():
        f = evidence.Finding.from_value(value)
        rows.append({"experiment": exp, "finding": f.text, "evidence": f.evidence,
                     "supported": None if isinstance(value, str) else f.supported, "points": len(f.point_ids)})
    return pd.DataFrame(rows, columns=["experiment", "finding", "evidence", "supported", "points"])


def findings_html(manifest: dict, run: Path) -> str:
    findings = manifest.get("findings", {})
    if not findings:
        return ""
    items = "".join(finding_html(run, exp, value) for exp, value in findings.items())
    marked = [v for v in findings.values() if isinstance(v, dict)]
    count = (f"<p class='meta'>{html.escape(evidence.verdict_summary(evidence.verdict_counts(marked)))}: a direction "
             "or equivalence within its margin is decided; an undecided comparison says what would decide it.</p>"
             if marked else "")
    return f"<h2>Findings</h2>{count}<ul>{items}</ul>"

