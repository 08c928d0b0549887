#!/usr/bin/env bash
# Every GPU measurement of the project in one go, each step under its own time limit, its full log
# and JSON figures written to OUTDIR, the last lines of each log printed:
#
#     [BUDGET_S=780] bash bench/gpu_all.sh OUTDIR [STEP ...]
#
# Steps (default: all, in this order): env attention kvformats align fp4 dispatch kernels warm hostfloor
# engine throughput moe. The kernel benchmarks come first: they compile what they time before timing it,
# and they are what a short loan of a GPU is for. The warm step fills the cache (every shipped spec
# and both engine configs) before the engine steps, which then serve with --jit-policy error. A
# failing step prints its exit status and the run goes on. With BUDGET_S, the whole run stays
# within that many seconds: each step's limit is cut to what is left, and a step with less than 15 s
# left is skipped with a line saying so.
set -u
out=${1:?usage: bash bench/gpu_all.sh OUTDIR [STEP ...]}
shift
mkdir -p "$out"
bench=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env attention kvformats align fp4 dispatch kernels warm hostfloor engine throughput moe)
export PYTHONUNBUFFERED=1

run() {  # run NAME LIMIT_S CMD...: log to OUTDIR/NAME.log, print its tail and status
    local name=$1 limit=$2
    shift 2
    if [ -n "${BUDGET_S:-}" ]; then
        local left=$((BUDGET_S - SECONDS))
        if [ "$left" -lt 15 ]; then
            echo "== $name: skipped, ${left} s of BUDGET_S=$BUDGET_S left"
            return
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc, $((SECONDS - start)) s"
    tail -n "${TAIL:-25}" "$out/$name.log"
}

for step in "${steps[@]}"; do
    case $step in
    env)
        run env 60 bash -c "nvidia-smi; $py -c 'import sys, torch, triton; print(sys.version); \
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'; \
$py -m tritonwarm env --json -o '$out/env.json'" ;;
    warm)
        run warm 240 $py -m tritonwarm warmup "$bench/../warmup_specs" --target local -j "$(nproc)"
        for config in tiny deepseek-v2-lite; do
            run "warm_$config" 180 $py -m tritonwarm warmup --engine-config "$config" --target local -j "$(nproc)"
        done
        run check 120 $py -m tritonwarm check "$bench/../warmup_specs" --target local ;;
    kernels)
        run kernels 240 $py "$bench/kernels.py" --json "$out/kernels.json" ${KERNELS_FLAGS:-} ;;
    attention)
        run attention 120 $py "$bench/attention_tiles.py" --json "$out/attention.json" ;;
    kvformats)  # MLA decode and cache write per KV cache format, then the quantized decode's tile table
        run kvformats 240 $py "$bench/kv_formats.py" --tiles "${KVFORMATS_TILES:-3}" \
            --budget "${KVFORMATS_BUDGET:-90}" --json "$out/kv_formats.json" ;;
    hostfloor)  # each launcher at batch 1 without metadata: host cost over its kernels' time (after warm:
        # its kernels come from the cache)
        run hostfloor 120 $py "$bench/host_floor.py" --json "$out/host_floor.json" ;;
    fp4)
        run fp4 90 $py "$bench/fp4_variants.py" --json "$out/fp4.json" ;;
    align)
        run align 90 $py "$bench/moe_align_variants.py" --json "$out/align.json" ;;
    moe)
        run moe 150 $py "$bench/fused_moe_tiles.py" --sweep "${MOE_SWEEP:-small}" --json "$out/moe.json" \
            --emit-tables "$out/moe_tables" ;;
    dispatch)
        run dispatch 120 $py "$bench/dispatch.py" --gpu --calls 5000 --repeat 3 --json "$out/dispatch.json" ;;
    engine)
        for config in ${ENGINE_CONFIGS:-tiny deepseek-v2-lite}; do
            run "engine_$config" 300 $py "$bench/engine_modes.py" --config "$config" --requests 4 \
                --max-tokens 8 --jit-policy "${JIT_POLICY:-error}" --json "$out/engine_$config.json"
        done ;;
    throughput)
        run throughput 300 $py "$bench/engine_throughput.py" ${THROUGHPUT_FLAGS:---concurrency 1,16,64 --max-tokens 16} \
            --json "$out/throughput.json" ;;
    *)
        echo "unknown step $step" ;;
    esac
done
