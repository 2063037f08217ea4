from hookscope.doctor.finding_log import FindingLog
from hookscope.doctor.findings import Finding, ranked


def _finding(kind, module):
    return Finding(kind, module, 0, "warning", f"{kind} at {module}")


def test_findings_are_kept_once_per_kind_and_module_whole_model_kinds_once_and_printed_up_to_max(capsys):
    log = FindingLog(max_print=2)
    new = log.add([_finding("dead_units", "a"), _finding("dead_units", "b"), _finding("dead_units", "a")])
    assert [f.module for f in new] == ["a", "b"]
    assert log.add([_finding("plateau", ""), _finding("exploding_gradient", "x")]) != []
    assert log.add([_finding("exploding_gradient", "y")]) == [] and not log.is_new(_finding("plateau", ""))
    assert capsys.readouterr().err.count("Doctor [warning]") == 2
    restored = FindingLog()
    restored.load_state_dict(log.state_dict())
    assert restored.findings == log.findings and restored.describe() == log.describe()
    assert restored.add([_finding("dead_units", "a")]) == []


def _at(kind, module, step, severity="warning"):
    return Finding(kind, module, step, severity, f"{kind} at {module}")


def test_a_cause_leads_the_symptoms_of_its_check_and_adopts_later_ones(capsys):
    log = FindingLog()
    divergence, stale = _at("loss_divergence", "", 4, "error"), _at("stale_gradients", "", 1, "error")
    new = log.add([divergence, _at("dead_units", "3", 2), stale])  # the rules' order: symptom first
    assert [f.kind for f in new] == ["stale_gradients", "loss_divergence", "dead_units"]
    assert log.findings[0].explains == (("loss_divergence", ""),)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("Doctor [error] stale_gradients")
    assert lines[1].startswith("Doctor   explains: [error] loss_divergence")
    log.add([_at("oscillating_loss", "", 30)])  # a later check: under the same cause, named
    assert log.findings[0].explains == (("loss_divergence", ""), ("oscillating_loss", ""))
    assert "explains (under stale_gradients above): [warning] oscillating_loss" in capsys.readouterr().err
    assert [f.kind for f in log.findings] == [  # the order of appearance: trackers read it by position
        "stale_gradients",
        "loss_divergence",
        "dead_units",
        "oscillating_loss",
    ]
    restored = FindingLog()
    restored.load_state_dict(log.state_dict())
    assert restored.findings == log.findings


def test_a_cause_found_after_its_symptoms_explains_them_and_ranked_nests_them():
    log = FindingLog(quiet=True)
    log.add([_at("update_ratio", "0", 25), _at("update_ratio", "2", 25), _at("plateau", "", 40, "info")])
    log.add([_at("lr_schedule", "", 20, "error"), _at("update_ratio", "4", 60)])
    cause = log.findings[3]
    assert cause.kind == "lr_schedule"
    assert cause.explains == (
        ("update_ratio", "0"),
        ("update_ratio", "2"),
        ("plateau", ""),
        ("update_ratio", "4"),
    )
    order = [(f.kind, f.module) for f in ranked([*log.findings, _at("dead_units", "1", 3, "error")])]
    assert order == [("dead_units", "1"), ("lr_schedule", ""), *cause.explains]


def test_a_symptom_belongs_to_one_cause_and_unrelated_kinds_to_none():
    log = FindingLog(quiet=True)
    log.add([_at("stale_gradients", "", 1), _at("unshuffled_data", "", 9), _at("oscillating_loss", "", 20)])
    stale, unshuffled = log.findings[0], log.findings[1]
    assert stale.explains == (("oscillating_loss", ""),) and unshuffled.explains == ()
    log.add([_at("dead_units", "1", 3), _at("plateau", "", 50)])
    assert log.findings[1].explains == (("plateau", ""),) and log.findings[3].explains == ()


def test_a_more_severe_finding_of_a_logged_kind_is_kept_a_milder_one_is_not():
    log = FindingLog(quiet=True)
    assert log.add([_at("unshuffled_data", "", 0, "info")]) != []  # the loader does not shuffle
    assert log.add([_at("unshuffled_data", "", 12, "warning")]) != []  # the label mix is far off
    assert log.add([_at("unshuffled_data", "", 20, "info"), _at("unshuffled_data", "", 30)]) == []
    restored = FindingLog(quiet=True)
    restored.load_state_dict(log.state_dict())
    assert not restored.is_new(_at("unshuffled_data", "", 40)) and restored.is_new(
        _at("unshuffled_data", "", 0, "error")
    )
