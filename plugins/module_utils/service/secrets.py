# -*- coding: utf-8 -*-
"""The one list of what a secret's name looks like: an environment variable (or a setting)
whose name holds TOKEN, API_KEY, APIKEY, SECRET, PASSWORD, PASSWD, ACCESS_KEY, CREDENTIAL(S) or
PRIVATE_KEY as a whole word (between ``_`` or the ends, any case). Profiles refuse such names,
the benchmark's fingerprint and provenance leave them out, the roles' asserts refuse them in
plain environments (the ``secret_names`` filter), and the state read back from a host redacts
their values.
"""
from __future__ import annotations

import re

SECRET_NAME_PATTERN = (r"(?i)(^|_)(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|ACCESS_KEY|"
                       r"CREDENTIALS?|PRIVATE_KEY)($|_)")
SECRET_NAME = re.compile(SECRET_NAME_PATTERN)


def is_secret_name(name):
    """Whether ``name`` (an environment variable's or a setting's) names a secret."""
    return bool(SECRET_NAME.search(str(name)))


def secret_names(names):
    """The names among ``names`` (a list, or a mapping's keys) that name a secret, sorted."""
    return sorted(str(n) for n in (names or []) if is_secret_name(n))
