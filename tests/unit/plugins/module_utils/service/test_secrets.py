"""The one list of secret names (plugins/module_utils/service/secrets.py) and every place that
uses it: profiles refuse such env names, the benchmark fingerprint leaves them out, the state
read back from a host redacts them, and the secret_names filter the roles' asserts use."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.filter.systemd import FilterModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import vllm_instance
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.secrets import (
    is_secret_name, secret_names)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.record import public_env
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import (
    SECRET_ENV)

SECRET = ["HF_TOKEN", "VLLM_API_KEY", "openai_apikey", "DB_PASSWORD", "MY_PASSWD",
          "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY",
          "TOKEN", "REGISTRY_CREDENTIAL"]
PLAIN = ["TOKENIZERS_PARALLELISM", "VLLM_USE_V1", "NCCL_IB_HCA", "HF_HOME", "KEYBOARD",
         "PYTHONPATH", "MAX_TOKENS_HINT"]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names(name):
    assert is_secret_name(name)
    assert SECRET_ENV.search(name)  # the profile schema refuses it


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names(name):
    assert not is_secret_name(name)
    assert not SECRET_ENV.search(name)


def test_every_user_of_the_list_agrees():
    env = dict((n, "v-" + n) for n in SECRET + PLAIN)
    assert secret_names(env) == sorted(SECRET)
    assert sorted(public_env(env)) == sorted(PLAIN)
    redacted = vllm_instance.redact(env)
    assert sorted(k for k, v in redacted.items() if v == vllm_instance.REDACTED) == sorted(SECRET)
    assert FilterModule().filters()["secret_names"](env) == sorted(SECRET)
    assert FilterModule().filters()["secret_names"]({}) == []
