"""workbench.stats.decisions: how a decision is written."""

from workbench.stats import decisions


def test_level_text_gives_a_level_the_digits_it_needs():
    """A first look's O'Brien-Fleming level (~0.997) read "100% interval" and 97.5% read "98%" under ``:.0%``."""
    assert decisions.level_text(0.95) == "95%"
    assert decisions.level_text(0.975) == "97.5%"
    assert decisions.level_text(1 - 0.05 / 3) == "98.3%"
    assert decisions.level_text(0.9967) == "99.7%"
    assert decisions.level_text(0.99996) == "99.996%"
    d = decisions.Decision("b", "a", 1.4, 1.02, 1.93, 0.9967, "direction", "higher", 1.05, 4, 6, "x")
    assert "99.7% interval 1.02-1.93x" in d.interval_text()


def test_an_undecided_decision_never_reads_about_0_rounds():
    """0 is a decided comparison's rounds_needed; an undecided one carrying it (a secondary outcome's row) says it has
    no estimate of its own instead of "about 0 rounds would decide it"."""
    d = decisions.Decision("b", "a", 1.66, 0.85, 3.26, 0.976, "undecided", "", 1.05, 3, 2, "x", rounds_needed=0)
    assert "about 0 rounds" not in d.describe("output throughput") and "no estimate" in d.needed_text()
