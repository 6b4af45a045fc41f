#!/usr/bin/env bash
# One GPU session for the decoder (issue 7), about 8 minutes: the decoder's checks under the gpu
# profile with their audit (op `decoder` in tests/test_ops.py, its mutants, tests/test_decoder.py),
# then the speed benchmark against transformers. Everything lands in $OUT.
#   OUT=/tmp/out bash scripts/gpu_decoder.sh [extra pytest args]
#   WHEELS=DIR: install transformers, tokenizers and safetensors from wheels in DIR first, if they
#   are missing (the GPU machine reaches no package index). SKIP_SUITE=1 / SKIP_BENCH=1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kernelcheck-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
if ! python3 -c "import transformers, tokenizers, safetensors" 2>/dev/null; then
  if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install --quiet --no-index --find-links "$WHEELS" transformers tokenizers safetensors 2>&1 | tail -5
  fi
fi
if ! python3 -c "import transformers, tokenizers, safetensors"; then
  echo "transformers, tokenizers and safetensors are needed (the oracle and the checkpoints): install them, or give WHEELS=DIR"
  exit 3
fi
python3 -c "import torch, triton, transformers, tokenizers, safetensors, hypothesis; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, 'hypothesis', hypothesis.__version__)" | tee -a "$OUT/device.txt"
if [ "${SKIP_SUITE:-0}" != 1 ]; then
  start=$(date +%s)
  # -p timeout where the image has pytest-timeout (gpu_session.sh relies on it too).
  timeout "${SUITE_TIMEOUT:-250}" python3 -m pytest -n "${WORKERS:-4}" -q -p no:cacheprovider \
      -p timeout --timeout="${TEST_TIMEOUT:-200}" \
      tests/test_ops.py tests/test_mutants.py tests/test_decoder.py --op decoder \
      --audit-json "$OUT/audit_decoder.json" "$@" > "$OUT/pytest_decoder.log" 2>&1
  echo "pytest exit $? after $(( $(date +%s) - start )) s"
  grep -E "^(FAILED|ERROR)|FAILED on|Error|passed|failed" "$OUT/pytest_decoder.log" | cut -c1-300 | tail -40
  sed -n '/kernelcheck audit/,$p' "$OUT/pytest_decoder.log" | head -60
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$(date +%s)
  timeout "${BENCH_TIMEOUT:-270}" python3 bench/bench_decoder.py --out "$OUT" > "$OUT/bench_decoder.log" 2>&1
  echo "bench decoder exit $? after $(( $(date +%s) - start )) s"
  tail -15 "$OUT/bench_decoder.log"
fi
