"""vllm_sweep's base_url: with or without /v1, the requests go to <server>/v1/..."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.modules.vllm_sweep import base_url


@pytest.mark.parametrize("given", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/",
                                   "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/",
                                   " http://127.0.0.1:8000/v1 "])
def test_base_url_with_or_without_v1(given):
    assert base_url(given) == "http://127.0.0.1:8000"


def test_a_path_prefix_is_kept():
    assert base_url("https://llm.example.com/team-a/v1") == "https://llm.example.com/team-a"
    assert base_url("https://llm.example.com/v1beta") == "https://llm.example.com/v1beta"
