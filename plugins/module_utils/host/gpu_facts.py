"""Parsers for nvidia-smi and host P2P state, and the topology class of a GPU set.

Pure Python (no Ansible, no subprocess): every function takes the raw text a command printed
and returns plain data. Real outputs these parsers were written against live in
tests/fixtures/nvidia-smi/ (H200 x1 and x2 captures, published PCIe samples).

Output that does not look like what nvidia-smi prints raises NvidiaSmiParseError, whose
message quotes the offending raw line, so a caller can show exactly what was not understood.

Topology classes, for the GPU set's worst pair (the links of ``nvidia-smi topo -m``; the
class decides the NCCL environment, see nccl_env.py):
  nvlink            every pair NV#
  pcie-switch       worst pair PIX or PXB (peers behind a PCIe switch)
  pcie-host-bridge  worst pair PHB or NODE (traffic crosses a CPU host bridge)
  cross-numa        any pair SYS (traffic crosses the socket interconnect)
  no-p2p            nvidia-smi topo -p2p r reports a pair other than OK
  single-gpu        one GPU: no peers, nothing to classify
"""
from __future__ import annotations

import re

# Fields of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`, in this order.
QUERY_FIELDS = (
    "index", "name", "uuid", "memory.total", "memory.used", "compute_cap",
    "driver_version", "persistence_mode", "pcie.link.gen.current",
    "pcie.link.width.current", "pci.bus_id",
)
QUERY_GPU_ARGS = ["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]

TOPOLOGY_CLASSES = ("nvlink", "pcie-switch", "pcie-host-bridge", "cross-numa", "no-p2p",
                    "single-gpu")

# Link kinds of `nvidia-smi topo -m`, best first. NV# is matched separately.
_LINK_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 3, "SYS": 4}
_LINK_CLASS = {0: "nvlink", 1: "pcie-switch", 2: "pcie-switch", 3: "pcie-host-bridge",
               4: "cross-numa"}
_NV_RE = re.compile(r"^NV(\d+)$")
# Status codes of `nvidia-smi topo -p2p r|w|n|a|p` (legend of the real output + DR).
P2P_STATUS = {
    "OK": "Status Ok", "NS": "Not supported", "CNS": "Chipset not supported",
    "GNS": "GPU not supported", "TNS": "Topology not supported", "DR": "Disabled by regkey",
    "U": "Unknown",
}

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_RE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$")


class NvidiaSmiParseError(ValueError):
    """Output a parser does not recognise; the message names the command and quotes the line."""

    def __init__(self, command, line, reason):
        self.command = command
        self.line = line
        self.reason = reason
        super(NvidiaSmiParseError, self).__init__(
            "unrecognised output of `%s`: %s; raw line: %r" % (command, reason, line))


def strip_ansi(text):
    """Remove terminal colour/underline escapes (topo -m wraps its header in them, even piped)."""
    return _ANSI_RE.sub("", text or "")


def _int_or_none(value, command, line, field):
    value = value.strip()
    if value in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise NvidiaSmiParseError(command, line, "field %s is not an integer (%r)" % (field, value))


# --------------------------------------------------------------------------- query-gpu CSV
def parse_query_gpu(text):
    """Parse the --query-gpu CSV (fields QUERY_FIELDS, noheader, nounits) into a list of dicts.

    Keys: index, name, uuid, memory_total_mib, memory_used_mib, compute_cap ("9.0"),
    compute_cap_major, driver_version, persistence_mode (bool or None), pcie_gen, pcie_width,
    pci_bus_id. "No devices were found" gives [].
    """
    command = "nvidia-smi " + " ".join(QUERY_GPU_ARGS)
    gpus = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if line.strip().startswith("No devices were found"):
            return []
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise NvidiaSmiParseError(command, line, "expected %d comma-separated fields, got %d"
                                      % (len(QUERY_FIELDS), len(cells)))
        row = dict(zip(QUERY_FIELDS, cells))
        index = _int_or_none(row["index"], command, line, "index")
        mem_total = _int_or_none(row["memory.total"], command, line, "memory.total")
        if index is None or mem_total is None:
            raise NvidiaSmiParseError(command, line, "index and memory.total must be numbers")
        cap = row["compute_cap"]
        if not re.match(r"^\d+\.\d+$", cap):
            raise NvidiaSmiParseError(command, line, "compute_cap %r is not MAJOR.MINOR" % cap)
        if not re.match(r"^\d+(\.\d+)+$", row["driver_version"]):
            raise NvidiaSmiParseError(command, line,
                                      "driver_version %r is not a version" % row["driver_version"])
        persistence = {"Enabled": True, "Disabled": False}.get(row["persistence_mode"])
        gpus.append({
            "index": index,
            "name": row["name"],
            "uuid": row["uuid"],
            "memory_total_mib": mem_total,
            "memory_used_mib": _int_or_none(row["memory.used"], command, line, "memory.used"),
            "compute_cap": cap,
            "compute_cap_major": int(cap.split(".")[0]),
            "driver_version": row["driver_version"],
            "persistence_mode": persistence,
            "pcie_gen": _int_or_none(row["pcie.link.gen.current"], command, line,
                                     "pcie.link.gen.current"),
            "pcie_width": _int_or_none(row["pcie.link.width.current"], command, line,
                                       "pcie.link.width.current"),
            "pci_bus_id": row["pci.bus_id"],
        })
    return gpus


# --------------------------------------------------------------------------- versions
_CUDA_RE = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+|N/A)")
_DRIVER_RE = re.compile(r"Driver Version\s*:\s*(\d+(?:\.\d+)+)")


def parse_cuda_version(text):
    """CUDA version the driver supports, from plain `nvidia-smi` or `nvidia-smi -q`; None if N/A.

    Raises NvidiaSmiParseError when the text has no "CUDA Version" at all.
    """
    match = _CUDA_RE.search(text or "")
    if not match:
        first = next((l for l in (text or "").splitlines() if l.strip()), "")
        raise NvidiaSmiParseError("nvidia-smi", first, "no 'CUDA Version' in the output")
    return None if match.group(1) == "N/A" else match.group(1)


def parse_driver_version(text):
    """Driver version from plain `nvidia-smi` or `nvidia-smi -q` (None when absent)."""
    match = _DRIVER_RE.search(text or "")
    return match.group(1) if match else None


# --------------------------------------------------------------------------- topo -m
def parse_topo_matrix(text):
    """Parse `nvidia-smi topo -m`.

    Returns {"gpus": ["GPU0", ...], "nics": [...], "links": {"GPU0": {"GPU1": "NV18"}, ...},
    "cpu_affinity": {"GPU0": "0-31"}, "numa_affinity": {"GPU0": "0"}}.
    Header escapes are stripped, cells unpadded; device columns end at "CPU Affinity"; NIC rows
    and the legend(s) that follow the GPU rows are skipped.
    """
    command = "nvidia-smi topo -m"
    lines = strip_ansi(text).splitlines()
    header_idx = next((i for i, l in enumerate(lines) if l.strip()), None)
    if header_idx is None:
        raise NvidiaSmiParseError(command, "", "empty output")
    header_line = lines[header_idx]
    header = [c.strip() for c in header_line.split("\t")]
    if header and header[0] == "":
        header = header[1:]
    if "GPU0" not in header:
        raise NvidiaSmiParseError(command, header_line, "header has no GPU0 column")
    end = header.index("CPU Affinity") if "CPU Affinity" in header else len(header)
    while end > 0 and header[end - 1] == "":
        end -= 1
    columns = header[:end]
    extra = header[end:]
    for col in columns:
        if not _DEVICE_RE.match(col):
            raise NvidiaSmiParseError(command, header_line, "unknown column %r" % col)
    gpus = [c for c in columns if c.startswith("GPU")]
    nics = [c for c in columns if not c.startswith("GPU")]

    links, cpu_aff, numa_aff = {}, {}, {}
    for line in lines[header_idx + 1:]:
        if not line.strip():
            break  # blank line before the legend
        cells = [c.strip() for c in line.split("\t")]
        name = cells[0]
        if name not in columns:
            raise NvidiaSmiParseError(command, line, "row %r is not a header device" % name)
        if not name.startswith("GPU"):
            continue  # NIC rows: not needed to classify the GPU set
        values = cells[1:1 + len(columns)]
        if len(values) < len(columns):
            raise NvidiaSmiParseError(command, line, "row has %d link cells, header has %d"
                                      % (len(values), len(columns)))
        row = {}
        for col, val in zip(columns, values):
            if col == name:
                if val != "X":
                    raise NvidiaSmiParseError(command, line, "diagonal cell is %r, not X" % val)
                continue
            if val not in _LINK_RANK and not _NV_RE.match(val):
                raise NvidiaSmiParseError(command, line, "unknown link kind %r" % val)
            if col.startswith("GPU"):
                row[col] = val
        links[name] = row
        trailing = dict(zip(extra, cells[1 + len(columns):]))
        if "CPU Affinity" in trailing:
            cpu_aff[name] = trailing["CPU Affinity"]
        if "NUMA Affinity" in trailing:
            numa_aff[name] = trailing["NUMA Affinity"]
    if sorted(links) != sorted(gpus):
        raise NvidiaSmiParseError(command, header_line, "GPU rows %s do not match GPU columns %s"
                                  % (sorted(links), gpus))
    return {"gpus": gpus, "nics": nics, "links": links, "cpu_affinity": cpu_aff,
            "numa_affinity": numa_aff}


# --------------------------------------------------------------------------- topo -p2p
def parse_topo_p2p(text, mode="r"):
    """Parse `nvidia-smi topo -p2p <mode>`: {"GPU0": {"GPU1": "OK"}, ...} (diagonal left out)."""
    command = "nvidia-smi topo -p2p %s" % mode
    lines = strip_ansi(text).splitlines()
    header_idx = next((i for i, l in enumerate(lines) if l.strip()), None)
    if header_idx is None:
        raise NvidiaSmiParseError(command, "", "empty output")
    header_line = lines[header_idx]
    columns = [c.strip() for c in header_line.split("\t") if c.strip()]
    if not columns or any(not re.match(r"^GPU\d+$", c) for c in columns):
        raise NvidiaSmiParseError(command, header_line, "header is not a list of GPU columns")
    matrix = {}
    for line in lines[header_idx + 1:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("\t")]
        cells = cells[:1 + len(columns)]
        name = cells[0]
        if name not in columns or len(cells) != 1 + len(columns):
            raise NvidiaSmiParseError(command, line, "not a row of the %d-GPU matrix" % len(columns))
        row = {}
        for col, val in zip(columns, cells[1:]):
            if col == name:
                if val != "X":
                    raise NvidiaSmiParseError(command, line, "diagonal cell is %r, not X" % val)
                continue
            if val not in P2P_STATUS:
                raise NvidiaSmiParseError(command, line, "unknown P2P status %r" % val)
            row[col] = val
        matrix[name] = row
    if sorted(matrix) != sorted(columns):
        raise NvidiaSmiParseError(command, header_line, "rows %s do not match columns %s"
                                  % (sorted(matrix), columns))
    return matrix


# --------------------------------------------------------------------------- host P2P state
def parse_iommu_cmdline(cmdline, iommu_groups=None):
    """IOMMU state from /proc/cmdline (and the number of /sys/kernel/iommu_groups entries).

    mode: "off" (iommu=off / intel_iommu=off / amd_iommu=off), "passthrough" (iommu=pt or
    iommu.passthrough=1), "on" (intel_iommu=on / amd_iommu=on / iommu=force|on), else "default"
    (the kernel's build default). groups > 0 means an IOMMU is active in some form.
    """
    params = {}
    for token in (cmdline or "").split():
        if token == "--":
            break  # what follows is for init, not the kernel
        key, _unused, value = token.partition("=")
        if key in ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict"):
            params[key] = value
    values = {k: v.split(",") for k, v in params.items()}
    if any("off" in values.get(k, []) for k in ("iommu", "intel_iommu", "amd_iommu")):
        mode = "off"
    elif "pt" in values.get("iommu", []) or params.get("iommu.passthrough") in ("1", "y", "Y"):
        mode = "passthrough"
    elif (any("on" in values.get(k, []) for k in ("intel_iommu", "amd_iommu", "iommu"))
          or "force" in values.get("iommu", [])):
        mode = "on"
    else:
        mode = "default"
    groups = None
    if iommu_groups is not None and str(iommu_groups).strip() != "":
        try:
            groups = int(str(iommu_groups).strip())
        except ValueError:
            raise NvidiaSmiParseError("ls /sys/kernel/iommu_groups | wc -l", str(iommu_groups),
                                      "not a count")
    return {"mode": mode, "params": params, "groups": groups}


_PCI_ADDR = r"((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
# A device header of `lspci -vvv` starts at column 0 with its address; the club-3090 rig report
# (a published fixture) prefixes each device with "# lspci -vvv -s <address>".
_LSPCI_DEV_RE = re.compile(r"^(?:#\s*lspci\s+-vvv\s+-s\s+)?" + _PCI_ADDR + r"\s+(.*)$")
_ACS_RE = re.compile(r"^\s*ACSCtl:\s*(.*)$")
_FLAG_RE = re.compile(r"([A-Za-z]+)([+-])")


def parse_lspci_acs(text):
    """ACS control state of each device in `lspci -vvv` output.

    Returns a list of {"device", "description", "bridge", "flags": {name: bool},
    "src_valid": bool} for every device that has an ACSCtl line. Needs root: without it lspci
    hides the capability lines (then the list is simply empty).
    """
    entries, device, description = [], None, ""
    for line in (text or "").splitlines():
        dev = _LSPCI_DEV_RE.match(line)
        if dev:
            device, description = dev.group(1), dev.group(2).strip()
            continue
        acs = _ACS_RE.match(line)
        if acs:
            flags = {name: sign == "+" for name, sign in _FLAG_RE.findall(acs.group(1))}
            if not flags:
                raise NvidiaSmiParseError("lspci -vvv", line, "ACSCtl line without +/- flags")
            entries.append({
                "device": device,
                "description": description,
                "bridge": "bridge" in description.lower(),
                "flags": flags,
                "src_valid": flags.get("SrcValid", False),
            })
    return entries


def summarise_acs(entries, lspci_available=True):
    """{"checked", "lspci_available", "src_valid_devices": [...], "redirecting": bool}."""
    src_valid = [e["device"] for e in entries if e["src_valid"]]
    return {
        "lspci_available": bool(lspci_available),
        "checked": len(entries),
        "src_valid_devices": src_valid,
        "redirecting": bool(src_valid),
    }


def parse_uvm_disable_hmm(text):
    """/sys/module/nvidia_uvm/parameters/uvm_disable_hmm: Y/1 -> True, N/0 -> False, absent -> None."""
    if text is None or not text.strip():
        return None
    value = text.strip()
    if value in ("Y", "1"):
        return True
    if value in ("N", "0"):
        return False
    raise NvidiaSmiParseError("cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm", value,
                              "expected Y, N, 1 or 0")


def parse_kernel_module(version_text=None, modinfo_text=None):
    """open | proprietary | none, from /proc/driver/nvidia/version or `modinfo nvidia`.

    The open module's NVRM line reads "NVIDIA UNIX Open Kernel Module for x86_64"; the
    proprietary one "NVIDIA UNIX x86_64 Kernel Module". modinfo: license "Dual MIT/GPL" is the
    open module, "NVIDIA" the proprietary one.
    """
    if version_text and version_text.strip():
        nvrm = next((l for l in version_text.splitlines() if l.startswith("NVRM version:")), None)
        if nvrm is None:
            raise NvidiaSmiParseError("cat /proc/driver/nvidia/version",
                                      version_text.splitlines()[0], "no 'NVRM version:' line")
        if "Open Kernel Module" in nvrm:
            return "open"
        if "Kernel Module" in nvrm:
            return "proprietary"
        raise NvidiaSmiParseError("cat /proc/driver/nvidia/version", nvrm,
                                  "neither open nor proprietary kernel module")
    if modinfo_text and modinfo_text.strip():
        lic = re.search(r"^license:\s*(.+)$", modinfo_text, re.M)
        if lic:
            value = lic.group(1).strip()
            if "MIT" in value or "GPL" in value:
                return "open"
            if value == "NVIDIA":
                return "proprietary"
            raise NvidiaSmiParseError("modinfo nvidia", lic.group(0), "unknown license")
    return "none"


def parse_nvrm_driver_version(version_text):
    """Driver version from /proc/driver/nvidia/version (None when absent)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", version_text or "")
    return match.group(1) if match else None


# --------------------------------------------------------------------------- classification
def classify(matrix, p2p=None, gpus=None):
    """Topology class of a GPU set with the evidence for it.

    matrix: parse_topo_matrix(); p2p: parse_topo_p2p(mode r) or None when not captured;
    gpus: the GPU names (["GPU0", "GPU1"]) or indices of the set (default: all).
    Rule: any P2P read status other than OK (``nvidia-smi topo -p2p r``: NS, CNS, GNS, TNS,
    DR, U) -> no-p2p; otherwise the worst link decides: SYS -> cross-numa, NODE/PHB -> pcie-host-bridge, PIX/PXB -> pcie-switch,
    all NV# -> nvlink. Returns {"class", "reason", "evidence": [...], "pairs": {"GPU0-GPU1": ...}}.
    """
    names = list(matrix["gpus"]) if gpus is None else [
        g if isinstance(g, str) else "GPU%d" % g for g in gpus]
    for name in names:
        if name not in matrix["links"]:
            raise ValueError("GPU %s is not in the topology matrix (has %s)"
                             % (name, ", ".join(matrix["gpus"])))
    pairs, evidence = {}, []
    if len(names) < 2:
        return {"class": "single-gpu", "reason": "one GPU in the set: no peer links",
                "evidence": ["topo -m lists %s" % ", ".join(matrix["gpus"])], "pairs": {}}
    worst, worst_pairs = -1, []
    blocked = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            link = matrix["links"][a][b]
            key = "%s-%s" % (a, b)
            status = None
            if p2p is not None:
                status = p2p.get(a, {}).get(b)
                if status is None:
                    raise ValueError("P2P matrix has no %s entry" % key)
            pairs[key] = {"link": link, "p2p_read": status}
            evidence.append("%s: topo -m %s%s" % (
                key, link, "" if status is None else ", topo -p2p r %s (%s)"
                % (status, P2P_STATUS[status])))
            rank = 0 if _NV_RE.match(link) else _LINK_RANK[link]
            if rank > worst:
                worst, worst_pairs = rank, [key]
            elif rank == worst:
                worst_pairs.append(key)
            if status is not None and status != "OK":
                blocked.append("%s %s" % (key, status))
    if p2p is None:
        evidence.append("P2P read status not captured (nvidia-smi topo -p2p r): assumed OK")
    if blocked:
        cls = "no-p2p"
        reason = "P2P read not OK for %s" % ", ".join(blocked)
    else:
        cls = _LINK_CLASS[worst]
        kinds = sorted(set(pairs[k]["link"] for k in worst_pairs))
        if cls == "nvlink":
            reason = "every pair is linked by NVLink (%s)" % ", ".join(kinds)
        else:
            shown = ", ".join(worst_pairs[:4])
            if len(worst_pairs) > 4:
                shown += " and %d more pairs" % (len(worst_pairs) - 4)
            reason = "worst link %s on %s" % ("/".join(kinds), shown)
    return {"class": cls, "reason": reason, "evidence": evidence, "pairs": pairs}


def p2p_risks(topology_class, iommu=None, acs=None, uvm_hmm_disabled=None):
    """Host settings known to make PCIe P2P hang or crawl. List of str.

    IOMMU translation and ACS source validation (``lspci -vvv``: ``ACSCtl: SrcValid+``) send
    peer-to-peer traffic up through the root complex, which hangs or slows all-reduce on
    PCIe boxes (seen on PCIe Blackwell); nvidia_uvm's HMM is a further known cause
    (``options nvidia_uvm uvm_disable_hmm=1`` fixes it). The fixes are BIOS/kernel settings:
    they are reported here, never changed.

    Only PCIe classes are at risk: NVLink peers do not route through the root complex.
    """
    if topology_class not in ("pcie-switch", "pcie-host-bridge", "cross-numa"):
        return []
    risks = []
    if acs and acs.get("redirecting"):
        risks.append("ACS SrcValid+ on %s: P2P requests are redirected through the root "
                     "complex (disable ACS with setpci after each boot, or in the BIOS)"
                     % ", ".join(d or "?" for d in acs["src_valid_devices"]))
    if acs is not None and not acs.get("lspci_available", True):
        risks.append("lspci not installed: ACS state unknown")
    if iommu and iommu.get("mode") in ("on", "default") and (iommu.get("groups") or 0) > 0:
        risks.append("IOMMU active (mode %s, %s groups): P2P DMA is translated; iommu=pt or "
                     "iommu=off (amd_iommu=off / intel_iommu=off) on the kernel command line "
                     "avoids it" % (iommu["mode"], iommu["groups"]))
    if uvm_hmm_disabled is False:
        risks.append("nvidia_uvm uvm_disable_hmm=N: HMM on (options nvidia_uvm "
                     "uvm_disable_hmm=1 is the known workaround for P2P hangs)")
    return risks


# --------------------------------------------------------------------------- facts
def build_facts(outputs, gpus=None):
    """gpu_facts from raw command outputs; every value None/absent means "not available".

    outputs keys: query_gpu (the --query-gpu CSV), nvidia_smi (plain `nvidia-smi`), topo_m,
    topo_p2p_r, topo_p2p_n, nvidia_smi_error (why nvidia-smi gave nothing), cmdline,
    iommu_groups (a count), lspci (`lspci -vvv`; None = lspci not installed), uvm_disable_hmm,
    nvrm_version (/proc/driver/nvidia/version), modinfo (`modinfo nvidia`).
    gpus: GPU indices whose set is classified (default all).
    """
    o = outputs
    iommu = parse_iommu_cmdline(o.get("cmdline"), o.get("iommu_groups"))
    lspci = o.get("lspci")
    acs = summarise_acs(parse_lspci_acs(lspci) if lspci else [], lspci_available=lspci is not None)
    uvm = parse_uvm_disable_hmm(o.get("uvm_disable_hmm"))
    module = parse_kernel_module(o.get("nvrm_version"), o.get("modinfo"))
    gpu_list = parse_query_gpu(o["query_gpu"]) if o.get("query_gpu") is not None else []
    facts = {
        "present": bool(gpu_list),
        "count": len(gpu_list),
        "gpus": gpu_list,
        "driver_version": gpu_list[0]["driver_version"] if gpu_list
        else parse_nvrm_driver_version(o.get("nvrm_version")),
        "cuda_version": parse_cuda_version(o["nvidia_smi"]) if gpu_list and o.get("nvidia_smi")
        else None,
        "nvidia_smi_error": o.get("nvidia_smi_error"),
        "iommu": iommu,
        "acs": acs,
        "uvm_hmm_disabled": uvm,
        "kernel_module": module,
        "topology": {"class": None, "reason": None, "matrix": None, "p2p": None,
                     "p2p_nvlink": None, "evidence": [], "risks": []},
    }
    if not gpu_list:
        facts["topology"]["reason"] = "no GPU"
        return facts
    topo = facts["topology"]
    if not o.get("topo_m"):
        topo["reason"] = "nvidia-smi topo -m gave no output"
        return facts
    matrix = parse_topo_matrix(o["topo_m"])
    p2p = parse_topo_p2p(o["topo_p2p_r"], "r") if o.get("topo_p2p_r") else None
    if o.get("topo_p2p_n"):
        topo["p2p_nvlink"] = parse_topo_p2p(o["topo_p2p_n"], "n")
    result = classify(matrix, p2p, gpus)
    topo.update({"class": result["class"], "reason": result["reason"], "matrix": matrix,
                 "p2p": p2p, "evidence": result["evidence"]})
    topo["risks"] = p2p_risks(result["class"], iommu, acs, uvm)
    return facts
