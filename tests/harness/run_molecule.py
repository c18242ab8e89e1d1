"""Run every molecule scenario (or those named) one after another; exit non-zero on failure.

    run_molecule.py [SCENARIO ...]
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def scenarios():
    base = os.path.join(ROOT, "molecule")
    return sorted(d for d in os.listdir(base)
                  if os.path.isfile(os.path.join(base, d, "molecule.yml")))


def main(argv):
    names = argv or scenarios()
    failed = []
    for name in names:
        start = time.time()
        print("=== molecule test -s %s" % name, flush=True)
        rc = subprocess.run(["molecule", "test", "-s", name], cwd=ROOT, check=False).returncode
        print("=== scenario %s: %s in %.0f s" % (name, "passed" if rc == 0 else "FAILED",
                                                 time.time() - start), flush=True)
        if rc != 0:
            failed.append(name)
    passed = len(names) - len(failed)
    print("molecule: %d passed, %d failed" % (passed, len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
