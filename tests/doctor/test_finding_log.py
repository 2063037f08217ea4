from hookscope.doctor.finding_log import FindingLog
from hookscope.doctor.findings import Finding


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
