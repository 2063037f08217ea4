import pytest

from hookscope.doctor.schedule import Cadence, RecordingSchedule


def test_schedule_records_warmup_interval_and_alerts_and_resumes_its_alert():
    schedule = RecordingSchedule(warmup=3, every=10)
    assert [s for s in range(25) if schedule(s)] == [0, 1, 2, 10, 20]
    schedule.tighten(14)
    assert [s for s in range(25) if schedule(s)] == [0, 1, 2, *range(3, 14), 20]
    resumed = RecordingSchedule(warmup=3, every=10)
    resumed.load_state_dict(schedule.state_dict())
    assert [s for s in range(25) if resumed(s)] == [s for s in range(25) if schedule(s)]


def test_a_window_records_the_first_steps_of_every_interval():
    schedule = RecordingSchedule(warmup=3, every=10, window=2)
    assert [s for s in range(25) if schedule(s)] == [0, 1, 2, 10, 11, 20, 21]
    with pytest.raises(ValueError, match="window=11; use warmup >= 0, every >= 1 and 1 <= window <= every"):
        RecordingSchedule(every=10, window=11)


def test_a_fixed_cadence_doubles_its_interval_with_each_thinning_the_adaptive_one_keeps_it():
    fixed = Cadence(3)
    assert [s for s in range(13) if fixed(s)] == [0, 3, 6, 9, 12]
    fixed.follow(2)  # the histories were halved twice
    assert fixed.every == 12 and [s for s in range(25) if fixed(s)] == [0, 12, 24]
    adaptive = Cadence(None)
    adaptive.follow(3)
    assert adaptive.every == 50 and [s for s in range(101) if adaptive(s)] == [*range(5), 50, 100]
    assert adaptive.warmup == 5 and fixed.warmup == 0  # the engine's first check comes at its end


def test_a_bad_interval_is_refused_naming_the_owner():
    with pytest.raises(ValueError, match="GradientStats: every=0"):
        Cadence(0, "GradientStats")


def test_the_old_schedule_name_still_works_with_a_warning():
    import hookscope.doctor.schedule as module

    with pytest.warns(DeprecationWarning, match="RecordingSchedule"):
        assert module.Schedule is RecordingSchedule
