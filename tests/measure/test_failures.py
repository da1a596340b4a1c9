"""Faults and bad input: every failure gives a clear message, leaves no process behind, loses nothing.

Modelled on PyTorch's own DataLoader tests (test/test_dataloader.py): a worker killed by a signal, a dataset that
raises or hangs, the open-files limit and a tiny /dev/shm run for real, the ones that change process-wide state in a
subprocess. The autouse fixture in conftest.py asserts that no child process outlives a test; ``_cache_stays_valid``
below asserts that the cache holds only valid entries (and no stray temporary files) after every test here.
"""
from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch

import fault_data as fd
from autoloader import AutoloaderWarning, LoaderConfig, TrialResult, make_loader
from autoloader.search.memory import copied_per_sample
from autoloader.measure.advice import COPY_ON_READ_MIN_BYTES, warn_once
from autoloader.cache import TuneCache
from autoloader.consumer import Consumer
from autoloader.measure.failures import failure_reason
from autoloader.measure.trial import run_trial
from autoloader.request import Request

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _cache_stays_valid(cache_dir):
    yield
    if cache_dir.exists():
        assert not [p.name for p in cache_dir.iterdir() if p.name.endswith(".tmp")], "stray temporary cache files"
    assert all(entry.error is None for entry in TuneCache(cache_dir).entries())


def _entries(cache_dir: Path) -> list:
    return TuneCache(cache_dir).entries()


def _autoloader_warnings(record) -> list:
    return [str(w.message) for w in record if issubclass(w.category, AutoloaderWarning)]


def _trial(dataset, config: LoaderConfig, *, batch_size: int = 4, consumer=None, limit_s: float = 3.0,
           shuffle: bool = False, **dataloader_kwargs) -> TrialResult:
    """One trial of ``config``; ``dataloader_kwargs`` are the user's DataLoader arguments."""
    request = Request.checked(dataset, batch_size, shuffle=shuffle, dataloader_kwargs=dataloader_kwargs)
    return run_trial(request, config, consumer=consumer or Consumer(None, CPU), limit_s=limit_s)


def _python(script: str, tmp_path: Path, *, timeout: float = 120, wrap: str = "{cmd}") -> dict:
    """Run ``script`` in a fresh interpreter, under ``wrap`` (a shell command line around ``{cmd}``); its last stdout
    line is JSON."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    cmd = wrap.format(cmd=f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}")
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- a worker killed (the OOM killer) ---------------------------------------------------------------------------------

def test_killed_worker_fails_its_trial_with_the_reason():
    result = _trial(fd.KillWorkers(), LoaderConfig(2, 2))
    assert result.status == "failed"
    assert "worker" in result.reason and ("died" in result.reason or "killed" in result.reason)


def test_every_worker_count_killed_falls_back_to_no_workers_with_a_warning(cache_dir):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loader = make_loader(fd.KillWorkers(), batch_size=4, step=0.001, budget=4, max_workers=4, tuning="trials")
    tuning = loader.tuning
    assert tuning.num_workers == 0
    worker_trials = [t for t in tuning.trials if t.config.num_workers > 0]
    assert worker_trials and all(t.status == "failed" and "worker" in t.reason for t in worker_trials)
    messages = _autoloader_warnings(record)
    named = {t.reason.split(":")[0] for t in worker_trials}  # e.g. "worker killed (SIGKILL, ...)"
    assert any("num_workers=0" in m and any(n in m for n in named) for m in messages), (messages, named)
    assert sum(1 for _ in loader) == 16


def test_a_worker_killed_after_it_sent_batches_fails_its_trial_and_never_raises():
    for _ in range(2):
        result = _trial(fd.KillWorkersLater(at=40, sample_bytes=4096), LoaderConfig(2, 2), limit_s=5.0,
                        consumer=Consumer(0.02, CPU))
        assert result.status == "failed" and "worker" in result.reason, result


@pytest.mark.parametrize("exc, workers, stream, expected", [
    (ConnectionResetError(104, "Connection reset by peer"), 2, False, "worker died: its connection broke"),
    (ConnectionRefusedError(111, "Connection refused"), 1, False, "worker died"),
    (ConnectionResetError(104, "Connection reset by peer"), 0, False, None),
    (ConnectionResetError("Caught ConnectionResetError in DataLoader worker process 0.\nOriginal Traceback"), 2,
     False, None),
    (ValueError("Caught ValueError in DataLoader worker process 3.\nOriginal Traceback...\nValueError: No samples "
                "found in dataset; perhaps you have fewer shards than workers"), 4, True, "fewer shards than workers"),
    (ValueError("Caught ValueError in DataLoader worker process 3.\nOriginal Traceback...\nValueError: bad"), 4,
     False, None),
])
def test_failure_reason_with_workers(exc, workers, stream, expected):
    """A worker killed while the main process still receives a batch's shared-memory descriptors leaves a broken
    connection (ConnectionResetError, ConnectionRefusedError) instead of torch's "exited unexpectedly": the
    candidate's fault (found by scripts/gpu_check.py); the user's own connection errors come wrapped ("Caught ...").
    An IterableDataset's error from a worker is the candidate's (too many workers for its shards)."""
    reason = failure_reason(exc, workers=workers, stream=stream)
    assert reason is None if expected is None else expected in reason, reason


def test_worker_only_arguments_with_a_serial_candidate(cache_dir):
    """multiprocessing_context and timeout mean nothing without workers, and DataLoader rejects them there: the serial
    trial (and a num_workers=0 choice) drop them, the worker trials keep them."""
    loader = make_loader(fd.Tensors(n=256, sleep_s=0.001), batch_size=8, step=0.001, budget=3, max_workers=2,
                         multiprocessing_context="fork", timeout=30, tuning="trials")
    assert any(t.config.num_workers == 0 and t.ok for t in loader.tuning.trials)
    assert sum(1 for _ in loader) == 32
    serial = make_loader(fd.Tensors(n=64), batch_size=8, max_workers=0, tuning="trials", budget=2,
                         multiprocessing_context="fork", timeout=30, persistent_workers=False)
    assert serial.loader.num_workers == 0 and sum(1 for _ in serial) == 8
    del loader, serial


def test_tuning_goes_on_with_fewer_workers_after_a_killed_candidate(cache_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoloaderWarning)
        loader = make_loader(fd.KillWorkers(from_workers=4), batch_size=4, step=0.001, budget=6, max_workers=8,
                             tuning="trials")
    trials = loader.tuning.trials
    assert any(t.status == "failed" and t.config.num_workers >= 4 for t in trials)
    assert any(t.ok and 1 <= t.config.num_workers < 4 for t in trials), [(t.config, t.status) for t in trials]


# -- the dataset raises: the user's error, unchanged ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["always", "workers"])
def test_dataset_error_surfaces_with_its_type_and_message_and_nothing_is_cached(cache_dir, where):
    """Trials made in make_loader (tuning="trials") raise it there; made at the first iter() they fall back, and the
    epoch raises it where it reaches the sample, as a DataLoader (tests/loader/test_epoch_iter.py)."""
    with pytest.raises(fd.CorruptSample, match=r"sample \d+ is corrupt"):
        make_loader(fd.Raising(where), batch_size=4, step=0.001, budget=4, max_workers=2, tuning="trials")
    assert _entries(cache_dir) == []


def test_step_error_surfaces_unchanged(cache_dir):
    def step(batch):
        raise fd.CorruptSample("the step failed")

    with pytest.raises(fd.CorruptSample, match="the step failed"):
        make_loader(fd.Tensors(), batch_size=4, step=step, budget=3, tuning="trials")
    assert _entries(cache_dir) == []
    with pytest.warns(AutoloaderWarning, match="CorruptSample: the step failed"):  # at the first iter(): a fallback
        loader = make_loader(fd.Tensors(), batch_size=4, step=step, budget=3)
        assert sum(1 for _ in loader) == 16 and loader.tuning.source == "fallback"
    assert _entries(cache_dir) == []


# -- a trial that would hang ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [LoaderConfig(0), LoaderConfig(2, 2)], ids=["no-workers", "workers"])
def test_hanging_trial_is_cut_at_its_limit(config):
    started = time.monotonic()
    result = _trial(fd.Hang("always"), config, limit_s=1.0)
    took = time.monotonic() - started
    assert result.status == "failed" and result.reason.startswith("timed out"), result.reason
    assert took < 15, f"a trial limited to 1 s (+2 s grace) took {took:.1f} s"


def test_make_loader_survives_a_dataset_that_hangs_everywhere(cache_dir):
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loader = make_loader(fd.Hang("always"), batch_size=4, budget=2, max_workers=2, cache=False, tuning="trials")
    assert time.monotonic() - started < 25
    assert loader.tuning.source == "fallback" and loader.tuning.num_workers == 0
    assert any("timed out" in m for m in _autoloader_warnings(record))


def test_make_loader_with_the_cache_reads_nothing_of_a_dataset_that_hangs(cache_dir):
    """The cache key reads no sample (NOTE [ Nothing before iter() ]): make_loader returns at once."""
    started = time.monotonic()
    loader = make_loader(fd.Hang("always", hang_s=60.0), batch_size=4, budget=2, max_workers=2)
    assert time.monotonic() - started < 5 and loader.tuning.source == "pending" and len(loader) == 16
    assert _entries(cache_dir) == []


def test_make_loader_survives_a_dataset_that_hangs_in_workers(cache_dir):
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loader = make_loader(fd.Hang("workers"), batch_size=4, step=0.001, budget=3, max_workers=4, tuning="trials")
    assert time.monotonic() - started < 25
    assert loader.tuning.num_workers == 0
    workers = [t for t in loader.tuning.trials if t.config.num_workers > 0]
    timed_out = [t for t in workers if t.status == "failed" and "timed out" in t.reason]
    # the candidates after a timed-out one may find the budget spent (how many depends on the machine's pace)
    over_budget = [t for t in workers if t.status == "skipped" and t.reason.startswith("budget:")]
    assert timed_out and len(timed_out) + len(over_budget) == len(workers), [(t.status, t.reason) for t in workers]
    assert any("num_workers=0" in m and "timed out" in m for m in _autoloader_warnings(record))


# -- /dev/shm too small -----------------------------------------------------------------------------------------------

def _private_tmpfs_works() -> bool:
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


_SHM_SCRIPT = """
import json, warnings, torch
import fault_data as fd
from autoloader import LoaderConfig, make_loader, probe_machine
from autoloader.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.request import Request

assert probe_machine(disk=False, gpus=False).shm.total_bytes <= 2**20
ds = fd.Tensors(n=64, sample_bytes=256 * 1024, sleep_s=0.002)   # batches of 512 KiB: 2 in flight fill 1 MiB
direct = run_trial(Request.checked(ds, 2), LoaderConfig(2, 2), consumer=Consumer(None, torch.device("cpu")),
                   limit_s=3.0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    loader = make_loader(ds, batch_size=2, step=0.001, budget=4, cache=False)
batches = sum(1 for _ in loader)
tuning = loader.tuning
del loader
print(json.dumps({"direct": [direct.status, direct.reason], "num_workers": tuning.num_workers, "batches": batches,
                  "trials": [[t.config.num_workers, t.status, t.reason] for t in tuning.trials]}))
"""


@pytest.mark.skipif(not _private_tmpfs_works(), reason="cannot mount a private tmpfs over /dev/shm here")
def test_tiny_dev_shm_skips_candidates_and_the_chosen_loader_works(tmp_path):
    out = _python(_SHM_SCRIPT, tmp_path,
                  wrap="unshare -rm sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {cmd}'")
    status, reason = out["direct"]
    assert status == "failed" and ("/dev/shm" in reason or "bus error" in reason), reason
    skipped = [t for t in out["trials"] if t[1] == "skipped"]
    assert skipped and all("/dev/shm" in t[2] for t in skipped), out["trials"]
    assert out["batches"] == 32


# -- spawn and something unpicklable ----------------------------------------------------------------------------------

@pytest.fixture
def no_spawned_process(monkeypatch):
    """Fails the test if a spawn-context process starts at all."""
    def refuse(self):
        raise AssertionError("a spawn worker was started before the pickling check")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)


@pytest.mark.parametrize("dataset, kwargs, culprit", [
    (fd.LambdaInside(), {}, "dataset.transform"),
    (fd.Tensors(), {"collate_fn": lambda batch: batch}, "collate_fn"),
    (fd.Tensors(), {"worker_init_fn": lambda worker_id: None}, "worker_init_fn"),
], ids=["dataset-attribute", "collate_fn", "worker_init_fn"])
def test_unpicklable_under_spawn_is_named_before_any_worker_starts(cache_dir, no_spawned_process, dataset, kwargs,
                                                                   culprit):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError) as err:
        make_loader(dataset, batch_size=2, multiprocessing_context="spawn", **kwargs)
    message = str(err.value)
    assert message.startswith(culprit + " cannot be pickled"), message
    assert "module level" in message and "multiprocessing_context='fork'" in message
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    assert _entries(cache_dir) == []


def test_reading_the_default_start_method_does_not_fix_it(tmp_path):
    out = _python(tmp_path=tmp_path, script="""
        import json, multiprocessing
        from autoloader.probe import start_method as worker_start_method
        method = worker_start_method(None)
        print(json.dumps([method, multiprocessing.get_start_method(allow_none=True)]))
    """)
    assert out == [multiprocessing.get_all_start_methods()[0], None]


_SPAWN_TRIAL_SCRIPT = """
import json, time, psutil, torch
import fault_data as fd
from autoloader import LoaderConfig
from autoloader.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.request import Request

if __name__ == "__main__":
    out = {}
    for method in ("spawn", "forkserver"):
        started = time.monotonic()
        request = Request.checked(fd.Tensors(n=256), 4, dataloader_kwargs={"multiprocessing_context": method})
        result = run_trial(request, LoaderConfig(2, 2), consumer=Consumer(None, torch.device("cpu")), limit_s=1.5)
        out[method] = [result.status, time.monotonic() - started - (result.startup_s or 0.0), result.reason]
    left = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
    out["helpers_alive"] = sum("resource_tracker" in c or "forkserver" in c for c in left)
    out["others_left"] = [c for c in left if "resource_tracker" not in c and "forkserver" not in c]
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_spawn_trials_leave_multiprocessing_helpers_alone_and_end_promptly(tmp_path):
    """The resource tracker and fork server that the first spawn/forkserver worker starts belong to the process, not
    to the trial: a trial that waited for them to exit, then killed them, took 5 s longer and broke multiprocessing's
    bookkeeping ("resource_tracker: process died unexpectedly")."""
    out = _python(_SPAWN_TRIAL_SCRIPT, tmp_path)
    for method in ("spawn", "forkserver"):
        # spawned workers import torch before their first batch, seconds on a busy machine: that start-up is allowed
        # on top of the 1.5 s limit and not counted here
        status, after_startup, reason = out[method]
        assert status == "ok" and after_startup < 4.5, (method, status, after_startup, reason)
    assert out["helpers_alive"] >= 1 and out["others_left"] == []


# -- bad arguments ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dataset, kwargs, error, argument", [
    (None, {"batch_size": 0}, ValueError, "batch_size"),
    (None, {"batch_size": -4}, ValueError, "batch_size"),
    (None, {"batch_size": 8.0}, ValueError, "batch_size"),   # DataLoader's types (tests/conformance/test_conformance_arguments.py)
    (None, {"batch_size": True}, ValueError, "batch_size"),
    (None, {"budget": 0}, ValueError, "budget"),
    (None, {"budget": -5}, ValueError, "budget"),
    (None, {"max_workers": -1}, ValueError, "max_workers"),
    (None, {"step": "fast"}, TypeError, "step"),
    (None, {"step": [0.1]}, TypeError, "step"),
    (None, {"step": -0.5}, ValueError, "step"),
    (None, {"shuffle": True, "sampler": torch.utils.data.SequentialSampler(range(64))}, ValueError, "sampler"),
    (None, {"num_worker": 2}, TypeError, "num_worker"),
], ids=["batch0", "batch-neg", "batch-float", "batch-bool", "budget0", "budget-neg", "max_workers-neg", "step-str",
        "step-list", "step-neg", "shuffle-sampler", "unknown-kw"])
def test_bad_argument_names_itself(cache_dir, dataset, kwargs, error, argument):
    dataset = fd.Tensors() if dataset is None else dataset
    kwargs.setdefault("batch_size", 4)
    with pytest.raises(error) as err:
        make_loader(dataset, **kwargs)
    assert argument in str(err.value)
    assert type(err.value) is error
    assert _entries(cache_dir) == []


# -- IterableDataset --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [None, 40], ids=["endless", "short"])
def test_iterable_dataset_without_len_is_tuned_by_time(cache_dir, n):
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoloaderWarning)
        loader = make_loader(fd.Stream(n), batch_size=4, step=0.001, budget=3, max_workers=2)
    assert time.monotonic() - started < 30
    batches = list(itertools.islice(iter(loader), 5))
    assert len(batches) == 5 and all(b.shape == (4, 8) for b in batches)
    del batches, loader


def test_unsharded_iterable_dataset_warns_once():
    stream = fd.Stream(400, sharded=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _trial(stream, LoaderConfig(2, 2))
        _trial(stream, LoaderConfig(3, 2))
    assert first.ok
    ours = [w for w in record if issubclass(w.category, AutoloaderWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "get_worker_info" in str(ours[0].message) and "each sample would be loaded 2 times" in str(ours[0].message)
    assert ours[0].filename == __file__, "the warning should point at the caller's line, not inside autoloader"


class _Unhashable(fd.Stream):
    __hash__ = None  # type: ignore[assignment]


def test_warn_once_is_per_dataset_object_even_when_it_cannot_be_weakly_keyed():
    plain, unhashable = fd.Stream(4), _Unhashable(4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for dataset in (plain, plain, unhashable, unhashable):
            warn_once(dataset, "test", "careful")
        warn_once(plain, "other", "careful again")
    assert _autoloader_warnings(record) == ["careful", "careful", "careful again"]


@pytest.mark.parametrize("stream", [fd.Stream(400, sharded=True), fd.Stream(400, sharded=False, constant=True)],
                         ids=["sharded", "constant-data"])
def test_sharded_or_undecidable_iterable_dataset_does_not_warn(stream):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _trial(stream, LoaderConfig(2, 2)).ok
    assert _autoloader_warnings(record) == []


# -- the open-files limit ---------------------------------------------------------------------------------------------

_NOFILE_SCRIPT = """
import json, logging, resource, warnings, torch
import fault_data as fd
from autoloader import LoaderConfig, make_loader
from autoloader.consumer import Consumer
from autoloader.measure.trial import run_trial
from autoloader.request import Request

class Keep(logging.Handler):
    messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

logging.getLogger("autoloader").addHandler(Keep())
logging.getLogger("autoloader").setLevel(logging.INFO)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ds = fd.Tensors(n=256, sleep_s=0.01)
direct = run_trial(Request.checked(ds, 2), LoaderConfig(16, 2), consumer=Consumer(None, torch.device("cpu")),
                   limit_s=3.0)
out = {"direct": [direct.status, direct.reason]}
for name, bound in (("bounded", 16), ("default", None)):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loader = make_loader(ds, batch_size=2, step=0.001, budget=4, cache=False, max_workers=bound)
    batches = sum(1 for _ in loader)
    for _ in range(6):  # tuned online (the default) under load, the search may outlive the first epoch
        if loader.tuning.source != "online" or loader.decisions:
            break
        sum(1 for _ in loader)
    text = [str(w.message) for w in record] + [t.reason or "" for t in loader.tuning.trials] + Keep.messages
    text.append(loader.tuning.reason or "")
    out[name] = {"batches": batches, "num_workers": loader.tuning.num_workers,
                 "names_ulimit": any("ulimit -n" in m for m in text),
                 "failed": [t.reason for t in loader.tuning.trials if t.status == "failed"]}
    del loader
    Keep.messages.clear()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def low_nofile_run(tmp_path_factory):
    return _python(_NOFILE_SCRIPT, tmp_path_factory.mktemp("nofile"))


@pytest.mark.slow
def test_too_few_file_descriptors_fail_the_candidate_naming_ulimit(low_nofile_run):
    status, reason = low_nofile_run["direct"]
    assert status == "failed" and "ulimit -n" in reason, reason
    bounded = low_nofile_run["bounded"]
    assert bounded["batches"] == 128
    assert all("ulimit -n" in reason for reason in bounded["failed"]), bounded


@pytest.mark.slow
def test_low_nofile_default_still_gives_a_working_loader(low_nofile_run):
    default = low_nofile_run["default"]
    assert default["batches"] == 128 and default["num_workers"] <= 64 // 32


@pytest.mark.slow
def test_low_nofile_default_says_ulimit_bounds_the_workers(low_nofile_run):
    assert low_nofile_run["default"]["names_ulimit"], low_nofile_run["default"]


# -- CUDA and forked workers ------------------------------------------------------------------------------------------

def test_trials_run_only_the_users_code_in_workers_and_batches_reach_the_device_from_the_main_process():
    """Workers run the user's dataset and collate_fn and nothing else (no pinning, no device move), so a parent with
    CUDA initialised never makes a forked worker touch CUDA. ``cpu_only_collate`` fails unless it runs in a worker
    and builds the batch on the CPU."""
    result = _trial(fd.Tensors(n=64), LoaderConfig(2, 2), collate_fn=fd.cpu_only_collate)
    assert result.ok, result.reason


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_initialised_before_tuning_does_not_break_forked_workers(cache_dir):
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    loader = make_loader(fd.Tensors(n=256, sleep_s=0.002), batch_size=8, device="cuda", step=0.001, budget=6,
                         multiprocessing_context="fork")
    assert all(batch.is_cuda for batch in loader)
    assert any(t.ok and t.config.num_workers > 0 for t in loader.tuning.trials)
    del loader


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_dataset_touching_cuda_in_a_forked_worker_gets_torchs_own_error(cache_dir):
    """What the README says about CUDA before fork: the parent may initialise CUDA; a forked worker may not use it.
    The user's dataset doing so surfaces torch's error unchanged, from the first worker trial."""
    torch.zeros(1, device="cuda")
    with pytest.raises(RuntimeError, match="Cannot re-initialize CUDA in forked subprocess"):
        make_loader(fd.CudaInWorker(), batch_size=4, step=0.001, budget=4, max_workers=2, tuning="trials",
                    multiprocessing_context="fork")


# -- copy-on-read memory growth ---------------------------------------------------------------------------------------

def test_copy_on_read_growth_is_measured_and_warned_about():
    dataset = fd.PythonInts()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = _trial(dataset, LoaderConfig(2, 2), batch_size=16, shuffle=True, limit_s=4.0,
                        multiprocessing_context="fork")
    assert result.ok
    assert result.worker_uss_growth_bytes >= COPY_ON_READ_MIN_BYTES, result.worker_uss_growth_bytes
    if result.worker_copied_bytes is not None:  # Linux pagemap: the copies themselves (NOTE [ Copy-on-read forecast ])
        assert result.worker_copied_bytes >= 0.5 * result.worker_uss_growth_bytes, result
        assert result.worker_copied_bytes <= result.worker_copy_span_bytes <= result.worker_shared_bytes, result
    messages = _autoloader_warnings(record)
    assert len(messages) == 1 and "numpy" in messages[0] and "13246" in messages[0], messages


def test_numpy_dataset_does_not_grow():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = _trial(fd.NumpyInts(), LoaderConfig(2, 2), batch_size=16, shuffle=True, limit_s=4.0,
                        multiprocessing_context="fork")
    assert result.ok and result.worker_uss_growth_bytes is not None
    assert result.worker_uss_growth_bytes < COPY_ON_READ_MIN_BYTES / 2
    assert copied_per_sample(result) in (None, 0.0), result
    assert _autoloader_warnings(record) == []


# -- failure classification -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exc, expected", [
    (RuntimeError("DataLoader worker (pid 123) is killed by signal: Bus error. It is possible that dataloader's "
                  "workers are out of shared memory."), "/dev/shm"),
    (RuntimeError("DataLoader worker (pid 123) is killed by signal: Killed."), "out-of-memory"),
    (RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly"), "worker died"),
    (RuntimeError("DataLoader timed out after 5 seconds"), "timed out"),
    (RuntimeError("Too many open files. Communication with the workers is no longer possible."), "ulimit -n"),
    (RuntimeError("received 0 items of ancdata"), "ulimit -n"),
    (OSError(24, "Too many open files"), "ulimit -n"),
    (OSError(12, "Cannot allocate memory"), "out of memory"),
    (RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback ...\nRuntimeError: "
                  "unable to allocate shared memory(shm) for file </torch_1_2_0>: No space left on device (28)"),
     "/dev/shm"),
    (MemoryError(), "out of memory"),
    (fd.CorruptSample("sample 3 is corrupt"), None),
    (ValueError("bad value"), None),
    (RuntimeError("Caught KeyError in DataLoader worker process 0."), None),
    (OSError(2, "No such file or directory"), None),
])
def test_failure_reason_tells_the_candidates_fault_from_the_users(exc, expected):
    reason = failure_reason(exc)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


# -- the cache under a race -------------------------------------------------------------------------------------------

_RACE_SCRIPT = """
import json, os, sys, time, warnings
import fault_data as fd
from autoloader import make_loader

here, other = sys.argv[1], sys.argv[2]
open(here, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(other) and time.monotonic() < deadline:
    time.sleep(0.005)
loader = make_loader(fd.Tensors(n=256, sleep_s=0.001), batch_size=8, key="race", budget=1.5, max_workers=0,
                     cache=os.environ["RACE_CACHE"], tuning="trials")
print(json.dumps({"source": loader.tuning.source}))
"""


def test_two_processes_racing_on_one_key_leave_one_valid_entry(tmp_path):
    cache = tmp_path / "race-cache"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), RACE_CACHE=str(cache))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    procs = [subprocess.Popen([sys.executable, "-c", _RACE_SCRIPT, me, other], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for me, other in ((a, b), (b, a))]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    assert [json.loads(out.strip().splitlines()[-1])["source"] for out, _ in outputs] == ["tuned", "tuned"]
    entries = TuneCache(cache).entries()
    assert len(entries) == 1 and entries[0].error is None and entries[0].result.source == "tuned"
    assert sorted(p.name for p in cache.iterdir()) == [entries[0].path.name]
