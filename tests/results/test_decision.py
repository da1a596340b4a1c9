"""The records of a loader tuned online (autoloader.results.decision): an epoch's trace closes each candidate's span
relative to the epoch's start."""
from __future__ import annotations

import dataclasses
import time

import pytest

from autoloader.config import LoaderConfig
from autoloader.results import Decision, EpochTrace


def test_a_span_is_measured_from_the_epochs_start_and_returns_now():
    config = LoaderConfig(2, 2, False, False)
    trace = EpochTrace(epoch=3, start=time.perf_counter() - 10.0)
    began = trace.start + 4.0
    now = trace.span(began, config, 123.0)
    (start, end, label, rate), = trace.spans
    assert start == 4.0 and 10.0 <= end == now - trace.start and label == config.label() and rate == 123.0
    assert trace.span(now, config, None) >= now and trace.spans[1][0] == end and trace.spans[1][3] is None


def test_a_decision_is_frozen_and_counts_nothing_by_default():
    decision = Decision(1, LoaderConfig(0, None, False, False), None, None, "no tuning for this dataset yet")
    assert (decision.candidates, decision.search_s, decision.switch_s) == (0, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.epoch = 2  # type: ignore[misc]
