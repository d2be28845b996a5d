"""The measured choice between a plan and the native backend: trials alternate, ranks agree, ties go native."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from topocc.runtime.distributed.tuning import MARGIN, TRIALS, Arm, Choice, Tuner, call_class, tuning_enabled
from topocc.runtime.errors import CommunicatorError


def agreed(times: list[dict[Arm, float]]) -> Callable[[list[float]], list[float]]:
    """What the MIN all-reduce gives ranks whose trials take ``times``: the fastest rank's time of each arm."""
    return lambda figures: [min(t[Arm.TRY_PLAN] for t in times), min(t[Arm.TRY_NATIVE] for t in times)]


def run_trials(tuners: list[Tuner], times: list[dict[Arm, float]]) -> list[Choice | None]:
    cls = call_class("allreduce", None, "cpu", 4096)
    for _ in range(2 * TRIALS):
        arms = {t.arm(cls) for t in tuners}
        assert len(arms) == 1 and arms <= {Arm.TRY_PLAN, Arm.TRY_NATIVE}  # every rank runs the same arm
        arm = arms.pop()
        choices = [t.record(cls, arm, when[arm], agreed(times)) for t, when in zip(tuners, times)]
    return choices


def test_trials_alternate_from_the_native_backend_and_then_the_agreed_choice_holds() -> None:
    times = [{Arm.TRY_PLAN: 2.0, Arm.TRY_NATIVE: 5.0}, {Arm.TRY_PLAN: 1.0, Arm.TRY_NATIVE: 3.0}]
    tuners = [Tuner() for _ in times]
    cls = call_class("allreduce", None, "cpu", 4096)
    assert tuners[0].arm(cls) is Arm.TRY_NATIVE  # a class's first call costs what gloo's does
    run_trials(tuners, times)
    for t in tuners:
        assert t.choices[cls] == Choice(1.0, 3.0)  # the fastest rank's figures, for both arms
        assert t.arm(cls) is Arm.PLAN
    # another size class: its own trials
    assert tuners[0].arm(call_class("allreduce", None, "cpu", 8192)) is Arm.TRY_NATIVE
    # CUDA tensors have their own native backend (NCCL), so the same size on CUDA is a class of its own
    assert tuners[0].arm(call_class("allreduce", None, "cuda", 4096)) is Arm.TRY_NATIVE


def test_a_class_that_goes_native_names_the_backend_it_lost_to() -> None:
    assert Choice(2.0, 1.0).why("nccl").startswith("measured no faster than nccl")


@pytest.mark.parametrize(("plan_s", "planned"), [(1.0, False), (1.0 - MARGIN / 2, False), (1.0 - 2 * MARGIN, True)])
def test_a_plan_within_the_margin_of_gloo_goes_native(plan_s: float, planned: bool) -> None:
    assert Choice(plan_s, 1.0).planned is planned
    tuners = [Tuner()]
    run_trials(tuners, [{Arm.TRY_PLAN: plan_s, Arm.TRY_NATIVE: 1.0}])
    assert tuners[0].arm(call_class("allreduce", None, "cpu", 4096)) is (Arm.PLAN if planned else Arm.NATIVE)


def test_each_rank_keeps_its_best_trial_so_a_first_slow_call_does_not_count() -> None:
    tuner = Tuner()
    cls = call_class("broadcast", 0, "cpu", 100)
    for seconds in (9.0, 1.0, 0.5, 2.0):  # native 9, plan 1, native 0.5, plan 2
        choice = tuner.record(cls, tuner.arm(cls), seconds, lambda figures: figures)
    assert choice == Choice(1.0, 0.5)


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("on", True), ("1", True), ("off", False),
                                                ("0", False), ("FALSE", False)])
def test_topocc_tune_turns_the_trials_on_and_off(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                 enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv("TOPOCC_TUNE", raising=False)
    else:
        monkeypatch.setenv("TOPOCC_TUNE", value)
    assert tuning_enabled() is enabled


def test_a_bad_topocc_tune_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPOCC_TUNE", "sometimes")
    with pytest.raises(CommunicatorError) as err:
        tuning_enabled()
    assert "\n" not in str(err.value) and "TOPOCC_TUNE=on" in str(err.value)
