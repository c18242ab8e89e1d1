"""Filters of vllm_install's upgrade gate (the logic is in
plugins/plugin_utils/upgrade/gate.py)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.upgrade import gate


def vllm_upgrade_decision(candidate_levels, current_levels, correctness, coherence=None,
                          tolerance_pct=5.0, min_token_match=0.9, override=False,
                          current_after_levels=None):
    """Accept or reject a new vLLM pin (see vllm_upgrade_gate.decide)."""
    try:
        return gate.decide(candidate_levels, current_levels, correctness, coherence,
                           float(tolerance_pct), float(min_token_match), bool(override),
                           current_after_levels)
    except (gate.GateError, ValueError) as exc:
        raise AnsibleFilterError("vllm_upgrade_decision: %s" % exc)


def vllm_upgrade_table(decision, current_pin="current", candidate_pin="candidate", journal=None,
                       mode=None, comparison=None):
    """The side-by-side table of a gate decision."""
    return gate.render_table(decision, current_pin, candidate_pin, journal, mode, comparison)


def vllm_upgrade_candidate_argv(argv, current_link, venv, port):
    """The serving instance's argv run from the new venv on another port."""
    try:
        return gate.candidate_argv(argv, current_link, venv, port)
    except gate.GateError as exc:
        raise AnsibleFilterError("vllm_upgrade_candidate_argv: %s" % exc)


def vllm_upgrade_gate_mode(requested, endpoints, gpu_facts=None, gate_gpus="", port_free=True,
                           mem_available_mib=None, serving_mem_mib=None):
    """Beside or window for the gate's candidate, with the reason (see
    vllm_upgrade_gate.choose_mode)."""
    def num(x):
        return None if x in (None, "", "[not set]", "infinity") or not str(x).isdigit() else int(x)
    try:
        return gate.choose_mode(requested, endpoints, gpu_facts, gate_gpus, bool(port_free),
                                num(mem_available_mib), num(serving_mem_mib))
    except (gate.GateError, ValueError) as exc:
        raise AnsibleFilterError("vllm_upgrade_gate_mode: %s" % exc)


def vllm_upgrade_history(doc, entry, keep=20):
    """The host's upgrade history with an accepted pin appended."""
    return gate.merge_history(doc, entry, int(keep))


def vllm_upgrade_entry(decision, pin_id, pin, candidate_levels, mode, at, previous=None,
                       downtime_s=None, versions=None):
    """One accepted pin of the history."""
    return gate.history_entry(pin_id, pin, decision, candidate_levels, mode, at, previous,
                              downtime_s, versions)


class FilterModule(object):
    def filters(self):
        return {"vllm_upgrade_decision": vllm_upgrade_decision,
                "vllm_upgrade_table": vllm_upgrade_table,
                "vllm_upgrade_candidate_argv": vllm_upgrade_candidate_argv,
                "vllm_upgrade_history": vllm_upgrade_history,
                "vllm_upgrade_gate_mode": vllm_upgrade_gate_mode,
                "vllm_upgrade_entry": vllm_upgrade_entry}
