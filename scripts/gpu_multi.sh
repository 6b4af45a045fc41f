#!/usr/bin/env bash
# Issue 8 on a 2-GPU machine (the device tool's nvidia-h200-x2), in one call of at most 540 s:
# the gpu profile on a subset of ops, run twice with the same number of xdist workers (-n auto),
#   A. on one GPU  (--gpus 0), then
#   B. spread over both GPUs (the default: every visible GPU),
# each from a cold Triton cache of its own, each with its audit. Then, if the time is left, C: the
# README's one-GPU configuration (--gpus 0 -n 16). Prints the worker -> GPU mapping of each run, the
# checks and cases per GPU from each audit, whether A and B ran the same checks, and the wall times.
# GPU utilisation is sampled every 2 s during each run. Everything lands in $OUT.
#   OUT=/tmp/out bash scripts/gpu_multi.sh
#   (OPS=..., WORKERS=auto, A_TIMEOUT=280, B_TIMEOUT=200, BUDGET=530: seconds for the whole script)
set -uo pipefail
OUT=${OUT:-/tmp/kernelcheck-multi}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
OPS=${OPS:-rmsnorm,layernorm,add_rmsnorm,rope,rmsnorm_rope,softmax,bias_gelu}
WORKERS=${WORKERS:-auto}
BUDGET=${BUDGET:-530}
T0=$(date +%s)

{ nvidia-smi -L
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import os, torch, triton, hypothesis, xdist; print('torch', torch.__version__, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__, 'xdist', xdist.__version__, 'cpus', len(os.sched_getaffinity(0)))"
  git log -1 --format='commit %h %s' 2>/dev/null
} | tee "$OUT/device.txt"
echo "ops: $OPS" | tee -a "$OUT/device.txt"

# run NAME TIMEOUT PYTEST_ARGS...: one timed pytest call with its own cold Triton cache.
run() {
  local name=$1 limit=$2; shift 2
  export TRITON_CACHE_DIR="/tmp/kc-triton-$name"       # not under $OUT: it would come back with the results
  rm -rf "$TRITON_CACHE_DIR"
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 2 \
      > "$OUT/smi_$name.csv" 2>/dev/null &
  local smi=$!
  local start end rc
  start=$(date +%s.%N)
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -p no:benchmark $PER_TEST \
      --op "$OPS" --audit-json "$OUT/audit_$name.json" "$@" > "$OUT/pytest_$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  local wall
  wall=$(python3 -c "print(f'{$end - $start:.1f}')")
  echo "$name: pytest $* -> exit $rc, wall $wall s" | tee -a "$OUT/times.txt"
  grep -E "^kernelcheck: .*(GPU|workers)" "$OUT/pytest_$name.log" | head -12
  grep -E "^(FAILED|ERROR)|checks per GPU|passed|failed|error" "$OUT/pytest_$name.log" | cut -c1-300 | tail -8
}

# pytest-timeout (on the GPU image) bounds each test, so one slow case cannot eat the call.
PER_TEST=""
python3 -c "import pytest_timeout" 2>/dev/null && PER_TEST="-p timeout --timeout=240"
: > "$OUT/times.txt"
run A_one_gpu "${A_TIMEOUT:-280}" -n "$WORKERS" --gpus 0
run B_two_gpus "${B_TIMEOUT:-200}" -n "$WORKERS"
elapsed=$(( $(date +%s) - T0 ))
a_wall=$(grep '^A_one_gpu' "$OUT/times.txt" | sed 's/.*wall \([0-9.]*\) s/\1/' | cut -d. -f1)
left=$(( BUDGET - elapsed ))
if [ -n "$a_wall" ] && [ $(( a_wall * 12 / 10 + 20 )) -lt "$left" ]; then
  run C_one_gpu_16 "$(( left - 10 ))" -n 16 --gpus 0
else
  echo "C_one_gpu_16: skipped ($left s left of the $BUDGET s budget)" | tee -a "$OUT/times.txt"
fi

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
"""Per-GPU counts from each audit, the same checks in A and B, and the times."""
import json, sys
from collections import Counter, defaultdict
from pathlib import Path

out = Path(sys.argv[1])
keys = {}
for path in sorted(out.glob("audit_*.json")):
    doc = json.loads(path.read_text())
    meta, records = doc["meta"], doc["records"]
    checks, cases = Counter(), defaultdict(set)
    for r in records:
        gpu = r.get("gpu") or {}
        where = f"GPU {gpu.get('index', '?')} ({gpu.get('name', '?')})"
        checks[where] += 1
        cases[where].add(r["case"])
    plan = (meta.get("gpus") or {}).get("workers", {})
    per_gpu_workers = Counter(plan.values())
    print(f"{path.name}: exit {meta['exitstatus']}, {len(records)} checks of {len({r['case'] for r in records})} "
          f"cases, {len(plan)} workers ({', '.join(f'GPU {g}: {n}' for g, n in sorted(per_gpu_workers.items()))})")
    for where in sorted(checks):
        print(f"  {where}: {checks[where]} checks, {len(cases[where])} cases")
    fails = sum(not r["passed"] for r in records if not r.get("gap"))
    print(f"  failing checks: {fails}")
    keys[path.stem] = {(r["test"], r["case"], r["output"]) for r in records}
if "audit_A_one_gpu" in keys and "audit_B_two_gpus" in keys:
    a, b = keys["audit_A_one_gpu"], keys["audit_B_two_gpus"]
    print(f"A and B ran the same checks: {a == b} ({len(a)} vs {len(b)}; {len(a - b)} only in A, {len(b - a)} only in B)")
print((out / "times.txt").read_text().strip())
walls = {}
for line in (out / "times.txt").read_text().splitlines():
    if " wall " in line and "-> exit 0," in line:          # passing runs only
        walls[line.split(":")[0]] = float(line.rsplit("wall ", 1)[1].split()[0])
if "A_one_gpu" in walls and "B_two_gpus" in walls:
    print(f"speed-up of two GPUs over one, same workers: {walls['A_one_gpu'] / walls['B_two_gpus']:.2f}x")
else:
    print("no speed-up: A or B did not pass")
EOF
echo "total $(( $(date +%s) - T0 )) s"
# At most 8 files come back from a device call: the audits, logs and utilisation samples travel
# as one archive beside device.txt, times.txt and summary.txt.
(cd "$OUT" && tar czf runs.tar.gz audit_*.json pytest_*.log smi_*.csv 2>/dev/null \
    && rm -f audit_*.json pytest_*.log smi_*.csv)
ls -la "$OUT"
