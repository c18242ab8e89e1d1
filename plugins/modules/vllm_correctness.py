#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: greedy-decoding correctness check of a vLLM endpoint against a reference."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_correctness
short_description: Check that a vLLM endpoint decodes fixed prompts like a reference does
description:
  - Sends a fixed prompt set (a built-in set of 8 short English prompts, or I(prompts)) to
    C(/v1/completions), one request at a time, with greedy decoding (C(temperature 0),
    I(seed), exactly I(max_tokens) output tokens with I(ignore_eos)) and I(top_logprobs)
    logprobs, and returns per prompt the generated token ids, each token's logprob and the
    top-1 logprob at each position (tokens come back as C(token_id:<id>) through vLLM's
    C(return_tokens_as_token_ids)).
  - With a reference (I(reference), a stored result of this module, or I(reference_base_url),
    another endpoint decoded the same way in the same task) it compares the two
    (C(comparison)).
  - "C(prefix_match_rate): the common prefixes of the token sequences, summed over prompts,
    divided by the reference's tokens. C(token_match_rate): equal tokens at equal positions
    divided by the longer sequence's length, summed over prompts. C(exact_match_prompts):
    identical sequences. C(logprob_gap_max)/C(logprob_gap_mean): absolute differences of the
    top-1 logprobs (nats) over the positions of the common prefixes (beyond the first
    divergence the contexts differ)."
  - C(passed) is true when every threshold holds (I(min_token_match_rate),
    I(min_prefix_match_rate), I(max_logprob_gap_max), I(max_logprob_gap_mean)); C(failures)
    names those that broke. With I(fail_on_mismatch) the task fails then.
  - The defaults suit comparing serving layouts of one model on one kind of device (TP,
    kernels and batch sizes reorder floating-point sums; a near-tie may flip late in a
    sequence). On random or dummy weights the check compares layouts, not model quality.
  - Requests are sent one after another, so the check itself never batches its prompts
    together; other traffic on the server may still share a batch with them. Compare on an
    endpoint without other load where exact matches are expected.
  - Needs nothing beyond the Python standard library and Ansible on the host that runs it.
    It changes nothing (C(changed=false)) and also runs in check mode, since it only reads.
options:
  base_url:
    description: Base URL of the server, with or without a trailing C(/v1), e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: Served model name.
    type: str
    required: true
  api_key:
    description: Bearer token for the server, if it needs one. Never logged or returned.
    type: str
  prompts:
    description:
      - The prompts, each a non-empty string or a list of token ids. Default the built-in set,
        or the prompts of I(reference) when it is given.
    type: list
    elements: raw
  max_tokens:
    description: Output tokens per prompt (exact with I(ignore_eos)). Default 32, or the one of I(reference).
    type: int
  seed:
    description: Sampling seed sent with every request (greedy decoding does not use it, but a
      server default that samples would). Default 0, or the one of I(reference).
    type: int
  top_logprobs:
    description: Top logprobs asked for per position (at least 1, within the server's C(--max-logprobs)). Default 1, or the one of I(reference).
    type: int
  ignore_eos:
    description: Send C(ignore_eos) and C(min_tokens = max_tokens) so every output has exactly I(max_tokens) tokens. Default true, or the one of I(reference).
    type: bool
  timeout_s:
    description: Per-request timeout, seconds.
    type: float
    default: 120
  reference:
    description:
      - A stored result of this module (its C(vllm_correctness) fact, e.g. read back from the
        inventory) or its C(outputs) list. Its prompts and settings (I(max_tokens), I(seed),
        I(ignore_eos), I(top_logprobs)) are used unless given; a setting given that differs
        from the reference's fails the check, naming it.
    type: raw
  reference_base_url:
    description: Another endpoint to decode the same prompts on as the reference (instead of I(reference)).
    type: str
  reference_model:
    description: Served model name at I(reference_base_url). Default I(model).
    type: str
  reference_api_key:
    description: Bearer token for I(reference_base_url). Never logged or returned.
    type: str
  min_token_match_rate:
    description: Lowest position-wise token match rate that passes. Null disables this check.
    type: float
    default: 0.9
  min_prefix_match_rate:
    description: Lowest common-prefix match rate that passes. Null disables this check.
    type: float
    default: 0.8
  max_logprob_gap_max:
    description: Largest top-1 logprob difference (nats) on the common prefixes that passes. Null disables this check.
    type: float
    default: 1.0
  max_logprob_gap_mean:
    description: Largest mean top-1 logprob difference (nats) on the common prefixes that passes. Null disables this check.
    type: float
    default: 0.1
  fail_on_mismatch:
    description: Fail the task when a reference was given and a threshold broke.
    type: bool
    default: false
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.FACTS
  - vllm_ops.deploy.attributes.INFO
attributes:
  check_mode:
    details: Only reads (a few greedy completions), so it runs the same in check mode.
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Decode the built-in prompts on the serving endpoint (a reference for later)
  vllm_ops.deploy.vllm_correctness:
    base_url: http://127.0.0.1:8000
    model: tiny
  register: reference_run

- name: A candidate layout must decode like the reference
  vllm_ops.deploy.vllm_correctness:
    base_url: http://127.0.0.1:8001/v1
    model: tiny
    reference: "{{ reference_run.ansible_facts.vllm_correctness }}"
    fail_on_mismatch: true

- name: Compare two endpoints directly, exact match required
  vllm_ops.deploy.vllm_correctness:
    base_url: http://gpu-b:8000
    model: Qwen3-8B
    reference_base_url: http://gpu-a:8000
    min_token_match_rate: 1.0
    min_prefix_match_rate: 1.0
    prompts:
      - "The capital of France is"
      - [1, 450, 7483, 310]
"""

RETURN = r"""
ansible_facts:
  description: Facts set by the module.
  returned: success
  type: dict
  contains:
    vllm_correctness:
      description: The check's result (write it to the inventory to use it as a later reference).
      type: dict
      contains:
        endpoint:
          description: The base URL decoded (without C(/v1)).
          type: str
        model:
          description: The served model name.
          type: str
        parameters:
          description: max_tokens, seed, top_logprobs, ignore_eos, temperature, prompts (count),
            prompts_sha256, prompt_set (builtin or given).
          type: dict
        outputs:
          description: Per prompt, in order, prompt, token_ids, logprobs (of each generated token),
            top1_logprobs, text, finish_reason, prompt_tokens.
          type: list
          elements: dict
        comparison:
          description: >-
            Null without a reference. Else prompts, exact_match_prompts, prefix_match_rate,
            token_match_rate, logprob_gap_max, logprob_gap_mean, first_divergence (per prompt,
            null when identical), per_prompt (tokens, reference_tokens, prefix_match,
            position_matches, first_divergence, logprob_gap_max), thresholds, failures, passed.
          type: dict
        passed:
          description: Whether every threshold held; null without a reference.
          type: bool
        reference:
          description: Where the reference came from (source stored or endpoint, endpoint, model); null without one.
          type: dict
        reference_outputs:
          description: The reference endpoint's outputs (only with I(reference_base_url)).
          type: list
          elements: dict
summary:
  description: One line with the verdict and the figures.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_correctness import (
    CorrectnessError, check_params, run_check, summary_line)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            prompts=dict(type="list", elements="raw"),
            max_tokens=dict(type="int", no_log=False),
            seed=dict(type="int"),
            top_logprobs=dict(type="int"),
            ignore_eos=dict(type="bool"),
            timeout_s=dict(type="float", default=120),
            reference=dict(type="raw"),
            reference_base_url=dict(type="str"),
            reference_model=dict(type="str"),
            reference_api_key=dict(type="str", no_log=True),
            min_token_match_rate=dict(type="float", default=0.9, no_log=False),
            min_prefix_match_rate=dict(type="float", default=0.8),
            max_logprob_gap_max=dict(type="float", default=1.0),
            max_logprob_gap_mean=dict(type="float", default=0.1),
            fail_on_mismatch=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("reference", "reference_base_url")],
        supports_check_mode=True,
    )
    params = dict(module.params)
    fail_on_mismatch = params.pop("fail_on_mismatch")
    try:
        check_params(params)
        result = run_check(params)
    except CorrectnessError as e:
        module.fail_json(msg=str(e))
    line = summary_line(result)
    facts = {"vllm_correctness": result}
    if fail_on_mismatch and result["passed"] is False:
        module.fail_json(msg="correctness check failed: " + line, ansible_facts=facts,
                         summary=line)
    module.exit_json(changed=False, ansible_facts=facts, summary=line)


if __name__ == "__main__":
    main()
