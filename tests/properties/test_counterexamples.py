"""Every counterexample hypothesis found while the contract properties were written, as an explicit test. Each was a
configuration where the property's first statement of the README's contract was wrong: the README and
``contracts.agree`` now say what holds there, and these keep it so; or where the library was (the docstring names
the fix)."""
from __future__ import annotations

from unittest import mock

import pytest

import autoloader.loader.prefetch as _prefetch

from contracts import Data, Mode
from helpers import wait_no_children
from test_errors_contract import check_errors
from test_resume_contract import check_resume
from test_tuning_contract import check_tuned

pytestmark = pytest.mark.filterwarnings("ignore::autoloader.AutoloaderWarning", "ignore::UserWarning")

PLAIN = Mode("plain", 0)


def test_a_stream_saved_after_its_short_last_batch_resumes_where_its_own_state_says():
    """torch's fetcher asked the stream past its end for the short last batch, so the dataset reset its position: the
    resumed pass starts the stream over (README: its own state says whether that pass is empty or starts over)."""
    data = Data(n=21, batch_size=6, drop_last=False, sampler="sequential", rng="generator", augment=True, stream=True,
                seed=194)
    check_resume(data, PLAIN, PLAIN, epoch=1, k=4, how="torch", chain="chained", j=3)
    check_resume(data, PLAIN, PLAIN, epoch=1, k=4, how="json", chain="once")


def test_a_stream_saved_again_after_its_last_batch_may_start_over_with_a_base_seed_the_resumer_cannot_know():
    """Found at 300 examples (seed 95653): saved before the first batch, resumed for the pass's one batch and saved
    again there. The pass after that second save is the stream's own to start over, as after a first save there (above);
    the property relaxed the draws only for a first save at the pass's end."""
    data = Data(n=1, batch_size=2, drop_last=False, sampler="sequential", rng="sampler-generator", augment=True,
                stream=True, seed=0)
    check_resume(data, PLAIN, PLAIN, epoch=0, k=0, how="torch", chain="chained", j=1)
    assert wait_no_children() == []


@pytest.mark.parametrize("data, resumer, epoch, k", [
    (Data(n=5, batch_size=7, drop_last=False, sampler="sequential", rng="global", augment=False, stream=True,
          seed=1028), PLAIN, 1, 1),
    (Data(n=45, batch_size=7, drop_last=False, sampler="sequential", rng="global", augment=True, stream=True,
          seed=150), Mode("trials", 0), 0, 7)])
def test_a_stream_that_started_over_draws_no_new_base_seed(data, resumer, epoch, k):
    """The pass that starts the stream over is a new epoch in the uninterrupted run, which drew a base seed there; the
    resumer cannot tell, so the loop's draws and the stream's augmentation are one draw apart (README)."""
    check_resume(data, PLAIN, resumer, epoch=epoch, k=k, how="json", chain="after-load")
    assert wait_no_children() == []


def test_augmentation_moving_the_global_rng_differently_changes_a_global_order_later():
    """A sampler drawing its order from the global RNG, a dataset augmenting from it in the main process before the
    save and in a worker after: the rest of the epoch is exact, the next epoch's order may differ (README)."""
    data = Data(n=36, batch_size=6, drop_last=False, sampler="global-rng", rng="sampler-generator", augment=True,
                seed=294)
    check_resume(data, PLAIN, Mode("plain", 1, prefetch=1), epoch=0, k=0, how="json", chain="once")
    assert wait_no_children() == []


def test_an_online_epoch_over_a_distributed_sampler_is_the_plain_loaders_with_set_epoch():
    """A PrefetchLoader advances a sampler's epoch when nobody did; the plain DataLoader it equals is the one whose
    loop calls set_epoch (README, Integrations, "torchrun")."""
    data = Data(n=9, batch_size=4, drop_last=False, sampler="distributed", rng="generator", augment=True, replicas=3,
                rank=0, seed=9756)
    check_tuned(data, Mode("online", None), 3)
    assert wait_no_children() == []


@pytest.mark.parametrize("mode", [Mode("online", None), Mode("trials", None)])
def test_an_epoch_without_a_batch_draws_what_the_plain_loaders_draws(mode):
    """Two samples in batches of three with drop_last: no batch, but the plain DataLoader's sampler still drew its
    permutation and was asked past its end; the online epoch drew nothing (found by the large profile)."""
    data = Data(n=2, batch_size=3, drop_last=True, sampler="shuffle", rng="generator", augment=False, seed=0)
    check_tuned(data, mode, 2)
    assert wait_no_children() == []


def test_a_distributed_sampler_with_a_bad_sample_reshuffles_every_epoch_as_set_epoch_would():
    """The plain DataLoader's loop must call ``set_epoch`` as the PrefetchLoader's advances the sampler's epoch itself
    when nobody did (README, Integrations, "torchrun"): without it the reference repeated epoch 0's order."""
    data = Data(n=2, batch_size=1, drop_last=False, sampler="distributed", rng="generator", augment=True, bad=(0,))
    check_errors(data, Mode("lazy", None))
    assert wait_no_children() == []


def test_threads_in_the_main_process_finish_a_failed_batchs_other_samples():
    """Sample 0 raised while sample 1 ran in another thread and drew from the global RNGs to augment: the loop's draws
    after the error differ from a plain DataLoader's, which stopped at sample 0 (``errors_agree``)."""
    data = Data(n=2, batch_size=2, drop_last=False, sampler="sequential", rng="generator", augment=True, bad=(0,))
    check_errors(data, Mode("plain", 0, threads=2))
    assert wait_no_children() == []


def test_reading_ahead_loads_the_next_batch_before_the_loops_draws():
    """With a side stream (forced here on the CPU) batch i + 1 is loaded, and augmented from the global RNGs in the
    main process, before the loop's draws after batch i: those draws and values are not a plain DataLoader's (NOTE
    [ Stream synchronisation ]); the batches and errors are."""
    data = Data(n=3, batch_size=1, drop_last=False, sampler="sequential", rng="generator", augment=True, bad=(0,))
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: True):
        check_errors(data, PLAIN, ahead=True)
    assert wait_no_children() == []


def test_threads_that_augment_from_the_global_rng_move_a_global_order_later():
    """The same samples finishing in threads after a failed one (above) drew from torch's global RNG, which the
    sampler draws the next epoch's order from: that order is not the plain DataLoader's (``errors_agree``)."""
    data = Data(n=43, batch_size=2, drop_last=False, sampler="global-rng", rng="generator", augment=True, bad=(0,))
    check_errors(data, Mode("plain", 0, threads=2))
    assert wait_no_children() == []


def test_reading_ahead_saved_after_the_last_item_resumes_at_the_next_epochs_order():
    """CI seed 49280: reading ahead, the saver had fetched its epoch's end (the RandomSampler's generator drew once
    more there) before the state was saved after the last item, an error; the resumer drew that pull again and served
    the next epoch in another order. The library's fix: ``Checkpoints.state`` counts an end fetched ahead as a pull
    (``Ahead``)."""
    data = Data(n=4, batch_size=1, drop_last=False, sampler="shuffle", rng="generator", augment=True, bad=(0,))
    with mock.patch.object(_prefetch, "reads_ahead", lambda stream: True):
        check_errors(data, PLAIN, resumer=Mode("lazy", None), epoch=0, k=4, how="json", ahead=True)
    assert wait_no_children() == []
