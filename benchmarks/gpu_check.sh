#!/bin/sh
# The GPU session's one command: NCCL correctness on one GPU, then the benchmark tables (issue #10).
#
#   sh benchmarks/gpu_check.sh            (from anywhere; runs in the repository root)
#
# Needs on the machine: one CUDA GPU, python3 with torch, cupy (cupy.cuda.nccl), numpy, networkx, pyyaml;
# no mpiexec (ranks meet through a FileStore), no ortools/pulp (nothing here compiles with a solver), no
# pytest.  The emulated clusters need root and iproute2; where `tc` is missing, carry Debian's iproute2 in
# .ipr (ignored by git): fetch it on a machine with apt and a network, in the repository root, and pass
# carry=[".ipr"] with the device call that runs this script:
#
#   mkdir -p .ipr && (cd .ipr && apt-get download iproute2 libmnl0 libbpf1 libelf1 libcap2 libxtables12 \
#     libtirpc3 libbsd0 libdb5.3 libtirpc-common libmd0 libcap2-bin)
#
# This script unpacks them into /tmp/ipr (never into /).
#
# The ranks share the one GPU, so it starts CUDA's Multi-Process Service (nvidia-cuda-mps-control, part of
# the driver) unless one runs already or TOPOCC_NO_MPS=1: without it the GPU time-slices between the
# ranks' processes and every NCCL kernel that waits for a peer holds the GPU for a slice (one group of
# sends and receives took 2.25 ms without MPS, 86 us with it, on the H100 machine), which no cluster of
# one GPU per rank has.  Steps (about 7 minutes on the H200 machine):
#   1. benchmarks/gpu_bench.py --probe --profile: CuPy's NCCL vs torch's batch_isend_irecv per group, then
#      topocc vs NCCL all-reduce at 1, 16, 64, 256 MiB: plain (4 ranks, loopback), emu-uniform, emu-racks,
#      each size with where one call's time went (enqueueing, inside and between NCCL groups);
#   2. tests/runtime/mpi_scripts/nccl_check.py suite --jobs 3: every collective x float32/bfloat16/float16/
#      int32 x every op on 2, 3 and 4 ranks sharing the GPU (odd sizes, smallest and default groups),
#      async_op, NCCL's own allreduce on the same data, the planner's algorithms, the DDP hook against
#      plain DDP, a hung and a dead peer named in one line within the timeout (last: they kill ranks);
#   3. benchmarks/train_gpu.py: a transformer trained with plain DDP, the DDP hook, Prophet's blocks and DASO on
#      emu-racks and emu-uniform (TRAIN_ARGS overrides its options), a table and a plot of loss over time.
#   4. the topocc torch.distributed backend over NCCL: tests/runtime/distributed/training_job.py, DDP and FSDP2
#      for 20 steps on 4 ranks sharing the GPU (torchrun), against the same job on an NCCL group; needs the
#      bundle compiled beforehand where the planner's solvers are (the device has none):
#        .venv/bin/topocc bundle 'emu-uniform[0-3]' -o out/gpu-bundle -s 256:4MiB   # then carry out/gpu-bundle
# With arguments, runs them instead of the steps, under the same set-up (iproute2, MPS), e.g.
#   sh benchmarks/gpu_check.sh python3 benchmarks/gpu_bench.py --configs plain --group-bytes 2097152
# Override with GPU_BENCH_ARGS (default "--budget 1 --max-iters 4", so that the whole check fits one 10-minute
# device call; e.g. GPU_BENCH_ARGS="--sizes 1 16 64 --scale 0.02").  Exit status: 0 only
# if every check passed and every configuration ran.
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
# the device runs a copy of the tree, not an installed package: every step's processes import it from here
PYTHONPATH=$(pwd)${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH

if ! command -v tc >/dev/null 2>&1 && [ -d .ipr ]; then
    mkdir -p /tmp/ipr
    for f in .ipr/*.deb; do dpkg -x "$f" /tmp/ipr; done
    PATH=/tmp/ipr/sbin:/tmp/ipr/bin:/tmp/ipr/usr/sbin:/tmp/ipr/usr/bin:$PATH
    LD_LIBRARY_PATH=/tmp/ipr/lib/x86_64-linux-gnu:/tmp/ipr/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH LD_LIBRARY_PATH
fi

MPS=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
if [ -z "${TOPOCC_NO_MPS:-}" ] && [ -n "$MPS" ] && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/topocc-mps.XXXXXX)
    CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY
    export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    if "$MPS" -d; then
        trap 'echo quit | timeout 20 "$MPS"; rm -rf "$CUDA_MPS_PIPE_DIRECTORY"' EXIT  # quit waits for clients
        echo "MPS: started ($MPS, pipes in $CUDA_MPS_PIPE_DIRECTORY)"
    else
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        echo "MPS: could not start; the ranks time-slice the GPU (slow groups)"
    fi
fi

echo "== machine"
"$PY" - <<'EOF'
import os, torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.device_count()} GPU(s):",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none", f"{os.cpu_count()} cores")
try:
    import cupy
    from cupy.cuda import nccl
    print(f"cupy {cupy.__version__}, NCCL {nccl.get_version()} (runtime), torch's NCCL {torch.cuda.nccl.version()}")
except Exception as exc:
    print(f"cupy.cuda.nccl unavailable: {exc}")
EOF
command -v tc >/dev/null 2>&1 && echo "iproute2: $(command -v tc)" || echo "iproute2: missing (the emulated configurations will fail)"

if [ $# -gt 0 ]; then
    echo "== $*"
    "$@"
    exit $?
fi

status=0
echo "== 1. benchmark (benchmarks/gpu_bench.py)"
start=$(date +%s)
# shellcheck disable=SC2086
timeout 180 "$PY" benchmarks/gpu_bench.py --probe --profile --json "${OUT:-/tmp}/gpu_bench.json" \
    ${GPU_BENCH_ARGS:---budget 1 --max-iters 4} || status=1
echo "(benchmark: $(( $(date +%s) - start )) s; rows in ${OUT:-/tmp}/gpu_bench.json)"
echo "== 2. correctness (tests/runtime/mpi_scripts/nccl_check.py suite --jobs 3)"
start=$(date +%s)
timeout 150 "$PY" tests/runtime/mpi_scripts/nccl_check.py suite --jobs 3 || status=1
echo "(correctness: $(( $(date +%s) - start )) s)"

echo "== 3. training (benchmarks/train_gpu.py)"
start=$(date +%s)
# shellcheck disable=SC2086
timeout 260 "$PY" benchmarks/train_gpu.py --time-limit 245 --plot "${OUT:-/tmp}/train_loss.svg" --json "${OUT:-/tmp}/train.json" \
    ${TRAIN_ARGS:-} || status=1
echo "(training: $(( $(date +%s) - start )) s; plot in ${OUT:-/tmp}/train_loss.svg)"

echo "== 4. the topocc process group over NCCL (tests/runtime/distributed/training_job.py)"
BUNDLE=${TOPOCC_GPU_BUNDLE:-out/gpu-bundle}
if [ -f "$BUNDLE/bundle.json" ]; then
    for mode in ddp fsdp; do
        TOPOCC_PLAN=$BUNDLE timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node 4 \
            tests/runtime/distributed/training_job.py "$mode" 20 cuda >"${OUT:-/tmp}/backend_$mode.txt" 2>&1
        "$PY" - "${OUT:-/tmp}/backend_$mode.txt" "$mode" <<'PYEOF' || status=1
import json, sys
lines = [line for line in open(sys.argv[1]) if line.startswith("RESULT ")]
if not lines:
    sys.exit(f"{sys.argv[2]}: no result; see {sys.argv[1]}")
r = json.loads(lines[-1][len("RESULT "):])
worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["topocc"], r["native"]))
print(f"{sys.argv[2]}: 20 steps, losses within {worst:.1e} of NCCL's, parameters within {r['param_diff']:.1e};"
      f" counters {json.dumps(r['counters'])}")
sys.exit(0 if worst < 1e-4 and r["param_diff"] < 1e-4 else 1)
PYEOF
    done
else
    echo "no bundle at $BUNDLE: compile it where the solvers are and carry it (see the header)"
    status=1
fi

echo "== gpu_check: $( [ $status = 0 ] && echo ok || echo FAILED )"
exit $status
