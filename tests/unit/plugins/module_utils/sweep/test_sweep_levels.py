"""The one check of concurrency levels (plugins/module_utils/sweep/settings.py check_levels),
as the sweep, the tuner, the API and the roles' asserts (the levels_problem filter) use it."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.filter.sweep import FilterModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import check_levels

levels_problem = FilterModule().filters()["levels_problem"]


@pytest.mark.parametrize("levels, kw, message", [
    ([], {}, "levels must list at least one concurrency, got []"),
    ("1,2", {}, "levels must list at least one concurrency, got '1,2'"),
    ([1, 0, -4], {}, "levels must be positive integers, got [0, -4] in [1, 0, -4]"),
    ([1, True], {}, "levels must be positive integers, got [True]"),
    ([2, 2.5], {}, "levels must be positive integers, got [2.5]"),
    (["4"], {}, "levels must be positive integers, got ['4']"),
    ([1, 2, 1], {}, "levels must not repeat a concurrency: [1, 2, 1]"),
    ([4, 2], {"ascending": True}, "levels must be ascending, got [4, 2]"),
    (["x", 2], {"coerce": True}, "levels must be positive integers, got ['x']"),
])
def test_bad_levels_are_named(levels, kw, message):
    with pytest.raises(ValueError) as e:
        check_levels(levels, **kw)
    assert message in str(e.value)


def test_good_levels():
    assert check_levels([4, 1, 8]) == [4, 1, 8]
    assert check_levels(("1", 2, " 16"), coerce=True, ascending=True) == [1, 2, 16]


def test_the_filter_names_the_variable_or_says_nothing():
    assert levels_problem([1, 2, 4], "vllm_benchmark_levels") == ""
    assert levels_problem(["1", "2"], "vllm_tune_levels", True) == ""
    assert levels_problem([0], "vllm_benchmark_levels") == \
        "vllm_benchmark_levels must be positive integers, got [0] in [0]"
    assert levels_problem([8, 4], "vllm_install_gate_levels", True) == \
        "vllm_install_gate_levels must be ascending, got [8, 4]"
