"""Findings in the order users read them (findings.json, the report, the command line's list)."""

from hookscope.doctor.findings import Finding, ranked


def _finding(severity: str, step: int) -> Finding:
    return Finding("plateau", "", step, severity, f"{severity} at step {step}")


def test_ranked_puts_the_most_severe_first_then_the_earliest():
    findings = [_finding("info", 1), _finding("error", 9), _finding("warning", 3), _finding("error", 2)]
    assert [(f.severity, f.step) for f in ranked(findings)] == [
        ("error", 2),
        ("error", 9),
        ("warning", 3),
        ("info", 1),
    ]


def test_an_unknown_severity_ranks_as_info_and_the_input_is_left_alone():
    findings = [_finding("notice", 1), _finding("info", 0), _finding("warning", 5)]
    assert [f.severity for f in ranked(findings)] == ["warning", "info", "notice"]
    assert [f.severity for f in findings] == ["notice", "info", "warning"]
