"""What both searches' policies read of a candidate's capacity (search/capacity.py): whether its processes keep the
usable CPUs busy, on a table of fake trials."""
import pytest

from autoloader.config import LoaderConfig
from autoloader.results import TrialResult
from autoloader.search import capacity


def trial(n, *, util=None, main=None):
    return TrialResult(config=LoaderConfig(n, 2 if n else None), samples_per_s=1.0, worker_cpu_util=util,
                       main_cpu_util=main)


@pytest.mark.parametrize("trial_, usable, level, expected, why", [
    (trial(2, util=0.9, main=0.1), 2, 0.85, True, "2 x 0.9 + 0.1 = 1.9 of 2 CPUs"),
    (trial(2, util=0.4, main=0.1), 2, 0.85, False, "0.9 of 2 CPUs: room to spare"),
    (trial(2), 2, 0.85, False, "nothing measured: not saturated"),
    (trial(8, util=0.2, main=0.05), 2, 0.85, False, "1.65 of 2 CPUs: just under the level"),
    (trial(8, util=0.2, main=0.2), 2, 0.85, True, "1.8 of 2 CPUs: past the level"),
    (trial(0, main=0.95), 1, 0.85, True, "the main process alone fills one CPU"),
    (trial(0, main=0.95), 2, 0.85, False, "... not two"),
    (trial(4, util=0.5, main=0.0), 4, 0.5, True, "a lower level: half the CPUs busy is saturated"),
    (trial(4, util=0.5, main=0.0), 0, 0.85, True, "no usable CPU reads as saturated"),
])
def test_cpu_saturated(trial_, usable, level, expected, why):
    assert capacity.cpu_saturated(trial_, usable_cpus=usable, level=level) is expected, why


@pytest.mark.parametrize("step_s, step_cpu_s, other, usable, step, why", [
    (0.2, 0.38, None, 2, 1.9, "a CNN trained on the CPU: 1.9 of 2 CPUs"),
    (0.2, 0.6, None, 2, 2.0, "at most the usable CPUs"),
    (0.02, 0.002, None, 2, 0.0, "a GPU step's host work: a tenth of a CPU, not counted"),
    (0.02, 0.002, 0.8, 2, 0.0, "another job keeping 0.8 of a CPU busy: shared at equal weight, not taken"),
    (0.2, 0.2, 1.5, 2, 1.0, "the step's CPU only"),
    (None, None, 0.1, 2, 0.0, "nothing timed, a daemon's tenth: nothing counted"),

])
def test_the_cpus_the_step_and_other_processes_keep_busy(step_s, step_cpu_s, other, usable, step, why):
    trial_ = TrialResult(config=LoaderConfig(0), samples_per_s=100.0, consumer_s_per_batch=step_s,
                         consumer_cpu_s_per_batch=step_cpu_s, other_cpus=other)
    assert capacity.step_cpus(trial_, usable_cpus=usable) == pytest.approx(step), why
    assert capacity.step_cpus(None, usable_cpus=usable) == 0.0


def waited(n, *, stall, main, ok=True):
    return TrialResult(config=LoaderConfig(n, 2 if n else None), status="ok" if ok else "failed",
                       samples_per_s=593.0 if ok else None, stall_fraction=stall, main_cpu_util=main)


@pytest.mark.parametrize("trial_, bound, why", [
    (waited(1, stall=0.97, main=0.15), True, "5.9 MB batches waiting 21 ms on storage: the one worker is the limit"),
    (waited(16, stall=0.9, main=0.95), False, "the main process busy receiving: the hand-over is the limit"),
    (waited(4, stall=0.2, main=0.1), False, "the loop hardly waited: the step is the limit"),
    (waited(1, stall=0.97, main=None), False, "the main process's CPU not measured: not known"),
    (waited(0, stall=0.97, main=0.1), False, "no workers"),
    (waited(1, stall=0.97, main=0.1, ok=False), False, "failed"),
    (waited(1, stall=0.5, main=0.49), True, "at the edges"),
])
def test_a_pool_is_worker_bound_when_the_loop_waited_and_the_main_process_was_free(trial_, bound, why):
    assert capacity.worker_bound(trial_) is bound, why
