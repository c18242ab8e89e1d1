"""gpu_topology parsers on the real outputs in tests/fixtures/nvidia-smi (see its README).

Expected values are read from a second raw file of the same machine where one exists (the XML
of `nvidia-smi -q -x`, the plain table), so each parser is checked against nvidia-smi itself.
"""
import json
import os
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import gpu_facts as gt

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))), "fixtures", "nvidia-smi")
H200 = ("h200-x1", "h200-x2")


def raw(machine, name):
    with open(os.path.join(FIX, machine, name)) as handle:
        return handle.read()


def xml_gpus(machine):
    root = ET.fromstring(raw(machine, "nvidia-smi-q-x.txt"))
    return root, root.findall("gpu")


# ----------------------------------------------------------------------------- query CSV
@pytest.mark.parametrize("machine", H200)
def test_query_gpu_matches_xml(machine):
    gpus = gt.parse_query_gpu(raw(machine, "nvidia-smi-query-gpu.txt"))
    root, xgpus = xml_gpus(machine)
    assert len(gpus) == int(root.findtext("attached_gpus")) == len(xgpus)
    for gpu, x in zip(gpus, xgpus):
        assert gpu["uuid"] == x.findtext("uuid")
        assert gpu["name"] == x.findtext("product_name") == "NVIDIA H200"
        total = x.find("fb_memory_usage").findtext("total")  # "143771 MiB"
        assert gpu["memory_total_mib"] == int(total.split()[0]) == 143771
        assert gpu["driver_version"] == root.findtext("driver_version") == "580.159.04"
        assert gpu["pci_bus_id"] == x.findtext("pci/pci_bus_id")
        assert gpu["pcie_gen"] == int(x.findtext("pci/pci_gpu_link_info/pcie_gen/current_link_gen"))
        width = x.findtext("pci/pci_gpu_link_info/link_widths/current_link_width")  # "16x"
        assert gpu["pcie_width"] == int(width.rstrip("x"))
        assert gpu["persistence_mode"] is (x.findtext("persistence_mode") == "Enabled")
        assert gpu["compute_cap"] == "9.0" and gpu["compute_cap_major"] == 9  # Hopper
        assert x.findtext("product_architecture") == "Hopper"
    assert [g["index"] for g in gpus] == list(range(len(gpus)))


def test_query_gpu_uuids_differ_between_machines():
    one = gt.parse_query_gpu(raw("h200-x1", "nvidia-smi-query-gpu.txt"))
    two = gt.parse_query_gpu(raw("h200-x2", "nvidia-smi-query-gpu.txt"))
    assert one[0]["uuid"] == "GPU-3a10565e-cb2b-6da9-e476-f78e539408a4"
    assert {g["uuid"] for g in two} == {"GPU-8b772981-43d6-0b69-b2b0-b44a373b5b5d",
                                        "GPU-dd5da518-3e3a-30f8-422e-f9118256ab79"}


def test_query_gpu_rejects_short_line_quoting_it():
    line = "0, NVIDIA H200, GPU-x, 143771"
    with pytest.raises(gt.NvidiaSmiParseError) as err:
        gt.parse_query_gpu(line + "\n")
    assert repr(line) in str(err.value)
    assert err.value.line == line


def test_query_gpu_rejects_header_row_and_handles_na():
    header = ("index, name, uuid, memory.total [MiB], memory.used [MiB], compute_cap, "
              "driver_version, persistence_mode, pcie.link.gen.current, "
              "pcie.link.width.current, pci.bus_id")
    with pytest.raises(gt.NvidiaSmiParseError, match="index and memory.total|not an integer"):
        gt.parse_query_gpu(header)
    # a real H200 line with the PCIe fields as nvidia-smi prints them when unavailable
    line = raw("h200-x1", "nvidia-smi-query-gpu.txt").strip().replace(", 5, 16,", ", [N/A], [N/A],")
    gpu = gt.parse_query_gpu(line)[0]
    assert gpu["pcie_gen"] is None and gpu["pcie_width"] is None
    assert gt.parse_query_gpu("No devices were found\n") == []


# ----------------------------------------------------------------------------- versions
@pytest.mark.parametrize("machine", H200)
@pytest.mark.parametrize("name", ["nvidia-smi.txt", "nvidia-smi-q.txt"])
def test_cuda_and_driver_version(machine, name):
    root, _unused = xml_gpus(machine)
    text = raw(machine, name)
    assert gt.parse_cuda_version(text) == root.findtext("cuda_version") == "13.0"
    assert gt.parse_driver_version(text) == root.findtext("driver_version")


def test_cuda_version_missing_is_an_error_quoting_the_first_line():
    with pytest.raises(gt.NvidiaSmiParseError, match="NVIDIA-SMI has failed"):
        gt.parse_cuda_version("NVIDIA-SMI has failed because it couldn't communicate with the "
                              "NVIDIA driver.\n")


# ----------------------------------------------------------------------------- topo -m
def test_topo_h200_x2_nvlink_with_ansi_header():
    text = raw("h200-x2", "nvidia-smi-topo-m.txt")
    assert "\x1b[4m" in text  # the real header carries escapes even when piped
    m = gt.parse_topo_matrix(text)
    assert m["gpus"] == ["GPU0", "GPU1"] and m["nics"] == []
    assert m["links"] == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}
    # 18 links listed by `nvidia-smi nvlink -s` for each GPU: the NV# count agrees
    links = re.findall(r"^\s+Link \d+:", raw("h200-x2", "nvidia-smi-nvlink-s.txt"), re.M)
    assert len(links) == 2 * 18
    assert m["cpu_affinity"] == {"GPU0": "0-31", "GPU1": "0-31"}
    assert m["numa_affinity"] == {"GPU0": "0", "GPU1": "0"}


def test_topo_h200_x1_single():
    m = gt.parse_topo_matrix(raw("h200-x1", "nvidia-smi-topo-m.txt"))
    assert m["gpus"] == ["GPU0"] and m["links"] == {"GPU0": {}}
    assert m["cpu_affinity"] == {"GPU0": "0-15"}


def test_topo_8x4090_sys_with_nic_columns():
    m = gt.parse_topo_matrix(raw("go-gpuallocator-17-8x4090", "nvidia-smi-topo-m.txt"))
    assert m["gpus"] == ["GPU%d" % i for i in range(8)]
    assert m["nics"] == ["NIC0", "NIC1"]
    kinds = {v for row in m["links"].values() for v in row.values()}
    assert kinds == {"SYS"}
    assert all(len(row) == 7 for row in m["links"].values())
    assert [m["numa_affinity"]["GPU%d" % i] for i in range(8)] == ["0"] * 4 + ["1"] * 4
    assert m["cpu_affinity"]["GPU6"] == "56-111,168-223"


def test_topo_2x5090_phb():
    m = gt.parse_topo_matrix(raw("club-3090-1229-2x5090", "nvidia-smi-topo-m.txt"))
    assert m["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}


def test_topo_unknown_link_kind_quotes_the_row():
    text = raw("club-3090-1229-2x5090", "nvidia-smi-topo-m.txt").replace(
        "GPU0\t X \tPHB", "GPU0\t X \tXYZ")
    with pytest.raises(gt.NvidiaSmiParseError) as err:
        gt.parse_topo_matrix(text)
    assert "unknown link kind 'XYZ'" in str(err.value)
    assert err.value.line.startswith("GPU0\t X \tXYZ")


def test_topo_garbage_header():
    with pytest.raises(gt.NvidiaSmiParseError, match="no GPU0 column"):
        gt.parse_topo_matrix("Failed to run topology command\n")


def test_topo_missing_row_is_detected():
    text = raw("h200-x2", "nvidia-smi-topo-m.txt")
    lines = text.splitlines(True)
    broken = "".join(l for l in lines if not l.startswith("GPU1"))
    with pytest.raises(gt.NvidiaSmiParseError, match="do not match"):
        gt.parse_topo_matrix(broken)


# ----------------------------------------------------------------------------- topo -p2p
@pytest.mark.parametrize("mode", ["r", "n"])
def test_p2p_h200_x2_ok(mode):
    p = gt.parse_topo_p2p(raw("h200-x2", "nvidia-smi-topo-p2p-%s.txt" % mode), mode)
    assert p == {"GPU0": {"GPU1": "OK"}, "GPU1": {"GPU0": "OK"}}


def test_p2p_h200_x1():
    assert gt.parse_topo_p2p(raw("h200-x1", "nvidia-smi-topo-p2p-r.txt")) == {"GPU0": {}}


def test_p2p_5090_gns():
    p = gt.parse_topo_p2p(raw("club-3090-1229-2x5090", "nvidia-smi-topo-p2p-rw.txt"), "rw")
    assert p == {"GPU0": {"GPU1": "GNS"}, "GPU1": {"GPU0": "GNS"}}


def test_p2p_unknown_status_quotes_the_row():
    text = raw("h200-x2", "nvidia-smi-topo-p2p-r.txt").replace(" GPU0\tX\tOK", " GPU0\tX\tMAYBE")
    with pytest.raises(gt.NvidiaSmiParseError) as err:
        gt.parse_topo_p2p(text)
    assert "MAYBE" in str(err.value) and err.value.line == " GPU0\tX\tMAYBE\t"


# ----------------------------------------------------------------------------- classification
def classify_fixture(machine, p2p_file=None, mode="r", gpus=None):
    m = gt.parse_topo_matrix(raw(machine, "nvidia-smi-topo-m.txt"))
    p = gt.parse_topo_p2p(raw(machine, p2p_file), mode) if p2p_file else None
    return gt.classify(m, p, gpus)


def test_classify_h200_x2_nvlink():
    r = classify_fixture("h200-x2", "nvidia-smi-topo-p2p-r.txt")
    assert r["class"] == "nvlink"
    assert r["pairs"] == {"GPU0-GPU1": {"link": "NV18", "p2p_read": "OK"}}
    assert any("NV18" in e and "OK" in e for e in r["evidence"])


def test_classify_h200_x1_single():
    assert classify_fixture("h200-x1", "nvidia-smi-topo-p2p-r.txt")["class"] == "single-gpu"


def test_classify_8x4090_cross_numa_also_for_a_same_node_subset():
    r = classify_fixture("go-gpuallocator-17-8x4090")
    assert r["class"] == "cross-numa"
    assert len(r["pairs"]) == 28
    assert any("not captured" in e for e in r["evidence"])
    # GPU0..3 share NUMA node 0 but the box still reports SYS between them
    assert classify_fixture("go-gpuallocator-17-8x4090", gpus=[0, 1, 2, 3])["class"] == "cross-numa"
    with pytest.raises(ValueError, match="GPU9"):
        classify_fixture("go-gpuallocator-17-8x4090", gpus=[0, 9])


def test_classify_5090_host_bridge_then_no_p2p():
    assert classify_fixture("club-3090-1229-2x5090")["class"] == "pcie-host-bridge"
    r = classify_fixture("club-3090-1229-2x5090", "nvidia-smi-topo-p2p-rw.txt", "rw")
    assert r["class"] == "no-p2p"
    assert "GNS" in r["reason"]


def test_classify_switch_and_worst_link_rule_on_edited_real_matrix():
    # the real 2x5090 matrix with its PHB cells replaced: PIX/PXB -> switch, NODE -> host bridge
    base = raw("club-3090-1229-2x5090", "nvidia-smi-topo-m.txt")
    for kind, expected in (("PIX", "pcie-switch"), ("PXB", "pcie-switch"),
                           ("NODE", "pcie-host-bridge"), ("SYS", "cross-numa"),
                           ("NV4", "nvlink")):
        m = gt.parse_topo_matrix(base.replace("\tPHB\t", "\t%s\t" % kind))
        assert gt.classify(m)["class"] == expected, kind


# ----------------------------------------------------------------------------- host state
@pytest.mark.parametrize("machine", H200)
def test_iommu_h200_cmdline(machine):
    r = gt.parse_iommu_cmdline(raw(machine, "proc-cmdline.txt"), raw(machine, "iommu-groups-count.txt"))
    assert r == {"mode": "default", "params": {}, "groups": 0}


@pytest.mark.parametrize("extra,mode", [
    ("amd_iommu=off", "off"), ("intel_iommu=on iommu=pt", "passthrough"),
    ("intel_iommu=on", "on"), ("iommu.passthrough=1", "passthrough"), ("iommu=off", "off"),
])
def test_iommu_modes_on_the_real_cmdline(extra, mode):
    cmdline = raw("h200-x2", "proc-cmdline.txt").replace(" -- ", " %s -- " % extra)
    assert gt.parse_iommu_cmdline(cmdline)["mode"] == mode
    # after "--" the words belong to init, not the kernel
    assert gt.parse_iommu_cmdline(raw("h200-x2", "proc-cmdline.txt") + " iommu=off")["mode"] == "default"


def test_lspci_acs_src_valid_on_bridge():
    entries = gt.parse_lspci_acs(raw("club-3090-1028-4x3090", "lspci-vvv-excerpt.txt"))
    assert len(entries) == 1
    e = entries[0]
    assert e["device"] == "0000:00:01.1" and e["bridge"] is True
    assert e["src_valid"] is True
    assert e["flags"] == {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True}
    s = gt.summarise_acs(entries)
    assert s["redirecting"] and s["src_valid_devices"] == ["0000:00:01.1"]


def test_lspci_acs_cleared_and_plain_header():
    text = raw("club-3090-1028-4x3090", "lspci-vvv-excerpt.txt").replace(
        "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+", "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir-")
    entries = gt.parse_lspci_acs(text)
    assert entries[0]["src_valid"] is False
    assert gt.summarise_acs(entries)["redirecting"] is False


def test_uvm_and_kernel_module_h200():
    for m in H200:
        assert gt.parse_uvm_disable_hmm(raw(m, "uvm_disable_hmm.txt")) is False  # file says N
        version = raw(m, "proc-driver-nvidia-version.txt")
        assert gt.parse_kernel_module(version) == "open"
        assert gt.parse_nvrm_driver_version(version) == "580.159.04"
    assert gt.parse_uvm_disable_hmm("Y\n") is True
    assert gt.parse_uvm_disable_hmm(None) is None
    with pytest.raises(gt.NvidiaSmiParseError, match="'maybe'"):
        gt.parse_uvm_disable_hmm("maybe")
    assert gt.parse_kernel_module(None, "filename: /lib/nvidia.ko\nlicense:        NVIDIA\n") == "proprietary"
    assert gt.parse_kernel_module(None, "license:        Dual MIT/GPL\n") == "open"
    assert gt.parse_kernel_module(None, "") == "none"
    # the proprietary NVRM line differs only by the missing "Open ... for"
    prop = raw("h200-x2", "proc-driver-nvidia-version.txt").replace(
        "NVIDIA UNIX Open Kernel Module for x86_64", "NVIDIA UNIX x86_64 Kernel Module")
    assert gt.parse_kernel_module(prop) == "proprietary"


def test_p2p_risks():
    acs = gt.summarise_acs(gt.parse_lspci_acs(raw("club-3090-1028-4x3090", "lspci-vvv-excerpt.txt")))
    iommu = gt.parse_iommu_cmdline("intel_iommu=on", "42")
    risks = gt.p2p_risks("pcie-host-bridge", iommu, acs, False)
    assert len(risks) == 3
    assert "0000:00:01.1" in risks[0] and "42 groups" in risks[1] and "uvm_disable_hmm" in risks[2]
    assert gt.p2p_risks("nvlink", iommu, acs, False) == []
    assert gt.p2p_risks("pcie-switch", gt.parse_iommu_cmdline("iommu=pt", "42"),
                        gt.summarise_acs([]), True) == []


# ----------------------------------------------------------------------------- facts
def outputs_of(machine):
    return {
        "query_gpu": raw(machine, "nvidia-smi-query-gpu.txt"),
        "nvidia_smi": raw(machine, "nvidia-smi.txt"),
        "topo_m": raw(machine, "nvidia-smi-topo-m.txt"),
        "topo_p2p_r": raw(machine, "nvidia-smi-topo-p2p-r.txt"),
        "topo_p2p_n": raw(machine, "nvidia-smi-topo-p2p-n.txt"),
        "cmdline": raw(machine, "proc-cmdline.txt"),
        "iommu_groups": raw(machine, "iommu-groups-count.txt"),
        "lspci": None,  # lspci is not installed on these machines
        "uvm_disable_hmm": raw(machine, "uvm_disable_hmm.txt"),
        "nvrm_version": raw(machine, "proc-driver-nvidia-version.txt"),
        "modinfo": raw(machine, "modinfo-nvidia.txt"),
    }


def test_build_facts_h200_x2():
    f = gt.build_facts(outputs_of("h200-x2"))
    assert f["present"] and f["count"] == 2
    assert f["driver_version"] == "580.159.04" and f["cuda_version"] == "13.0"
    assert f["kernel_module"] == "open" and f["uvm_hmm_disabled"] is False
    assert f["topology"]["class"] == "nvlink" and f["topology"]["risks"] == []
    assert f["topology"]["p2p_nvlink"] == {"GPU0": {"GPU1": "OK"}, "GPU1": {"GPU0": "OK"}}
    assert f["acs"]["lspci_available"] is False
    json.dumps(f)  # facts must be JSON-serialisable


def test_build_facts_h200_x1_and_no_gpu():
    f = gt.build_facts(outputs_of("h200-x1"))
    assert f["count"] == 1 and f["topology"]["class"] == "single-gpu"
    none = gt.build_facts({"nvidia_smi_error": "nvidia-smi not found", "cmdline": "ro quiet"})
    assert none["present"] is False and none["count"] == 0 and none["gpus"] == []
    assert none["topology"]["class"] is None and none["kernel_module"] == "none"
    assert none["nvidia_smi_error"] == "nvidia-smi not found"


# ----------------------------------------------------------------------------- module
REPLAY = r'''#!/bin/sh
# Replays real captured outputs of one machine; any other argument list is an error.
d=%(dir)s
case "$*" in
  "") cat "$d/nvidia-smi.txt" ;;
  "%(query)s") cat "$d/nvidia-smi-query-gpu.txt" ;;
  "topo -m") cat "$d/nvidia-smi-topo-m.txt" ;;
  "topo -p2p r") cat "$d/nvidia-smi-topo-p2p-r.txt" ;;
  "topo -p2p n") cat "$d/nvidia-smi-topo-p2p-n.txt" ;;
  *) echo "unexpected arguments: $*" >&2; exit 9 ;;
esac
'''


def run_module(tmp_path, fixture_dir, args):
    """Run the real module in a subprocess, nvidia-smi replaced by a replay of fixture_dir."""
    script = tmp_path / "nvidia-smi"
    script.write_text(REPLAY % {"dir": fixture_dir, "query": " ".join(gt.QUERY_GPU_ARGS)})
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    args = dict(args, nvidia_smi=str(script), _ansible_check_mode=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
    code = ("import sys; sys.path.insert(0, %r); import conftest; "
            "from ansible_collections.vllm_ops.deploy.plugins.modules import gpu_facts; "
            "gpu_facts.main()" % os.path.join(root, "tests"))
    proc = subprocess.run([sys.executable, "-c", code],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": args}),
                          capture_output=True, text=True, cwd=root, timeout=60, check=False)
    return json.loads(proc.stdout)


def test_module_documentation_is_valid_yaml():
    import yaml
    from ansible_collections.vllm_ops.deploy.plugins.modules import gpu_facts
    doc = yaml.safe_load(gpu_facts.DOCUMENTATION)
    assert doc["module"] == "gpu_facts"
    assert set(doc["options"]) == {"nvidia_smi", "gpus", "nccl_profile", "nccl_overrides",
                                   "cuda_version", "tensor_parallel", "pipeline_parallel",
                                   "data_parallel", "require_gpu", "host_name",
                                   "variable_names", "profile_name"}
    example = yaml.safe_load(gpu_facts.EXAMPLES)[0]["vllm_ops.deploy.gpu_facts"]
    assert example["tensor_parallel"] == 2
    assert "gpu_facts" in yaml.safe_load(gpu_facts.RETURN)["ansible_facts"]["contains"]


def test_module_on_replayed_h200_x2(tmp_path):
    out = run_module(tmp_path, os.path.join(FIX, "h200-x2"),
                     {"nccl_profile": "throughput", "cuda_version": "13.0", "tensor_parallel": 4,
                      "require_gpu": True})
    assert out["changed"] is False, out
    f = out["ansible_facts"]["gpu_facts"]
    assert f["count"] == 2 and f["topology"]["class"] == "nvlink"
    assert f["nccl"]["env"] == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"}
    assert len(f["preflight_errors"]) == 1
    assert "tensor_parallel 4" in f["preflight_errors"][0] and "host has 2" in f["preflight_errors"][0]


def test_module_fails_on_unknown_output_with_raw_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(os.path.join(FIX, "h200-x2")):
        (bad / name).write_text(raw("h200-x2", name))
    (bad / "nvidia-smi-topo-m.txt").write_text(
        raw("h200-x2", "nvidia-smi-topo-m.txt").replace("GPU0\t X \tNV18", "GPU0\t X \tNV??"))
    out = run_module(tmp_path, str(bad), {})
    assert out["failed"] is True
    assert "NV??" in out["msg"] and out["raw_line"].startswith("GPU0\t X \tNV??")
