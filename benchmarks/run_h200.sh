#!/usr/bin/env bash
# One device session on the H200: the CUDA tests and the GPU benchmarks, each stage under its own time limit, logs
# and results into $OUT (default ./h200-out). The peers (cut-cross-entropy, liger-kernel, trl) come as wheels in
# $WHEELS (default ../.whl), installed into /tmp/site.
#   bash benchmarks/run_h200.sh probe ce lp graph alltests pack      # stages, in this order
# "doctor" writes `fused-lce doctor --json` (the first-use self-checks forced, their cost) to $OUT/doctor.json.
# "e2e" runs benchmarks/e2e.py (a whole Qwen training step, stock vs fused_lce vs the peers) with $E2E_ARGS under
# E2E_LIMIT seconds (default 500: it starts no step that would end after it); run it once per part with its own
# --stem, then merge the parts here: python3 benchmarks/e2e.py --merge a.json b.json
# "graph" times gpu.py's CUDA-graph methods beside the default and the peers on GRAPH_SHAPES (indices into SHAPES).
# "pack" (last) packs everything under $OUT into results.tgz in pieces of 15 MiB: the device tool brings back at most
# 8 files of 16 MiB each, and a stage writes more files than that (JSON, markdown, plots, profiles, logs).
# "probe" times the GEMM tile configurations of FUSED_LCE_PROBE_CONFIGS and exports the fastest (EXP + STATS + DZ
# epilogues summed over FUSED_LCE_PROBE_SHAPES) as FUSED_LCE_GEMM_CONFIG for the stages after it.
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
        tests) timeout ${TEST_LIMIT:-150} python3 -m pytest -m cuda -q -n 8 -p no:cacheprovider \
                   tests/backends/test_triton.py > "$OUT/gpu_cuda_tests.log" 2>&1; tail -4 "$OUT/gpu_cuda_tests.log" ;;
        alltests) timeout ${TEST_LIMIT:-330} python3 -m pytest -m cuda -v -n 8 -p no:cacheprovider --durations=25 \
                   tests/ > "$OUT/gpu_cuda_tests.log" 2>&1; tail -4 "$OUT/gpu_cuda_tests.log" ;;
        probe) timeout ${PROBE_LIMIT:-130} python3 benchmarks/gpu.py --out "$OUT/probe" --probe --shapes 0 \
                   --methods fused_lce --reps 2 > "$OUT/probe.log" 2>&1
               grep -E "^PROBE [0-9]|error" "$OUT/probe.log" | cut -c1-160
               best=$(python3 -c "
import json, sys
p = json.load(open('$OUT/probe/gpu.json'))['probe']['gemm']
tot = {}
for row in p:
    for c in row.get('configs', []):
        if 'error' not in c:
            tot.setdefault(c['cfg'], []).append(c['exp_ms'] + c['stats_ms'] + c['dz_ms'])
ok = {k: sum(v) for k, v in tot.items() if len(v) == len(p)}
print(min(ok, key=ok.get) if ok else '')" 2>/dev/null)
               if [ -n "$best" ]; then export FUSED_LCE_GEMM_CONFIG=$best; fi
               echo "GEMM config for the next stages: ${FUSED_LCE_GEMM_CONFIG:-default}" ;;
        ce) timeout ${CE_LIMIT:-300} python3 benchmarks/gpu.py --out "$OUT" --profile --steady ${CE_STEADY:-5} \
                   ${CE_ARGS:-} \
                   > "$OUT/ce.log" 2>&1; grep -E "ms \(|rror" "$OUT/ce.log" | cut -c1-150 ;;
        graph) timeout ${GRAPH_LIMIT:-200} python3 benchmarks/gpu.py --out "$OUT/graph" --shapes ${GRAPH_SHAPES:-8,4} \
                   --methods fused_lce,fused_lce_graph,cce_torch_compile,torch_eager,torch_eager_graph \
                   > "$OUT/graph.log" 2>&1; grep -E "ms \(|rror" "$OUT/graph.log" | cut -c1-150 ;;
        lp) timeout ${LP_LIMIT:-300} python3 benchmarks/logprobs.py --device cuda --dtype bfloat16 --temperature 1 \
                   --reps ${LP_REPS:-9} --out "$OUT" ${LP_ARGS:-} > "$OUT/lp.log" 2>&1
            python3 -c "
import json
for r in json.load(open('$OUT/logprobs.json'))['results']:
    print(r['shape'], r['method'], round(r['ms'], 2) if 'ms' in r else r.get('error', '')[:100],
          round(r['x_floor'], 3) if 'x_floor' in r else '')" 2>&1 | tail -120 ;;
        doctor) FUSED_LCE_CACHE_DIR=/tmp/fused_lce_doctor timeout ${DOCTOR_LIMIT:-120} python3 -m fused_lce.tools.cli \
                    doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.log"; echo "doctor exit $?" ;;
        e2e) E2E_LIMIT=${E2E_LIMIT:-500}
             # fewer out-of-memory failures from fragmentation at the longest lengths (e2e.py records the setting)
             PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} timeout $((E2E_LIMIT + 60)) \
                 python3 benchmarks/e2e.py --time-limit "$E2E_LIMIT" --out "$OUT" ${E2E_ARGS:-} > "$OUT/e2e.log" 2>&1
             echo "e2e.py exit $?"; grep '^\[e2e\]' "$OUT/e2e.log" | cut -c1-300
             grep -v '^\[e2e\]' "$OUT/e2e.log" | grep -E 'Error|Traceback' | sort | uniq -c | head -10 ;;
        pack) tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* \
                  && split -b 15M -d /tmp/results.tgz "$OUT/results.tgz." && ls -l "$OUT" ;;
        *) echo "unknown stage $stage" ;;
    esac
    echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
