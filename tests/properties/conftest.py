"""Hypothesis profiles for the contract properties: 8 deterministic examples per property in the default run
(``default``), ``AUTOLOADER_PROPERTIES=large`` for CI's slow step (300 random examples per property; a failure prints
the seed and the ``@reproduce_failure`` blob to rerun it)."""
import os

from hypothesis import HealthCheck, Phase, Verbosity, settings

_COMMON = dict(deadline=None, print_blob=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("default", max_examples=int(os.environ.get("AUTOLOADER_PROPERTY_EXAMPLES", "8")),
                          derandomize=True, **_COMMON)
settings.register_profile("large", max_examples=int(os.environ.get("AUTOLOADER_PROPERTY_EXAMPLES", "300")),
                          derandomize=False, verbosity=Verbosity.normal, **_COMMON)
settings.register_profile("first-failure", max_examples=int(os.environ.get("AUTOLOADER_PROPERTY_EXAMPLES", "300")),
                          derandomize=False, phases=[Phase.explicit, Phase.reuse, Phase.generate], report_multiple_bugs=False,
                          **_COMMON)
settings.load_profile(os.environ.get("AUTOLOADER_PROPERTIES", "default"))
