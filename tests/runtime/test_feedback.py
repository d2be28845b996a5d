"""Error feedback on encoded all-reduces: the ranks' residuals add up to exactly what the encodings dropped
(sum of inputs minus the result), over several algorithms, encodings and steps, with the variants (error
averaging, DCT's threshold) keeping every rank bitwise equal; exact plans and exact calls leave residuals
alone.  Ranks are threads of this process (:mod:`tests.runtime.thread_transport`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from tests.runtime.test_executor_encoding import _plans
from tests.runtime.thread_transport import Hub, ThreadTransport
from topocc.runtime.communicator import Communicator
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.feedback import ErrorFeedback, FeedbackOptions, parse_feedback
from topocc.runtime.schedule import Schedule

N = 2 * 1001 + 5  # chunks of unequal sizes


def run_steps(plan: Schedule, steps: list[list[np.ndarray]], options: FeedbackOptions,
              call: Callable[[Communicator, ErrorFeedback, np.ndarray], np.ndarray | None] | None = None
              ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Every rank (a thread) all-reduces its input of each step with error feedback (or runs ``call``, whose
    result, if it returns one, is the rank's): each step's results and residuals, by step and rank."""
    ranks = len(steps[0])
    hub = Hub(ranks)
    results = [[np.empty(0)] * ranks for _ in steps]
    residuals = [[np.empty(0)] * ranks for _ in steps]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            comm = Communicator(plan, transport=ThreadTransport(hub, r), timeout=60.0)
            feedback = ErrorFeedback(options)
            for t, inputs in enumerate(steps):
                x = inputs[r].copy()
                out = feedback.allreduce(comm, "bucket", x, "sum") if call is None else call(comm, feedback, x)
                results[t][r] = out if out is not None else x
                found = feedback.residuals.get("bucket")
                residuals[t][r] = found.values.copy() if found is not None else np.zeros_like(x)
        except BaseException as exc:
            errors.append(exc)
            hub.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return results, residuals


def _steps(ranks: int, count: int, seed: int = 3) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(N).astype(np.float32) for _ in range(ranks)] for _ in range(count)]


def check_identity(steps: list[list[np.ndarray]], results: list[list[np.ndarray]],
                   residuals: list[list[np.ndarray]]) -> float:
    """Each step: every rank bitwise equal, and the residuals' sum is the inputs' (with the residuals they
    carried in) less the result, to float rounding; the largest |result - exact sum| seen (what was dropped)."""
    carried = np.zeros((len(steps[0]), N))
    dropped = 0.0
    for inputs, got, left in zip(steps, results, residuals):
        assert all(r.tobytes() == got[0].tobytes() for r in got)
        exact = np.sum(np.array(inputs, np.float64) + carried, axis=0)
        result = got[0].astype(np.float64)
        kept = np.sum(np.array(left, np.float64), axis=0)
        scale = np.abs(exact).max()
        assert np.abs(exact - result - kept).max() <= 2e-6 * scale
        dropped = max(dropped, float(np.abs(exact - result).max()))
        carried = np.array(left, np.float64)
    return dropped


@pytest.mark.parametrize(("algorithm", "policy", "topology"), [
    ("ring", "bf16@inter-rack", "emu-racks"), ("hierarchical", "topk:1%@inter-rack", "emu-racks"),
    ("halving-doubling", "int8@inter-rack", "emu-racks"), ("tree", "int8@inter-rack", "emu-racks"),
    ("multitree", "fp16@inter-rack", "emu-racks"), ("direct", "topk:5%@inter-rack", "emu-racks"),
    ("treepack", "bf16@slow", "emu-racks"), ("bucket", "bf16@inter-host", "torus-4x4"),
    ("mcf", "int8@host-switch", "emu-uniform"),
])
def test_the_residuals_sum_to_what_the_encodings_dropped(algorithm: str, policy: str, topology: str) -> None:
    _, plan = _plans("allreduce", algorithm, policy, topology)
    steps = _steps(plan.ranks, 2)
    dropped = check_identity(steps, *run_steps(plan, steps, FeedbackOptions()))
    assert dropped > 1e-4  # the plan did drop something for the residuals to hold


@pytest.mark.parametrize(("algorithm", "spec"), [
    ("ring", "threshold:2,error-avg:3"), ("halving-doubling", "threshold:3"), ("hierarchical", "threshold:2"),
    ("direct", "step-ahead,error-avg:2"),
])
def test_thresholds_and_error_averaging_keep_the_ranks_equal_and_the_sum(algorithm: str, spec: str) -> None:
    """DCT's threshold changes which elements top-k sends between refreshes, and error averaging moves
    residuals between ranks; neither breaks the bitwise agreement or the sum."""
    _, plan = _plans("allreduce", algorithm, "topk:5%@inter-rack")
    options = parse_feedback(spec)
    assert options is not None
    steps = _steps(plan.ranks, 4, seed=5)
    results, residuals = run_steps(plan, steps, options)
    check_identity(steps, results, residuals)
    if options.average_every:
        averaged = residuals[options.average_every - 1]
        assert all(r.tobytes() == averaged[0].tobytes() for r in averaged) and averaged[0].any()


def test_the_threshold_sends_what_passes_it_between_refreshes() -> None:
    """With threshold:4, call 1 selects top-k exactly (as without it) and keeps its threshold.  Call 2 gets zero
    gradients: its inputs are the residuals, the small values call 1 left, which fall below the threshold, so
    it sends almost none of them where plain top-k sends its k largest; the sum holds either way."""
    _, plan = _plans("allreduce", "ring", "topk:5%@inter-rack")
    base = _steps(plan.ranks, 1, seed=9)[0]
    steps = [base, [np.zeros_like(x) for x in base]]
    plain = run_steps(plan, steps, FeedbackOptions())
    dct = run_steps(plan, steps, FeedbackOptions(threshold_every=4))
    assert [r.tobytes() for r in plain[0][0]] == [r.tobytes() for r in dct[0][0]]  # a refresh: exact top-k
    check_identity(steps, *dct)
    held = [[np.linalg.norm(np.sum(run[1][t], axis=0)) for t in range(2)] for run in (plain, dct)]
    assert held[0][1] < 0.95 * held[0][0]  # plain top-k sent some of what call 1 held back
    assert held[1][1] > 0.99 * held[1][0]  # DCT's threshold let almost none of it pass


@pytest.mark.parametrize(("algorithm", "policy"), [
    ("ring", "int8@inter-rack"), ("halving-doubling", "bf16@inter-rack"), ("hierarchical", "topk:5%@inter-rack"),
    ("direct", "topk:5%@inter-rack"), ("multitree", "int8@inter-rack"), ("treepack", "bf16@slow"),
])
def test_reduce_scatter_residuals_sum_to_what_the_encodings_dropped(algorithm: str, policy: str) -> None:
    """A reduce-scatter's residual spans its input: over the ranks, the residuals add up to the inputs' sum (with
    the residuals carried in) less the ranks' output blocks laid end to end; the caller's input is untouched.
    The last step's inputs are zero: what it delivers is the residual the steps before carried into it."""
    _, plan = _plans("reducescatter", algorithm, policy)
    ranks, block = plan.ranks, 997
    rng = np.random.default_rng(4)
    steps = [[rng.standard_normal(ranks * block).astype(np.float32) for _ in range(ranks)] for _ in range(2)]
    steps.append([np.zeros(ranks * block, np.float32) for _ in range(ranks)])

    def reduce_scatter(comm: Communicator, feedback: ErrorFeedback, x: np.ndarray) -> np.ndarray:
        before = x.copy()
        out = feedback.reduce_scatter(comm, "bucket", x, np.empty(block, np.float32))
        assert np.array_equal(x, before)
        return out

    results, residuals = run_steps(plan, steps, FeedbackOptions(), reduce_scatter)
    carried = np.zeros((ranks, ranks * block))
    dropped = 0.0
    for inputs, got, left in zip(steps, results, residuals):
        exact = np.sum(np.array(inputs, np.float64) + carried, axis=0)
        result = np.concatenate(got).astype(np.float64)
        kept = np.sum(np.array(left, np.float64), axis=0)
        assert np.abs(exact - result - kept).max() <= 2e-6 * np.abs(exact).max()
        dropped = max(dropped, float(np.abs(exact - result).max()))
        carried = np.array(left, np.float64)
    assert dropped > 1e-4  # the plan did drop something for the residuals to hold
    assert np.abs(np.concatenate(results[-1])).max() > 1e-4  # the carried residual went out with zero gradients


def test_exact_plans_and_exact_calls_leave_the_residual_alone() -> None:
    exact_plan, plan = _plans("allreduce", "ring", "int8@inter-rack")
    steps = _steps(exact_plan.ranks, 1)
    results, residuals = run_steps(exact_plan, steps, FeedbackOptions())
    assert not any(r.any() for r in residuals[0])
    assert np.allclose(results[0][0], np.sum(steps[0], axis=0), atol=1e-4)
    ints = [[x.astype(np.int32) * 100 for x in steps[0]]]

    def integer(comm: Communicator, feedback: ErrorFeedback, x: np.ndarray) -> None:
        feedback.allreduce(comm, "bucket", x, "sum")
        assert feedback.residuals["bucket"].calls == 0  # int32 goes exact

    results, _ = run_steps(plan, ints, FeedbackOptions(), integer)
    assert all(np.array_equal(r, np.sum(ints[0], axis=0, dtype=np.int32)) for r in results[0])

    def maximum(comm: Communicator, feedback: ErrorFeedback, x: np.ndarray) -> None:
        feedback.allreduce(comm, "bucket", x, "max")
        assert feedback.residuals["bucket"].calls == 0 and not feedback.residuals["bucket"].values.any()

    results, _ = run_steps(plan, steps, FeedbackOptions(), maximum)
    assert all(np.array_equal(r, np.max(steps[0], axis=0)) for r in results[0])


@pytest.mark.parametrize(("text", "spec"), [
    ("ef", "ef"), ("EF", "ef"), ("step-ahead", "step-ahead"), ("error-avg", "error-avg:8"),
    ("error-avg:2, threshold:16", "error-avg:2,threshold:16"), ("step-ahead,error-avg:1", "step-ahead,error-avg:1"),
])
def test_options_parse(text: str, spec: str) -> None:
    options = parse_feedback(text)
    assert options is not None and options.spec == spec
    assert parse_feedback(options.spec) == options


@pytest.mark.parametrize("text", ["", "off", "none"])
def test_off_is_none(text: str) -> None:
    assert parse_feedback(text) is None


@pytest.mark.parametrize(("text", "fragment"), [
    ("efx", "'efx' is not an error-feedback option"), ("error-avg:0", "'0' is not a positive number of calls"),
    ("threshold", "'threshold' is not an error-feedback option"), ("threshold:x", "'x' is not a positive"),
])
def test_bad_options_are_one_line_with_the_fix(text: str, fragment: str) -> None:
    with pytest.raises(CommunicatorError, match=fragment) as info:
        parse_feedback(text)
    line = info.value.one_line()
    assert "TOPOCC_ERROR_FEEDBACK=" in line and "fix: write ef, step-ahead" in line and "\n" not in line
