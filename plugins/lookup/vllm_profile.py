# -*- coding: utf-8 -*-
"""Lookup plugin vllm_ops.deploy.vllm_profile: a model profile, merged and validated."""
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_profile
author: vllm-deploy contributors (@vllm-ops)
short_description: Load a vLLM model profile, merged with overrides and validated
description:
  - Returns the model profile of each name given (one YAML file C(<name>.yml) per profile),
    merged with O(overrides) (a recursive merge; lists are replaced) and validated (parallel
    layout, GPU needs, flags the role sets itself, no secrets).
  - Looks in the directories of O(dirs) first, then in the collection's C(profiles/)
    directory.
  - This is the collection's one profile loader; the filter
    P(vllm_ops.deploy.vllm_resolve_instances#filter) uses the same code for each instance.
options:
  _terms:
    description: Profile names.
    type: list
    elements: str
    required: true
  overrides:
    description: Keys merged into every profile returned, for example C(max_model_len).
    type: dict
    default: {}
  dirs:
    description: Directories searched before the collection's C(profiles/).
    type: list
    elements: path
    default: []
  variable:
    description: The variable that chose the profile, named in error messages.
    type: str
"""

EXAMPLES = r"""
- name: Read the parallel layout of the host's profile
  ansible.builtin.set_fact:
    layout: "{{ lookup('vllm_ops.deploy.vllm_profile', 'minimax-m2.5-tp4').parallel }}"

- name: A profile with a shorter context, from the inventory's profiles first
  ansible.builtin.set_fact:
    profile: >-
      {{ lookup('vllm_ops.deploy.vllm_profile', vllm_service_profile,
                overrides={'max_model_len': 65536}, dirs=[inventory_dir ~ '/profiles']) }}
"""

RETURN = r"""
_raw:
  description: One profile (a mapping) per name.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import ProfileError
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import load_profile


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        overrides = self.get_option("overrides")
        dirs = self.get_option("dirs")
        variable = self.get_option("variable")
        try:
            return [load_profile(name, overrides, dirs, variable) for name in terms]
        except ProfileError as exc:
            raise AnsibleLookupError(str(exc))
