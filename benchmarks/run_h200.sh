#!/usr/bin/env bash
# One device session on the H200: the CUDA tests and the benchmarks of benchmarks/NOTES-gpu.md, each stage under its
# own time limit, logs and results into $OUT (default ./h200-out). The peers (cut-cross-entropy, liger-kernel, trl)
# come as wheels in $WHEELS (default ../.whl), installed into /tmp/site.
#   bash benchmarks/run_h200.sh tests probe ce lp      # stages, in this order
set -u
OUT=${OUT:-$PWD/h200-out}
WHEELS=${WHEELS:-../.whl}
mkdir -p "$OUT"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FUSED_LCE_COMMIT=${FUSED_LCE_COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
for stage in "$@"; do
    t0=$(date +%s)
    case $stage in
        tests) timeout 150 python3 -m pytest -m cuda -q -n 8 -p no:cacheprovider tests/test_triton_cuda.py \
                   > "$OUT/gpu_cuda_tests.log" 2>&1; tail -3 "$OUT/gpu_cuda_tests.log" ;;
        alltests) timeout 200 python3 -m pytest -m cuda -q -n 8 -p no:cacheprovider tests/ \
                   > "$OUT/gpu_cuda_tests.log" 2>&1; tail -3 "$OUT/gpu_cuda_tests.log" ;;
        probe) timeout 130 python3 benchmarks/gpu.py --out "$OUT/probe" --probe --shapes 0 \
                   --methods fused_lce,fused_lce_all_rows,cce_torch_compile --profile > "$OUT/probe.log" 2>&1
               grep -E "PROBE|fused_lce|cce" "$OUT/probe.log" | cut -c1-220 ;;
        ce) timeout ${CE_LIMIT:-300} python3 benchmarks/gpu.py --out "$OUT" --profile ${CE_ARGS:-} \
                   > "$OUT/ce.log" 2>&1; grep -E "ms \(|error|Error" "$OUT/ce.log" | cut -c1-200 ;;
        lp) timeout ${LP_LIMIT:-300} python3 benchmarks/logprobs.py --device cuda --dtype bfloat16 --temperature 1 \
                   --reps 5 --out "$OUT" --name logprobs_h200 ${LP_ARGS:-} > "$OUT/lp.log" 2>&1
            grep -E '"ms"|error' "$OUT/lp.log" | cut -c1-200 ;;
        *) echo "unknown stage $stage" ;;
    esac
    echo "== stage $stage: rc $? in $(( $(date +%s) - t0 )) s"
done
