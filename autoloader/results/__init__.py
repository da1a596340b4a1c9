"""The records autoloader produces: one trial's measurements, a tuning result, an online decision and the trace of an
epoch that searched online.

They carry facts and decisions, never behaviour, and round-trip through plain JSON (``to_dict``/``from_dict``) so
the cache stores them without pickle.

One module per record: ``trial_result`` (``TrialResult``), ``tune_result`` (``TuneResult`` and its text, whose
words ``tune_words`` makes), ``decision`` (``Decision``, ``EpochTrace``); this package exports them, so ``from
autoloader.results import X`` is the one way to name them.
"""
from .decision import Decision, EpochTrace
from .trial_result import TRIAL_STATUSES, TrialResult, TrialStatus
from .tune_result import BOTTLENECKS, SOURCES, Bottleneck, Source, TuneResult

__all__ = ["BOTTLENECKS", "Bottleneck", "Decision", "EpochTrace", "SOURCES", "Source", "TRIAL_STATUSES",
           "TrialResult", "TrialStatus", "TuneResult"]
