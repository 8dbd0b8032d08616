"""Runs every benchmark of bench/ in turn (make bench)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = sorted(f for f in os.listdir(HERE) if f.startswith("bench_") and f.endswith(".py"))

failed = 0
for name in BENCHES:
    print(f"\n### {name}", flush=True)
    failed |= subprocess.run([sys.executable, os.path.join(HERE, name)], cwd=HERE).returncode != 0
sys.exit(1 if failed else 0)
