#!/usr/bin/env bash
# gpu_session.sh - the real-GPU checks of the process pool and the rest, for a
# lent GPU machine with no network (the device tool), in one or two calls.
#
# Here, with the package registry (once; .whl/ is git-ignored):
#     make gpu-wheels        # pyzmq, cffi, pytest, hypothesis wheels for the GPU
#                            # image's Python (3.12) into .whl/
# There (device tool: carry [".whl"], timeout_s 600), from the repository root,
# in two calls (one call may run 10 minutes; the machine stays warm between):
#     OUT=$OUT bash bench/gpu_session.sh build pool
#     OUT=$OUT bash bench/gpu_session.sh fwd demo vmmapp apis
# Steps, each optional, in this order; everything goes to $OUT (default
# bench/out/gpu): a log per step and session.log with each step's exit code.
#   build   a .venv on the image's python3 (its numpy, scikit-learn, rich,
#           typer, ... via --system-site-packages) plus the carried wheels;
#           then `make native progs` on every core
#   pool    bench/gpu_pool.py: MPS quota curve and VMM same-address probes
#   fwd     bench/forwarding.py --device cuda: forwarding to MPS workers with
#           COLOCATE_MEM=vmm (launch latency, pipelined rate, malloc cost)
#   demo    `colocate demo` on the real GPU (the README's main job)
#   vmmapp  hotspot run locally and forwarded to a 50 % MPS worker with
#           COLOCATE_MEM=vmm through `colocate serve`; the two CHECK lines
#           must be equal and the worker must have run its kernels
#   calib   bench/calibrate.py run: a kernel next to co-runners of each kind
#           at MPS percentages 10..100 (with and without oversubscription),
#           the time slice without MPS, PCIe contention (calib.jsonl); then
#           calibrate.py fit: simgpu's parameters and its error per case
#           (calib_fit.json).  A call of its own: it takes most of 10 minutes
#   apis    the CUDA-API programs (bench/progs/texture, graphs, pools and the
#           driver-API tests/drv/drvcheck) on the GPU: their own checks hold
#           simgpu's reference semantics against the hardware; then under
#           the shim with a controller, whose records (apis_quotas.json)
#           must count what the programs print (graphs: 100 per captured
#           kernel; drvcheck: its launches and bytes)
# Not yet run on a GPU: read session.log first.
set -u
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
JOBS=$(nproc 2>/dev/null || echo 4)
PY=.venv/bin/python
DEV=${DEV:-cuda}          # sim: try the steps that allow it on simgpu
SECS=${SECS:-5}           # how long hotspot runs in the vmmapp step (the
                          # route must land while it runs; its CHECK does not
                          # depend on how many times it repeated)
export PATH=/usr/local/cuda/bin:$PATH

step() {        # step NAME TIMEOUT_S CMD...: run, log, record the exit code
	local name=$1 limit=$2
	shift 2
	local t0=$SECONDS
	# through bash: a step may be one of the functions below (exported)
	timeout "$limit" bash -c '"$@"' _ "$@" >"$OUT/$name.log" 2>&1
	local rc=$?
	echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/session.log"
	return $rc
}

build() {
	python3 -m venv --system-site-packages .venv &&
	$PY -m pip install -q --no-index --find-links .whl setuptools wheel pyzmq cffi pytest hypothesis &&
	$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . &&
	touch .venv/.installed &&
	make -j"$JOBS" native progs
}

vmmapp() {
	# hotspot alone, then again with COLOCATE_MEM=vmm moved to the 50 % worker
	# as soon as it registers (`colocate set-quota`); equal CHECK lines and a
	# nonzero forwarded count say the pool ran its kernels on shared memory
	local rd ref fwd pid n ran
	rd=$(mktemp -d /tmp/cgpu-XXXXXX)
	.venv/bin/colocate serve --runtime-dir "$rd" --device "$DEV" --pool 50:1 --detach || return 1
	trap '.venv/bin/colocate stop --runtime-dir "$rd" >/dev/null 2>&1' EXIT
	ref=$(.venv/bin/colocate run --runtime-dir "$rd" --device "$DEV" --name hotlocal -- \
		bench/bin/hotspot --check --duration "$SECS" | grep '^CHECK')
	COLOCATE_MEM=vmm .venv/bin/colocate run --runtime-dir "$rd" --device "$DEV" --name hotvmm -- \
		bench/bin/hotspot --check --duration "$SECS" >"$rd/hotvmm.out" 2>&1 &
	pid=$!
	for n in $(seq 200); do
		.venv/bin/colocate set-quota --runtime-dir "$rd" hotvmm 50 >/dev/null 2>&1 && break
		sleep 0.05
	done
	wait $pid
	fwd=$(grep '^CHECK' "$rd/hotvmm.out")
	cat "$rd/hotvmm.out"
	.venv/bin/colocate quotas --runtime-dir "$rd" --all || true
	.venv/bin/colocate pool --json --runtime-dir "$rd" | tee "$rd/pool.json" || true
	ran=$(grep -o '"forwarded": [0-9]*' "$rd/pool.json" | grep -o '[0-9]*$' | head -n 1)
	.venv/bin/colocate stop --runtime-dir "$rd"
	cp "$rd"/*.log "$OUT"/ 2>/dev/null
	echo "local:     $ref"
	echo "forwarded: $fwd"
	echo "worker ran ${ran:-0} launches"
	[ -n "$ref" ] && [ "$ref" = "$fwd" ] && [ "${ran:-0}" -gt 0 ]
}

calib() {
	# the measuring stops starting cases after 480 s: the fit needs the rest
	$PY bench/calibrate.py run --out "$OUT/calib.jsonl" --budget-s 480
	local rc=$?
	[ $rc -eq 2 ] && return 2          # no GPU: nothing measured, nothing to fit
	$PY bench/calibrate.py fit "$OUT/calib.jsonl" --json "$OUT/calib_fit.json" || rc=1
	return $rc
}

apis() {
	local rd rc=0 p native=()
	[ "$DEV" = sim ] && native=(env LD_LIBRARY_PATH="$PWD/shim/lib/simgpu" SIMGPU_TIMESCALE=0)
	for p in texture graphs pools; do
		echo "== $p natively"
		"${native[@]}" bench/bin/$p || rc=1
	done
	echo "== drvcheck natively"
	"${native[@]}" bench/bin/drvcheck 5 3 4 || rc=1
	rd=$(mktemp -d /tmp/cgpu-XXXXXX)
	.venv/bin/colocate serve --runtime-dir "$rd" --device "$DEV" --pool none --detach || return 1
	trap '.venv/bin/colocate stop --runtime-dir "$rd" >/dev/null 2>&1' EXIT
	for p in texture graphs pools; do
		echo "== $p under the shim"
		.venv/bin/colocate run --runtime-dir "$rd" --device "$DEV" --name "$p" -- bench/bin/$p || rc=1
	done
	echo "== drvcheck under the shim"
	.venv/bin/colocate run --runtime-dir "$rd" --device "$DEV" --name drvcheck -- bench/bin/drvcheck 5 3 4 || rc=1
	sleep 0.5
	.venv/bin/colocate quotas --runtime-dir "$rd" --all --json >"$OUT/apis_quotas.json" || rc=1
	.venv/bin/colocate quotas --runtime-dir "$rd" --all || true
	.venv/bin/colocate stop --runtime-dir "$rd"
	return $rc
}

export -f build vmmapp calib apis
export OUT JOBS PY DEV SECS
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
echo "session $(date -u +%FT%TZ) on $(head -n 12 "$OUT/nvidia-smi.txt" | grep -m1 -o 'NVIDIA [A-Z0-9][^|]*' || echo 'no GPU')" \
	>>"$OUT/session.log"
for s in "$@"; do
	case $s in
	build) step build 420 build ;;
	pool) step pool 480 python3 bench/gpu_pool.py --out "$OUT/gpu_pool.json" ;;
	fwd) step fwd 300 $PY bench/forwarding.py --device cuda --n 2000 --launches 50000 ;;
	demo) step demo 180 .venv/bin/colocate demo ;;
	vmmapp) step vmmapp 240 vmmapp ;;
	calib) step calib 580 calib ;;
	apis) step apis 240 apis ;;
	*) echo "unknown step $s (build pool fwd demo vmmapp calib apis)" | tee -a "$OUT/session.log"; exit 2 ;;
	esac
done
