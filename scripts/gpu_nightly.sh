#!/usr/bin/env bash
# Nightly fuzzing on a GPU in one device call: the random op tests under the nightly profile
# (GPU-size shapes), in rounds with fresh seeds, for SECONDS (default 540: a call is limited to
# 600 s), 16 xdist workers, after the pinned catalogue under compute-sanitizer's memcheck and a
# sample of kernel mutants under the gpu profile. Eight files land in $OUT: findings.md,
# findings.json, audit.json.gz, hypothesis-db.tar.gz (the example database), nightly.log (the
# memcheck and mutation summaries first), device.txt, memcheck.json and mutation.json.
#   OUT=/tmp/out bash scripts/gpu_nightly.sh [SECONDS] [extra pytest args, e.g. --op flash_attention]
#   RESUME=results/nightly OUT=... bash scripts/gpu_nightly.sh   # a second call: appends to the first's findings
#   (WORKERS, default 16; ROUND_SECONDS, default a third of SECONDS)
# Exit status: the nightly command's (0 nothing found, 1 a failure found, 2 a round could not run).
set -uo pipefail
OUT=${OUT:-/tmp/kernelcheck-nightly}
BUDGET=${1:-540}
[ $# -gt 0 ] && shift
mkdir -p "$OUT"
: > "$OUT/nightly.log"
rm -rf /tmp/kernelcheck-nightly-rounds        # a warm machine may hold an earlier call's rounds
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton, numpy, hypothesis, xdist; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'hypothesis', hypothesis.__version__, 'xdist', xdist.__version__)" | tee -a "$OUT/device.txt"
# First the pinned catalogue of every op under compute-sanitizer's memcheck (harness/sanitize.py,
# docs/memory-safety.md): its report is $OUT/memcheck.json, and the fuzzing gets what time is left.
# MEMCHECK=0 skips it.
memcheck_status=0
if [ "${MEMCHECK:-1}" != 0 ]; then
  start=$(date +%s)
  python3 -m harness.sanitize --tool memcheck --out /tmp/kernelcheck-memcheck --jobs "${WORKERS:-16}" --timeout 240 \
      2>&1 | tee -a "$OUT/nightly.log"
  memcheck_status=${PIPESTATUS[0]}
  python3 - "$OUT/memcheck.json" <<'PY'
import json, sys
report = json.load(open("/tmp/kernelcheck-memcheck/memcheck.json"))
for shard in report["shards"]:
    shard["tail"] = shard["tail"][-400:]      # the per-shard logs stay on the machine
json.dump(report, open(sys.argv[1], "w"), indent=1)
PY
  BUDGET=$(( BUDGET - ($(date +%s) - start) ))
fi
# Then MUTANTS (default 6) mutants drawn from every kernel file with tonight's date as the seed,
# each judged by its ops' tests under the gpu profile (harness/mutate.py, docs/mutation.md): the
# suite's detection power on the GPU, night after night. Track it with
#   python -m harness.mutation_report --history results/mutation/history.jsonl --add mutation.json
# MUTANTS=0 skips it.
if [ "${MUTANTS:-6}" != 0 ]; then
  start=$(date +%s)
  # --skip-clean: the fuzzing below judges the unmutated tree (one op's whole battery compiles for
  # minutes in one process: fp8_matmul 325 s on the H200); an op run past 120 s counts as a
  # timeout, not a kill (results/mutation/README.md: what a sample costs).
  python3 -m harness.mutate --backend gpu --sample "${MUTANTS:-6}" --seed "$(date +%Y%m%d)" --jobs 8 \
      --skip-clean --timeout 120 --deadline 10 --json "$OUT/mutation.json" 2>&1 | grep -v '^\[' | tee -a "$OUT/nightly.log"
  BUDGET=$(( BUDGET - ($(date +%s) - start) ))
fi
args=(--seconds "$BUDGET" --out "$OUT" --work /tmp/kernelcheck-nightly-rounds --db /tmp/kernelcheck-nightly-db
      --workers "${WORKERS:-16}" --compress-audit)
[ -n "${ROUND_SECONDS:-}" ] && args+=(--round-seconds "$ROUND_SECONDS")
[ -n "${RESUME:-}" ] && args+=(--resume "$RESUME")
# The rounds' own files (per-round audits and logs, the database directory) stay outside $OUT:
# only 8 files come back from a call. A failing round's log tail is in nightly.log.
python3 -m harness.nightly "${args[@]}" -- -p no:benchmark "$@" 2>&1 | tee -a "$OUT/nightly.log"
status=${PIPESTATUS[0]}
for log in /tmp/kernelcheck-nightly-rounds/round*/pytest.log; do
  # the failure reports of rounds that found something (their text, not only the summary)
  if grep -q "^FAILED\|^ERROR" "$log" 2>/dev/null; then
    echo "=== $log" >> "$OUT/nightly.log"
    sed -n '/= FAILURES =/,/short test summary/p' "$log" | cut -c1-400 | head -300 >> "$OUT/nightly.log"
  fi
done
ls -la "$OUT"
[ "$memcheck_status" != 0 ] && [ "$status" = 0 ] && status=1     # a memcheck error is a finding too
exit "$status"
