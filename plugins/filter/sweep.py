"""Filters of the vllm_benchmark role: the compact per-level view kept in host_vars, and the
configuration and fingerprint a sweep's result belongs to (the logic is in
plugins/plugin_utils/benchmark/report.py and plugins/plugin_utils/benchmark/record.py)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import (
    SweepError, check_also_slos, check_levels)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark import record as benchmark
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.report import compact_level


def vllm_sweep_compact(level):
    """The per-level figures worth keeping in host_vars (the full data goes to reports)."""
    return compact_level(level)


def vllm_benchmark_config(target, sweep, context=None, secret_pattern=None):
    """The configuration of one instance a sweep's result belongs to: rendered argv,
    environment without secrets (by name), resolved profile, model, sweep settings."""
    try:
        return benchmark.instance_config(target, sweep, context, secret_pattern)
    except benchmark.BenchmarkError as exc:
        raise AnsibleFilterError("vllm_benchmark_config: %s" % exc)


def vllm_benchmark_fingerprint(config):
    """16 hex digits identifying a configuration (see vllm_benchmark_config)."""
    return benchmark.fingerprint(config)


def vllm_public_env(env, secret_pattern=None):
    """An environment without the variables whose name looks like a secret."""
    try:
        return benchmark.public_env(env, secret_pattern)
    except benchmark.BenchmarkError as exc:
        raise AnsibleFilterError("vllm_public_env: %s" % exc)


def vllm_benchmark_record(sweep, target, config, fingerprint, context=None):
    """The record of one instance's sweep stored in host_vars (see record.build_record)."""
    return benchmark.build_record(sweep, target, config, fingerprint, context)


def levels_problem(levels, name="levels", ascending=False):
    """What is wrong with a list of concurrency levels ("" when nothing), for a role's assert:
    the sweep's own check (check_levels), integer strings accepted."""
    try:
        check_levels(levels, name, ascending=ascending, coerce=True)
    except ValueError as exc:
        return str(exc)
    return ""


def slos_problem(slos, name="also_slos"):
    """What is wrong with a mapping of named SLOs ("" when nothing), for a role's assert: the
    sweep's own check of its also_slos."""
    try:
        check_also_slos(slos, name)
    except SweepError as exc:
        return str(exc)
    return ""


class FilterModule(object):
    def filters(self):
        return {"vllm_sweep_compact": vllm_sweep_compact,
                "vllm_benchmark_config": vllm_benchmark_config,
                "vllm_benchmark_fingerprint": vllm_benchmark_fingerprint,
                "vllm_public_env": vllm_public_env,
                "vllm_benchmark_record": vllm_benchmark_record,
                "levels_problem": levels_problem,
                "slos_problem": slos_problem}
