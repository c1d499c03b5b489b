"""Findings a reader can scan: one claim sentence with its mark, per-arm figures in a table, a summary first."""
from tests.share.test_report import fake_point, make_run
from workbench.run import results
from workbench.share import findings, report
from workbench.stats import evidence

SCHEDULING = ("For interactive traffic mixed with long reports, priority lowers the short requests' TTFT (x0.62 of "
              "fcfs) at x1.10 background e2e. priority: interactive TTFT vs fcfs: 0.62x, 95% interval 0.50-0.77x "
              "(paired t on log ratios); background e2e vs fcfs: no difference beyond noise: 1.10x, 95% interval "
              "0.95-1.27x (paired t); sjf: interactive TTFT vs fcfs: not supported: 0.91x (no interval).")
TUNING = ("Recommended: bfloat16 sdpa (1.45x faster than float32 eager). float32 sdpa: 1.02x (95% interval "
          "0.95-1.10x: no difference beyond noise). bfloat16 sdpa: 1.45x (95% interval 1.30-1.62x: faster). Caveat: "
          "the adaptive search, replayed on this grid, finds the same configuration with 4 of 8 measurements.")


def test_split_finding_claim_arms_and_notes():
    claim, rows, notes = findings.split_finding(SCHEDULING)
    assert claim.startswith("For interactive traffic") and claim.endswith("background e2e.")
    assert [r["arm"] for r in rows] == ["priority · interactive TTFT vs fcfs", "priority · background e2e vs fcfs",
                                        "sjf · interactive TTFT vs fcfs"]
    assert [(r["estimate"], r["interval"], r["verdict"]) for r in rows] == [
        ("0.62x", "0.50-0.77x", "below 1"), ("1.10x", "0.95-1.27x", "no difference beyond noise"),
        ("0.91x", "", "not supported")]
    claim, rows, notes = findings.split_finding(TUNING)
    assert claim == "Recommended: bfloat16 sdpa (1.45x faster than float32 eager)."
    assert [r["verdict"] for r in rows] == ["no difference beyond noise", "faster"]
    assert notes == ["Caveat: the adaptive search, replayed on this grid, finds the same configuration with 4 of 8 "
                     "measurements."]


LONG_OUTPUT = ("en: outline_batch has the shortest wall time (2.8 s). outline_batch wall time vs one_shot (en): 0.88x, "
               "98% interval 0.86x-0.90x (t over the log ratios of 3 rounds, 2 dof; Holm over 2 comparisons), adjusted "
               "p 0.00169; A/A noise floor 0.96-1.05x (3 interleaved rounds). outline_sequential wall time vs one_shot "
               "(en): no difference beyond noise: 1.08x, 95% interval 0.95x-1.22x (t over the log ratios of 3 rounds, "
               "2 dof; Holm over 2 comparisons), adjusted p 0.127; A/A noise floor 0.96-1.05x (3 interleaved rounds). "
               "First chunk only after the last token: buffering_on; before it: direct, buffering_off.")


def test_each_comparison_is_its_own_arm_with_its_own_interval_not_the_aa_floor():
    """A run's report showed the A/A noise floor as batch size's interval (the estimate's "2.68x-4.43x" was not read:
    an ``x`` before the dash), split an arm at the ";" inside its "(t over ..., 2 dof; Holm ...)", and named each
    comparison after the previous one ("outline_batch ... · outline_sequential ...")."""
    claim, rows, notes = findings.split_finding(LONG_OUTPUT)
    assert [r["arm"] for r in rows] == ["outline_batch wall time vs one_shot (en)",
                                        "outline_sequential wall time vs one_shot (en)"]
    assert [(r["estimate"], r["interval"]) for r in rows] == [("0.88x", "0.86x-0.90x"), ("1.08x", "0.95x-1.22x")]
    assert rows[1]["verdict"] == "no difference beyond noise" and "Holm over 2 comparisons" in rows[0]["detail"]
    assert "A/A noise floor 0.96-1.05x (3 interleaved rounds)." in notes
    assert not any(r["arm"] == "before it" for r in rows)      # an item without a figure is a note


def test_a_moved_aa_floor_is_a_note_not_an_arm_named_before_its_colon():
    """A run's reasoning table listed "A/A noise floor 1.01-1.07x (moved" as an arm with estimate 1 (the colon of
    "(moved: excludes 1)" read as the arm's)."""
    text = ("From budget 0.0 to 32.0, accuracy: no difference beyond noise. Time to first answer token at budget "
            "32.0 vs 0.0: not supported: the A/A control moved: 3.06x, 95% interval 0.68x-13.74x (t over the log "
            "ratios of 2 rounds, 1 dof; Holm over 2 comparisons), adjusted p 0.0867; A/A noise floor 1.01-1.07x "
            "(moved: excludes 1) (2 interleaved rounds).")
    _, rows, notes = findings.split_finding(text)
    assert [(r["arm"], r["estimate"], r["interval"]) for r in rows] == [
        ("Time to first answer token at budget 32.0 vs 0.0", "3.06x", "0.68x-13.74x")]
    assert "A/A noise floor 1.01-1.07x (moved: excludes 1) (2 interleaved rounds)." in notes


def test_per_path_values_are_notes_and_a_repeated_aa_floor_is_shown_once():
    """The streaming reader's table listed "buffering_on 1.913" (a path's TTFT, no comparison) among the ratios,
    and its notes repeated the A/A floor once per comparison."""
    aa = "A/A noise floor 0.75-1.21x (3 interleaved rounds)"
    text = (f"Client TTFT through nginx buffering_on vs direct: 14.80x, 98% interval 13.79x-15.87x; {aa}. "
            f"buffering_off vs direct: no difference beyond noise: 0.87x, 95% interval 0.60x-1.25x; {aa}. "
            "Client TTFT p50 by path: direct: TTFT 0.130 s, of which path 0.004 s; buffering_on: TTFT 1.913 s, of "
            "which path 1.803 s (e2e 1.913 s, TTFT/e2e 100%).")
    _, rows, notes = findings.split_finding(text)
    assert [r["arm"] for r in rows] == ["buffering_off vs direct"]
    assert notes.count(aa + ".") == 1
    assert any(n.startswith("buffering_on: TTFT 1.913 s") for n in notes)


def test_report_opens_with_a_summary_and_tables_the_arms():
    run = make_run([fake_point(batch_size=1)])
    results.save_finding(run, "scheduling", evidence.Finding(SCHEDULING, "6 usable points", True, ()))
    results.save_finding(run, "engine_tuning", evidence.Finding(TUNING, "3 configurations", False, ()))
    page = report.build_report(run, figures="none").read_text()
    summary = page.index("<h2>Summary</h2>")
    assert summary < page.index("<h2>Findings</h2>") and summary < page.index("class='downloads meta'>Data:")
    block = page[summary:page.index("</div>", summary)]
    assert f"href='#{findings.exp_anchor(run, 'scheduling')}'" in block and "priority lowers" in block
    assert "no supported effect" in block and f"href='#{findings.exp_anchor(run, 'engine_tuning')}'" in block
    # a finding with a verdict carries that word in the summary as in the findings list (three verdicts, not two)
    results.save_finding(run, "engine_tuning", evidence.Finding(TUNING, "3 configurations", False, (),
                                                                verdict="undecided"))
    results.save_finding(run, "long_output", evidence.Finding("outline_batch vs one_shot: equivalent", "", True, (),
                                                              verdict="equivalent"))
    again = report.build_report(run, figures="none").read_text()
    block = again[again.index("<h2>Summary</h2>"):again.index("</div>", again.index("<h2>Summary</h2>"))]
    assert "class='unsupported'>undecided</span>" in block and "no supported effect" not in block
    assert "class='supported'>equivalent</span> outline_batch" in block
    assert "explorer" in block and "no finding recorded" in block
    # experiments without a finding of their own share one line after the findings (04's parts sat between them)
    assert block.count("no finding recorded") == 1 and block.index("no finding recorded") > block.index("priority lowers")
    assert page.count("<table class='arms'>") >= 2 and "<td>priority · interactive TTFT vs fcfs</td>" in page
    assert "<td>0.50-0.77x</td>" in page
    # the claim sentence comes right after the mark; the per-arm phrases are not repeated as a paragraph
    assert "class='supported'>supported</span> For interactive traffic" in page
    assert "(paired t on log ratios); background" not in page


def test_an_arms_estimate_is_its_ratio_not_a_digit_of_a_name():
    """The default run's scheduling table showed '90' as sjf's estimate (the 90 of 'TTFT p90')."""
    from workbench.share.findings import split_finding

    text = ("Scheduling: not supported: no policy is below fcfs here. sjf: interactive TTFT p90 vs fcfs 1.06x "
            "(0.01-128.13x), no difference beyond noise; lanes: interactive TTFT p90 vs fcfs 1.04x (0.02-44.93x).")
    rows = split_finding(text)[1]
    assert [(r["arm"], r["estimate"], r["interval"]) for r in rows] == [
        ("sjf", "1.06x", "0.01-128.13x"), ("lanes", "1.04x", "0.02-44.93x")]
