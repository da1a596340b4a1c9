"""What the epoch scheduler asks of the search behind it (autoloader/tuning/plan.py): ``OnlineSearch`` answers every
member of ``Plan`` with the same signature, and so does the tests' scripted plan, so a change to the interface cannot
leave one of them behind."""
import inspect

import pytest

from autoloader.tuning.online_search import OnlineSearch
from autoloader.tuning.plan import Plan
from scheduler_fakes import ScriptedPlan

MEMBERS = sorted(name for name in vars(Plan) if not name.startswith("_"))


def _shape(member):
    if isinstance(member, property):
        return "property"
    signature = inspect.signature(member)
    return [(p.name, p.kind) for p in signature.parameters.values()]


def test_the_plan_names_what_the_scheduler_calls():
    assert MEMBERS == ["candidate", "early", "fits_beside", "fork_s", "keeps", "probes_samples", "record_cost",
                       "record_start", "retry_next_epoch", "settle", "switch_gain", "tell", "threads_tuned"]


@pytest.mark.parametrize("implementation", [OnlineSearch, ScriptedPlan])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_plan_answers_every_member_alike(implementation, name):
    wanted, found = vars(Plan)[name], inspect.getattr_static(implementation, name, None)
    if found is None and implementation is ScriptedPlan:  # an attribute the fake sets in __init__
        assert isinstance(wanted, property), f"ScriptedPlan lacks the method {name}"
        return
    assert found is not None, f"{implementation.__name__} lacks {name}"
    if isinstance(wanted, property):
        assert isinstance(found, property) or not callable(found), f"{implementation.__name__}.{name}: a property"
    else:
        assert _shape(found) == _shape(wanted), f"{implementation.__name__}.{name}"
