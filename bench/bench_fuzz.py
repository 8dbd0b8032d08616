"""The trace-directory fuzz test with many more seeds than `make test` runs
(tests/test_fuzz_trace_dirs.py): FUZZ_SEEDS (default 1000)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

seeds = os.environ.get("FUZZ_SEEDS", "1000")
print(f"fuzzing trace directories with {seeds} seeds", flush=True)
result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "tests/test_fuzz_trace_dirs.py"],
                        cwd=ROOT, env=dict(os.environ, FUZZ_SEEDS=seeds))
sys.exit(result.returncode)
