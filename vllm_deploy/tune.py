"""vllm_deploy.tune(): find the fastest correct serving layout of one host under a latency SLO.

The tuner itself (candidates, search, ranking, reports and the orchestration) is the
collection's plugins/plugin_utils/tune/ (tuner.py: :class:`Tuner`); this is its API: each
candidate is served by running the playbook vllm_ops.deploy.tune for the host over
ansible-runner, and the result is written back into the inventory.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Union

from .collection import plugin_module
from .errors import UsageError, VllmDeployError
from .runner import inventory_dirs, run_playbook


class TuneResult(dict):
    """The write-back document (dict) plus .reports (paths) and .path (host_vars file)."""

    @property
    def winner(self):
        return self.get("winner")


def tune(inventory, host: str, *, profile: str, slo_class: Optional[str] = None,
         ttft_ms: Optional[float] = None, tpot_ms: Optional[float] = None, slo_scale: float = 1.0,
         params_b: Optional[float] = None, moe: bool = False,
         budget_minutes: Optional[float] = None, budget_candidates: Optional[int] = None,
         knobs: Optional[Dict[str, List[Any]]] = None, instances: Optional[List[int]] = None,
         tensor_parallel: Optional[List[int]] = None, expert_parallel: Optional[List[bool]] = None,
         data_parallel: Optional[List[int]] = None, nccl_profiles: Optional[List[str]] = None,
         gpu_count: int = 0, gpu_memory_mib: Optional[int] = None,
         model_config: Optional[str] = None, weights_bytes: Optional[int] = None,
         max_model_len: Optional[int] = None,
         levels=(1, 2, 4, 8), base_window_s: float = 3.0, eta: int = 2, max_rounds: int = 3,
         input_len: int = 32, output_len: int = 32, port: int = 8000, listen_host: Optional[str] = None,
         reference: Optional[str] = None, min_match: float = 0.9,
         max_logprob_gap: Optional[float] = None, pinned: Optional[List[str]] = None,
         dummy_weights: bool = False, apply: bool = False, restore: bool = True,
         grid: bool = False, strategy: str = "auto", plan_only: bool = False, report_dir: Optional[str] = None,
         profile_overrides: Optional[Dict[str, Any]] = None,
         extra_args: Optional[List[str]] = None,
         extravars: Optional[Dict[str, Any]] = None,
         resume: Optional[Union[str, List[str]]] = None, reference_every: int = 0,
         min_lifetimes: float = 5, also_slos: Optional[List[str]] = None,
         on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
         log: Optional[Callable[[str], None]] = None) -> TuneResult:
    """Tune ``host`` of ``inventory``; returns the write-back document (see vllm_tune.yml).

    ``profile_overrides`` / ``extra_args``: the host's own vllm_service_profile_overrides and
    vllm_service_extra_args (e.g. ``--load-format dummy``), kept in every candidate.

    ``plan_only=True`` returns the candidates and the planner's refusals without serving.
    ``report_dir`` (default <inventory>/.reports/<host>/tune/<start time>) receives the reports
    and, from the first measurement on, ``measurements.jsonl``: one JSON line per measurement
    (candidate, layout, knobs, window, levels, each level's sweep summary with its interval,
    the score, the seconds it took, the error of a failed serve), appended as it is taken, so
    a run stopped before its end keeps what it measured.
    ``resume``: earlier runs' ``measurements.jsonl`` (a path or a list; a report directory
    will do). The candidates they measured successfully with the same profile, overrides,
    extra arguments, lengths and SLO, at the window and levels this run would use, are not
    served again (the latest measurement where several journals have one); vLLM's defaults are
    measured again first, and each taken measurement's throughput is anchored on them (scaled
    by the ratio of the default now to the default in its own journal at each level, its
    interval widened by both). The latencies stay as measured then.
    ``reference_every`` N (the grid only; 0, the default, measures vLLM's defaults first and
    last): vLLM's defaults are also measured again after every N candidates served, so a host
    whose speed drifts up and back down within the run is seen; the spread of all the default's
    measurements is every candidate's least noise (``evidence.drift``).
    ``min_lifetimes``: each level's window stays open until it is this many request lifetimes
    long (the median E2E of its requests), after ``base_window_s`` (or the round's window) has
    passed: its output tok/s interval then has that many batches of at least one lifetime,
    where a request at high concurrency can outlive a short window (0: the window alone).
    ``also_slos``: other SLO classes (as ``slo_class``, with the same ``params_b`` and
    ``slo_scale``) the same measurements are ranked under: every request is judged by each, so
    the document's ``other_slos`` holds, per class, the ranked candidates, the winner and the
    winner against vLLM's defaults. The search follows ``slo_class`` alone (what it serves, how
    often, where a sweep stops).
    ``strategy``: ``screen`` (one knob changed from the default at a time, then the combination
    of the winners, then successive halving among the leaders), ``halving`` (successive halving
    over every candidate), ``grid`` (every candidate over every level with the longest window:
    the auto_tune-style baseline of the benchmark; ``grid=True`` is the same) or ``auto``
    (screen when it serves clearly fewer candidates than halving would; see
    vllm_tune.choose_strategy).
    """
    tuner_mod = plugin_module("plugin_utils.tune.tuner")

    def play(extravars):
        runner, collector, _info = run_playbook("vllm_ops.deploy.tune", inventory, limit=host,
                                                extravars=extravars, on_event=on_event)
        fails = collector.failures_for(host)
        return {"rc": runner.rc, "facts": collector.facts.get(host, {}),
                "failure": fails[0].describe() if fails else None}

    settings = dict(
        slo_class=slo_class, ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_scale=slo_scale,
        params_b=params_b, moe=moe, budget_minutes=budget_minutes,
        budget_candidates=budget_candidates, knobs=knobs, instances=instances,
        tensor_parallel=tensor_parallel, expert_parallel=expert_parallel,
        data_parallel=data_parallel, nccl_profiles=nccl_profiles, gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib, model_config=model_config, weights_bytes=weights_bytes,
        max_model_len=max_model_len, levels=levels, base_window_s=base_window_s, eta=eta,
        max_rounds=max_rounds, input_len=input_len, output_len=output_len, port=port,
        listen_host=listen_host, reference=reference, min_match=min_match,
        max_logprob_gap=max_logprob_gap, pinned=pinned, dummy_weights=dummy_weights,
        apply=apply, restore=restore, grid=grid, strategy=strategy,
        profile_overrides=profile_overrides, extra_args=extra_args, extravars=extravars,
        resume=resume, reference_every=reference_every, min_lifetimes=min_lifetimes,
        also_slos=also_slos)
    inv_dir = inventory_dirs(inventory)[0]
    rdir = report_dir or tuner_mod.report_dir_for(inv_dir, host)
    journal = os.path.join(rdir, tuner_mod.JOURNAL_FILE)
    try:
        tuner = tuner_mod.Tuner(host, profile, play, log=log, journal=journal, **settings)
        if plan_only:  # what would be measured, what the planner refuses; nothing runs
            return TuneResult(tuner.plan())
        if log:
            log("each measurement is appended to %s as it is taken" % journal)
        doc, points, final_insts = tuner.run()
    except tuner_mod.TuneServeError as exc:
        raise VllmDeployError(str(exc)) from None
    except tuner_mod.TuneError as exc:
        raise UsageError(str(exc)) from None
    out = TuneResult(doc)
    out.reports, out.path = tuner_mod.write_back(inv_dir, host, doc, points,
                                                 final_insts if apply else None, rdir)
    return out
