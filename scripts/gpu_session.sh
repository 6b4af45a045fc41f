#!/usr/bin/env bash
# One GPU session in one command (device time is scarce): versions, the suite under the gpu
# profile with its audit, then the benchmark. Everything lands in $OUT.
#   OUT=/tmp/out bash scripts/gpu_session.sh [extra pytest args]
#   (SKIP_SUITE=1, EXPLORE="rowops rope attention", BENCHES="foundation attention adamw" or BENCHES= for none,
#    WORKERS (default auto), SUITE_TIMEOUT, TEST_TIMEOUT, KERNELCHECK_COMPILE_LOG: a compile log,
#    summarised and compressed with the audit at the end)
set -uo pipefail
OUT=${OUT:-/tmp/kernelcheck-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton, numpy, hypothesis, xdist; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'hypothesis', hypothesis.__version__, 'xdist', xdist.__version__)" | tee -a "$OUT/device.txt"
if [ "${SKIP_SUITE:-0}" != 1 ]; then
  # GPU utilisation once a second while the suite runs (the suite is CPU-bound: it shows).
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 1000 \
      > "$OUT/utilisation.txt" 2>&1 &
  smi=$!
  start=$(date +%s)
  export KERNELCHECK_FAILURES_LOG=${KERNELCHECK_FAILURES_LOG:-$OUT/failures.txt}
  # pytest-timeout (on the GPU image) is a safety net only: no test should come near it.
  timeout "${SUITE_TIMEOUT:-570}" python3 -m pytest -n "${WORKERS:-auto}" -q -p no:cacheprovider \
      -p timeout --timeout="${TEST_TIMEOUT:-120}" -p no:benchmark --durations=30 \
      --audit-json "$OUT/audit_gpu.json" "$@" > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest exit $? after $(( $(date +%s) - start )) s"
  kill "$smi" 2>/dev/null
  awk -F', ' '{u+=$1; n++} END {if (n) printf "GPU utilisation: mean %.1f%% over %d samples\n", u/n, n}' "$OUT/utilisation.txt"
  grep -E "^(FAILED|ERROR)|FAILED on|Error|passed|failed" "$OUT/pytest_gpu.log" | cut -c1-300 | tail -50
  sed -n '/kernelcheck phases/,/top ops/p' "$OUT/pytest_gpu.log"
  grep -E "^[0-9.]+s call" "$OUT/pytest_gpu.log" | head -5
  sed -n '/kernelcheck audit/,$p' "$OUT/pytest_gpu.log" | head -40
  if [ -n "${KERNELCHECK_COMPILE_LOG:-}" ] && [ -f "$KERNELCHECK_COMPILE_LOG" ]; then
    python3 scripts/compile_log_summary.py "$KERNELCHECK_COMPILE_LOG" > "$OUT/compile-summary.txt" 2>&1
    head -3 "$OUT/compile-summary.txt"
  fi
  # The audit (tens of MB) and the compile log come back compressed; harness.audit reads .gz.
  gzip -f "$OUT/audit_gpu.json" 2>/dev/null
  [ -n "${KERNELCHECK_COMPILE_LOG:-}" ] && gzip -f "$KERNELCHECK_COMPILE_LOG" 2>/dev/null
fi
# EXPLORE: which of bench/explore_<name>.py to run (none by default).
for name in ${EXPLORE:-}; do
  timeout 150 python3 "bench/explore_$name.py" 2>&1 | tee "$OUT/explore_$name.log" | tail -20
done
# BENCHES: which of bench/bench_<name>.py to run (default: all of them).
for name in ${BENCHES-foundation attention adamw}; do
  timeout "${BENCH_TIMEOUT:-200}" python3 "bench/bench_$name.py" --out "$OUT" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name exit $?"; tail -30 "$OUT/bench_$name.log"
done
# The device tool brings back at most 8 files: the small ones travel as one archive
# (tar xzf session.tar.gz), the audit and compile log beside it.
( cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.gz' ! -name .small -size -4M -printf '%f\n' | sort > .small \
  && [ -s .small ] && tar czf session.tar.gz -T .small && xargs rm -f < .small; rm -f .small )
ls "$OUT"
