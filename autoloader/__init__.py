"""autoloader: a PyTorch DataLoader tuned for this machine and dataset, by measuring it in your training loop or by
short trials against your training step.

    loader = make_loader(train_set, batch_size=64, shuffle=True)   # and any DataLoader argument
    for images, labels in loader:    # on the GPU already; the first epoch tunes the loader as it trains
        ...
    print(loader.tuning)             # what was chosen, why, and what each candidate measured

The reference is each definition's docstring (``help(autoloader.make_loader)``, or ``python -m pydoc autoloader``):

- ``make_loader``: the tuned loader (every argument, how it tunes, what it raises); the main entry.
- ``tune``: the same search by trials, returning a ``TuneResult`` without building a loader or caching it.
- ``PrefetchLoader``: what ``make_loader`` returns, or a wrapper of your own DataLoader: batches copied to the GPU
  on a side stream, ``tuning``, ``decisions``, ``stats``, ``state_dict()``/``load_state_dict()``.
- ``ThreadedDataset``, ``with_threads``, ``unwrap``: a batch's samples fetched by threads inside each process.
- ``LoaderConfig``, ``TuneResult``, ``TrialResult``, ``EpochStats``: the records (what each field means).
- ``probe_machine``, ``MachineProfile``: what autoloader knows about this machine.
- ``AutoloaderWarning``, ``TuningError``: the warning category, and autoloader's own failure.
- ``autoloader.distributed.node_decisions``: every node's decision under torchrun.
- ``autoloader.cli.plot.plot_online_epoch``: the picture of an epoch that tuned online (needs matplotlib).
- The ``autotune`` command: ``autotune --help`` and ``autotune COMMAND --help`` (``autotune doctor --help``: the
  errors DataLoader users meet, and their fixes).

That list is the public API. Every other module and name is internal (the map below says what each does): it may
change in any release. Importing autoloader probes no hardware and touches no CUDA; that happens when you call
``make_loader``, ``tune`` or ``probe_machine``. It needs torch >= 2.6 (``MIN_TORCH``) and Linux (Windows is refused
at import; macOS is untested). Logs go to ``logging.getLogger("autoloader")``.

The package, one job per module, in dependency order: a module imports only modules listed below it (a package whose
modules share one line counts as one entry), so data flows one way, up this list; ``make_loader`` imports nothing
from ``cli/``. No import cycle; every import, a lazy one too, goes to its own layer or a lower one (``LAYERS`` in
``tests/test_imports.py``: the facts; the records; the ranks; the loader; the workers' supervision and the argument
checks; the request; measuring; searching; the cache; tuning, the Ray engine and the reports; ``make_loader``; the
command); no function over 60 lines or 8 parameters (``tests/test_imports.py``; ``tests/test_readme.py`` checks this
map against the files and the imports). How each hard part works is a NOTE block beside its code (the README lists
them).

    autoloader/
      __init__.py        the public API: make_loader, tune, probe_machine, PrefetchLoader, ThreadedDataset, the records
      ray/               engine="ray" (imports Ray only when used): make.py (make_loader's Ray path, the engine's
                         reference), session.py (the Ray this process uses or started), cluster.py (the cluster's
                         shape, the cache of decisions), plan.py (the pool's decisions), trials.py (the trials),
                         records.py (RayConfig, RayTuning), source.py (RaySource), order.py (an epoch's order in
                         runs), pipeline.py (one run through Ray Data), work.py (what the tasks run), transport.py
                         (a block of batches, worker to driver), failures.py (what a failed run was), waits.py (each
                         wait on Ray and its limit)
      cli/               the autotune command: main (arguments; the entry point), commands, _spec, demo, plot, doctor
                         (doctor_gpu: its GPU checks; findings: what a check returns), _holders
      factory.py         make_loader in four steps: look up the cache, tune (trials or online), store, build
      report.py          the machine profile and the cache listing as text
      tuning/            the two tuning modes
        trials.py        tune() / tune_with(request): the search driven by trials before training
        online.py        OnlineLoader: a Source whose epochs tune themselves, wrapped by PrefetchLoader
        online_search.py OnlineSearch: the search behind it, one candidate at a time, its decision, the re-tune rule
        scheduler.py     EpochScheduler: one online epoch as a state machine (measuring, tail, serving; one table)
        stand_in.py      what such a source answers as the DataLoader it stands for (len, attributes, worker_init_fn)
        handover.py      the hidden switch: the next candidate starts while the measured one serves its tail
        phases.py        the scheduler's phases and the one table of their moves (NOTE [ Online epoch scheduler ])
        plan.py          what the scheduler asks of the search behind it (Plan), which OnlineSearch answers
      cache/             the per-dataset, per-machine store: store.py, entry.py (one file read back and checked),
                         fingerprint.py (keys), slot.py (one request's entry)
      search/            deciding what to try and what to keep
        retune.py        when an online loader searches again after an epoch, and which way (down only, or either)
        online_plan.py   the online search's order: probe, prior, jumps, choice (search.py's parts after it)
        search.py        the model-guided search as a generator: yields candidates, takes measurements, returns a result
        verdict.py       the result it returns: what limits the choice, the disk's ceiling, persistent workers, why
        bounds.py        the one worker cap: max_workers, else the CPUs and `ulimit -n`; never past the shards
        switching.py     whether an online switch repays itself before the epoch ends; how long a window may last
        policy.py        the process decisions as pure functions: worker counts to try, the trial to choose
        online_policy.py the online search's decisions: where an epoch starts (the prior), where the search jumps
        capacity.py      what both policies read of a candidate's capacity: the tolerance, the headroom, the workers
                         that fill the CPUs (fill_count), saturated CPUs
        thread_search.py its (processes, threads) part
        threads_policy.py the thread decisions
        thread_bounds.py how far they go: threads per process (the batch), processes, the process-only reference
        native_search.py its native-threads part: the choice measured without its limit, then with it beside it
        native_policy.py the native thread pools' limit: each worker's share, and whether to keep it (keep_limit)
        settings.py      what a search knows before measuring (Settings) and what it measured since (Findings)
        candidates.py    what a search asks to have measured (Candidate) and gets back; budget rules; the fallback
        memory.py        the memory budget (decided once), what a configuration takes of it (footprint), how much
                         workers grow (the copy-on-read forecast), and the checks before a pool starts and at its
                         first batch
      _shards.py         how many shards an IterableDataset reads
      measure/           measuring one candidate
        trial.py         a trial: Run over an endless sampler, driven through the prefetcher into the step
        run.py           Run: a configuration's batches observed (trial, online candidate, served epoch): window, pacing
        window.py        the timed window (and the burst rule, defined once) -> TrialResult
        tally.py         Tally: an epoch served by the decision, its rate and stall without a mark per batch
        window_rule.py   when an online candidate's window opens (drained) and closes (confident, or at its bound)
        marks.py         what a window records: a mark per batch, the counters at its edges
        sample_clock.py  the first samples of an online epoch timed as they load (the prior may start inside batch 0)
        cpuclock.py      the CPU time and the run-queue wait (waiting for a CPU, not for data) a measured batch reads
        cow.py           which pages a forked worker still shares, twice: what it copied (copy-on-read) and where
        failures.py      which exceptions are the candidate's fault, which the user's (classify)
        advice.py        dataset mistakes a trial reveals (unsharded IterableDataset, copy-on-read)
      request.py         make_loader's arguments checked once, and the DataLoader arguments of each configuration
      _validate.py       argument checks that name the fix
      consumer.py        the step trials are timed against; CUDA pacing and calibration
      supervise/         the worker processes a run starts: started, guarded, stopped and reaped whatever happens
        serving.py       Serving: one DataLoader iterator started, read, stopped and reaped whatever happens
        signals.py       SignalGuard: the hard limit, Ctrl-C and a worker's death raised only at a safe line, never lost
        deaths.py        outside a guard, a worker's death torch reports in a lock's window raised at the next safe line
        redelivery.py    which of nested guards delivers (the last entered); a kept exception raised again, or taken
                         back
        unsafe.py        where raising is unsafe: a lock's window, where Python drops exceptions, cleanups, handlers
        procs.py         finding, sampling, stopping and reaping worker processes
        torch_watch.py   torch's SIGCHLD handler (private torch functions): installed first, a retired iterator
                         unwatched
      loader/            what runs during training
        prefetch.py      PrefetchLoader: batches on the device, epoch by epoch, stall statistics, state_dict()
                         (wraps a Source)
        stream_copy.py   a batch on its way to the device: copied on the side stream, transformed, handed to the step
        mirror.py        DataLoaderMirror: what frameworks read of a DataLoader (samplers, settings), set_epoch
        epoch_iter.py    EpochIter, one epoch as the loop iterates it: a batch that raises does not end it
        lost_worker.py   a connection a killed worker broke, raised as torch's report of its death (once)
        lazy.py          LazySource: make_loader's Source, built at the first iter() (nothing read before)
        source.py        Source, what a PrefetchLoader wraps: PlainSource (a DataLoader), IterableSource, as_source
        build.py         the one constructor of a DataLoader, and the rest of a user's epoch rebuilt from its settings
        device.py        the device, resolved once, and its one side stream
        transform.py     dtype and normalize on the device
        batch.py         walking nested batches
        threads.py       ThreadedDataset: a batch's samples fetched by a thread pool inside each process
        thread_pool.py   DaemonPool: that pool, made in the process that uses it, never joined at exit
        native.py        NativeLimit: the worker_init_fn limiting each worker's native thread pools before the user's,
                         and the parent's held at that limit while workers fork (limited_at_fork)
        resume/          exact state_dict()/load_state_dict(): what a checkpoint holds and how an epoch resumes
          checkpoint.py  the prefetcher's checkpoint bookkeeping: what each epoch keeps, how the first after a load
                         starts
          redraw.py      the rest of an interrupted epoch: its order redrawn (twice), the yielded batches skipped
                         by index
          state.py       what state_dict() holds (LoaderState: position, RNG states, digest), its checks, each rank's
                         part
          rng.py         the RNG states that decide a loader's epochs: taken, put back, written as JSON-safe text
        epochs.py        epochs as the prefetcher counts them: EpochStats, set_epoch, one base seed per epoch
        slices.py        one epoch's batch order served by a sequence of DataLoaders, exactly as one
                         (BatchSlice: the batches one of them serves; those it did not deliver given back)
      distributed.py     torch.distributed: Group (this rank, its node's group and budgets), one decision per node
      nodes.py           which ranks share a node: the launcher's node or the host, the layout, the node's group
      sharding.py        the facts every rank must share, and ShardingSampler (refuses to be sharded again)
      results/           the records, exported by the package: TrialResult, TuneResult (holds a LoaderConfig), Decision
        tune_result.py   TuneResult: the choice, why, every candidate; its text (print(result))
        tune_words.py    a tuning's facts in words from their values: the bottleneck, the disk's ceiling, the native
                         limit
        trial_result.py  TrialResult: one candidate's measurements, or why it did not run; its row in a tuning's table
        decision.py      Decision and EpochTrace: what a loader tuned online decided, and an epoch that searched
      config.py          the knob table (KNOBS: default, worker-only, tuned, recorded) and the LoaderConfig it makes
      coordination.py    the ranks of a node agree at fixed sync points (Coordinator); every exchange names its point
      _text.py           text helpers every report shares: MiB, rates, times, aligned columns
      probe/             facts about the machine: machine.py (the profile), saved.py (kept beside the cache), _fields
                         (its JSON read back), _cgroup, _disk, _gpu, _process, _pools
      errors.py          AutoloaderWarning, TuningError, TrialTimeout; warn_user; the DataLoader warning it silences
      _fs.py             the cache directory and atomic writes
"""
import logging
import re
import sys
from typing import Optional

import torch

MIN_TORCH = (2, 6)
"""The oldest torch autoloader runs on: every DataLoader it builds passes ``in_order`` (added in torch 2.6)."""


def _torch_too_old(version: str) -> Optional[str]:
    """Why ``version`` (a ``torch.__version__``) is too old for autoloader; None when it is recent enough, or when
    it does not read as MAJOR.MINOR (a build whose version cannot be read is not refused on a guess)."""
    found = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if found is None or (int(found.group(1)), int(found.group(2))) >= MIN_TORCH:
        return None
    need = ".".join(map(str, MIN_TORCH))
    return (f"autoloader needs torch >= {need} (its DataLoaders pass in_order, added in torch {need}), but this Python "
            f"imports torch {version} from {getattr(torch, '__file__', None)}: upgrade it first, e.g. pip install "
            f"'torch>={need}' (on a CPU-only machine, from PyTorch's CPU index: README, Install)")


if _torch_too_old(torch.__version__):
    raise ImportError(_torch_too_old(torch.__version__))
if sys.platform == "win32":
    raise ImportError("autoloader runs on Linux (macOS untested): it guards its workers with POSIX signals (SIGALRM, "
                      "SIGCHLD) and reads their resources with the resource module, which Windows lacks; use it under "
                      "WSL2, or torch.utils.data.DataLoader directly")

from .config import LoaderConfig  # noqa: E402 - after the torch version check
from .errors import AutoloaderWarning, TuningError  # noqa: E402
from .factory import make_loader  # noqa: E402
from .loader.epochs import EpochStats  # noqa: E402
from .loader.prefetch import PrefetchLoader  # noqa: E402
from .loader.threads import ThreadedDataset, unwrap, with_threads  # noqa: E402
from .probe import MachineProfile, probe_machine  # noqa: E402
from .results import TrialResult, TuneResult  # noqa: E402
from .tuning.trials import tune  # noqa: E402

__all__ = [
    "AutoloaderWarning",
    "EpochStats",
    "LoaderConfig",
    "MachineProfile",
    "PrefetchLoader",
    "ThreadedDataset",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "make_loader",
    "probe_machine",
    "tune",
    "unwrap",
    "with_threads",
]
__version__ = "0.3.0"

logging.getLogger("autoloader").addHandler(logging.NullHandler())
