"""The unit PATH builder (plugins/module_utils/host/vllm_unit_path.py) on real directories."""
import os

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import vllm_unit_path as unit_path


def exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_venv_bin_comes_first_and_the_current_link_is_kept(tmp_path):
    real = tmp_path / "venvs" / "v1"
    exe(real / "bin" / "python")
    exe(real / "bin" / "ninja")
    (tmp_path / "current").symlink_to(real)
    python = str(tmp_path / "current" / "bin" / "python")
    out = unit_path.build(python, ["ninja"], system_path=["/usr/bin", "/bin"])
    # not resolved: a blue/green switch of `current` moves the unit's PATH with it
    assert out["path"] == "%s:/usr/bin:/bin" % (tmp_path / "current" / "bin")
    assert out["tools"] == {"ninja": str(tmp_path / "current" / "bin" / "ninja")}


def test_ninja_from_a_site_directory_environment_and_nvcc_from_cuda_home(tmp_path):
    venv = tmp_path / "venv"
    exe(venv / "bin" / "python")
    image = tmp_path / "opt" / "torch" / ".venv"
    site = image / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    exe(image / "bin" / "ninja")
    cuda = tmp_path / "cuda"
    exe(cuda / "bin" / "nvcc")
    out = unit_path.build(str(venv / "bin" / "python"), ["ninja", "nvcc"], site_dirs=[str(site)],
                          cuda_home=str(cuda), system_path=["/usr/bin"])
    assert out["path"].split(":") == [str(venv / "bin"), str(image / "bin"), str(cuda / "bin"),
                                      "/usr/bin"]
    assert out["tools"]["nvcc"] == str(cuda / "bin" / "nvcc")


def test_the_ninja_wheels_own_binary_folder_is_searched(tmp_path):
    venv = tmp_path / "venv"
    exe(venv / "bin" / "python")
    site = tmp_path / "site"
    exe(site / "ninja" / "data" / "bin" / "ninja")
    out = unit_path.build(str(venv / "bin" / "python"), ["ninja"], site_dirs=[str(site)],
                          system_path=[])
    assert out["path"].split(":") == [str(venv / "bin"), str(site / "ninja" / "data" / "bin")]


def test_a_missing_tool_is_named_with_where_it_was_looked_for(tmp_path):
    venv = tmp_path / "venv"
    exe(venv / "bin" / "python")
    with pytest.raises(unit_path.UnitPathError) as e:
        unit_path.build(str(venv / "bin" / "python"), ["ninja", "nvcc"],
                        cuda_home=str(tmp_path / "cuda"), system_path=[str(tmp_path / "none")])
    assert str(e.value).startswith("ninja, nvcc not found in %s:" % (venv / "bin"))
    assert str(tmp_path / "cuda" / "bin") in str(e.value)


def test_a_non_executable_file_does_not_count(tmp_path):
    venv = tmp_path / "venv"
    exe(venv / "bin" / "python")
    (venv / "bin" / "ninja").write_text("not executable")
    with pytest.raises(unit_path.UnitPathError):
        unit_path.build(str(venv / "bin" / "python"), ["ninja"], system_path=[])


def test_extra_dirs_follow_the_venv_and_nothing_repeats(tmp_path):
    venv = tmp_path / "venv"
    exe(venv / "bin" / "python")
    exe(venv / "bin" / "ninja")
    out = unit_path.build(str(venv / "bin" / "python"), ["ninja"], extra_dirs=["/opt/x/bin", "/usr/bin"],
                          system_path=["/usr/bin", "/bin"])
    assert out["path"] == "%s:/opt/x/bin:/usr/bin:/bin" % (venv / "bin")


def test_site_dir_bins_maps_a_venv_site_packages_to_its_bin():
    assert unit_path.site_dir_bins("/opt/torch/.venv/lib/python3.12/site-packages")[0] == "/opt/torch/.venv/bin"
    assert unit_path.site_dir_bins("/usr/lib/python3/dist-packages")[0] == "/usr/bin"
    assert os.path.basename(unit_path.site_dir_bins("/srv/site")[0]) == "bin"
