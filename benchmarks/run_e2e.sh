#!/usr/bin/env bash
# One device command of the whole-step benchmark (benchmarks/e2e.py) on a CUDA machine without network:
# installs the peers' wheels from $WHEELS (default .whl) into /tmp/site, runs e2e.py with the arguments given
# under a time limit (E2E_LIMIT seconds, default 500: e2e.py starts no step that would end after it, and
# `timeout` stops it 60 s later), and writes <stem>.json/.md/.png and <stem>.log into $OUT (default ./e2e-out).
#   OUT=dir WHEELS=.whl bash benchmarks/run_e2e.sh --models qwen2.5-7b --stem e2e_7b
# Run it more than once in one command for parts with their own limits and arguments, then merge the parts:
#   python3 benchmarks/e2e.py --merge dir/e2e_7b.json dir/e2e_small.json --out benchmarks/results
set -u
OUT=${OUT:-$PWD/e2e-out}
WHEELS=${WHEELS:-.whl}
LIMIT=${E2E_LIMIT:-500}
mkdir -p "$OUT"
if ls "$WHEELS"/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.e2e-installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl && touch /tmp/site/.e2e-installed
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# fewer out-of-memory failures from fragmentation at the longest lengths (every method runs under the same
# setting; e2e.py records it)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export FUSED_LCE_COMMIT=${FUSED_LCE_COMMIT:-unknown}
stem=e2e
prev=
for a in "$@"; do [ "$prev" = --stem ] && stem=$a; prev=$a; done
nvidia-smi --query-gpu=name,memory.total,clocks.sm,temperature.gpu --format=csv,noheader 2>/dev/null
t0=$(date +%s)
timeout $((LIMIT + 60)) python3 benchmarks/e2e.py --time-limit "$LIMIT" --out "$OUT" "$@" \
    > "$OUT/$stem.log" 2>&1
echo "e2e.py exit $? after $(( $(date +%s) - t0 )) s"
grep '^\[e2e\]' "$OUT/$stem.log" | cut -c1-400
grep -v '^\[e2e\]' "$OUT/$stem.log" | grep -E 'Error|Traceback' | sort | uniq -c | head -20
