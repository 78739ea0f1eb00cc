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
#   greenapp hotspot natively, then under `colocate serve --route partition`
#           moved among SM partitions (50 %, 25 %, 75 %) while it runs: the
#           CHECK lines must be equal and the app's partition record must
#           show SMs (greenapp_quotas.json); the shim's route on the device
#   parts   bench/partitions.py --device cuda: a launch's cost local and on a
#           partition, and route changes between two disjoint partitions,
#           with the probe pausing 50 us between launches (partitions.json)
#           and back to back (partitions_b2b.json)
#   partsim bench/partitions.py on simgpu, on this (GPU) host's CPUs, with the
#           pause and back to back (partsim.json, partsim_b2b.json): issue
#           16's simgpu switch figure where the 2-vCPU dev machine's thread
#           wake-ups (tens of us) do not make it, beside the host's own
#           wake-up (host_wake_p50); no GPU needed, about a minute
#   handoff bench/handoff.py --device cuda alone (also inside camelot)
#   calib   bench/calibrate.py run: a kernel next to co-runners of each kind
#           at MPS percentages 10..100 (with and without oversubscription),
#           the time slice without MPS, PCIe contention (calib.jsonl); then
#           calibrate.py fit: simgpu's parameters and its error per case
#           (calib_fit.json).  A call of its own: it takes most of 10 minutes
#           (CALIB_BUDGET=S: stop starting cases after S s, 480; CALIB_QUICK=1:
#           quotas 30,70,100 only)
#   apis    the CUDA-API programs (bench/progs/texture, graphs, pools and the
#           driver-API tests/drv/drvcheck) on the GPU: their own checks hold
#           simgpu's reference semantics against the hardware; then under
#           the shim with a controller, whose records (apis_quotas.json)
#           must count what the programs print (graphs: 100 per captured
#           kernel; drvcheck: its launches and bytes)
#   green   green contexts (SM partitions), what the shim's partition route
#           rests on: bench/bin/gpu-green_probe split, bind, create, switch,
#           modload (one JSON line each; the probe's header says what each
#           answers), then the two-process test: `hold --sms 64 --ms 1500`
#           alone, two at once, then under an MPS daemon of our own (pipe and
#           log dirs in a temp dir) one alone and two at once; every line in
#           green.jsonl (written afresh), tagged (--tag), and a summary of the
#           hold runs in green.log.  Without MPS the probes get an empty
#           CUDA_MPS_PIPE_DIRECTORY, as in bench/gpu_pool.py
#   camelot a 3-stage Camelot pipeline with handles and with --copy (the
#           checksums must be equal, the handle run must hand off and not
#           copy: pipeline_{handle,copy}.json), then bench/handoff.py
#           --device cuda (Fig. 11 on the GPU: handoff/table.md); then the
#           Table I stages (Tonic nets) against the CPU reference
#           (tonic_check.json) and the text-to-img service live with handles
#           and --copy against the same stages one query at a time
#           (service_{handle,copy,chain}.json: do a query's bytes depend on
#           its batch under cuDNN / cuBLAS?); then `colocate pipeline plan`
#           of text-to-img for 20 q/s (profile on the device, models,
#           allocator: plan.json, t2i-plan.toml) and a run of the plan
#           (plan_run.json: planned against measured)
# First run on an H200 on 2026-11-27 (bench/RESULTS.md, "GPU session"):
# build green greenapp apis demo camelot parts handoff calib.  Read
# session.log first.
set -u
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
JOBS=$(nproc 2>/dev/null || echo 4)
PY=.venv/bin/python
DEV=${DEV:-cuda}          # sim: try the steps that allow it on simgpu
QUERIES=${QUERIES:-200}   # queries per pipeline run in the camelot step
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
	# the image's python3 is itself a venv (/opt/torch/.venv): the new
	# venv's "system" packages are the base interpreter's, not that one's
	python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
		>"$(echo .venv/lib/python3*/site-packages)/_host.pth" &&
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

greenapp() {
	# issue 16's route on the device: hotspot natively, then with its launches
	# on green-context partitions of 50, 25 and 75 % while it runs
	local rd ref part pid n native=()
	[ "$DEV" = sim ] && native=(env LD_LIBRARY_PATH="$PWD/shim/lib/simgpu")
	rd=$(mktemp -d /tmp/cgpu-XXXXXX)
	ref=$("${native[@]}" bench/bin/hotspot --check --duration "$SECS" | grep '^CHECK')
	.venv/bin/colocate serve --runtime-dir "$rd" --device "$DEV" --route partition --pool none --detach || return 1
	trap '.venv/bin/colocate stop --runtime-dir "$rd" >/dev/null 2>&1' EXIT
	.venv/bin/colocate run --runtime-dir "$rd" --device "$DEV" --name hotpart -- \
		bench/bin/hotspot --check --duration "$SECS" >"$rd/hotpart.out" 2>&1 &
	pid=$!
	for n in $(seq 200); do
		.venv/bin/colocate set-quota --runtime-dir "$rd" hotpart 50 && break
		sleep 0.05
	done
	sleep 1
	.venv/bin/colocate set-quota --runtime-dir "$rd" hotpart 25
	.venv/bin/colocate quotas --runtime-dir "$rd" --all
	sleep 1
	.venv/bin/colocate set-quota --runtime-dir "$rd" hotpart 75
	.venv/bin/colocate quotas --runtime-dir "$rd" --all
	wait $pid
	part=$(grep '^CHECK' "$rd/hotpart.out")
	cat "$rd/hotpart.out"
	.venv/bin/colocate quotas --runtime-dir "$rd" --all --json | tee "$OUT/greenapp_quotas.json"
	.venv/bin/colocate stop --runtime-dir "$rd"
	cp "$rd"/*.log "$OUT"/ 2>/dev/null
	echo "native:    $ref"
	echo "partition: $part"
	[ -n "$ref" ] && [ "$ref" = "$part" ] && grep -q '"sms": [1-9]' "$OUT/greenapp_quotas.json"
}

calib() {
	# the measuring stops starting cases after 480 s: the fit needs the rest
	$PY bench/calibrate.py run --out "$OUT/calib.jsonl" --budget-s "${CALIB_BUDGET:-480}" ${CALIB_QUICK:+--quick}
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

camelot() {
	# issue 17 on the GPU: a 3-stage pipeline with handles (legacy CUDA IPC
	# between MPS-less processes) and with --copy must give the same
	# checksum for every query; then the hand-off against the copy by size
	local rd rc=0
	rd=$(mktemp -d /tmp/cgpu-XXXXXX)
	for m in handle copy; do
		.venv/bin/colocate pipeline run bench/camelot/specs/p1-c2-m1.toml --device "$DEV" --queries "$QUERIES" \
			--rate 40 --runtime-dir "$rd" --json "$OUT/pipeline_$m.json" $([ $m = copy ] && echo --copy) || rc=1
	done
	$PY - "$OUT" <<'PYEOF' || rc=1
import json, sys
h, c = (json.load(open(f"{sys.argv[1]}/pipeline_{m}.json")) for m in ("handle", "copy"))
same = h["checksums"] == c["checksums"]
print(f"checksums {'equal' if same else 'DIFFER'} over {len(h['checksums'])} queries; "
      f"handle run: {h['handoffs']} hand-offs, {h['copies']} copies; copy run: {c['handoffs']}, {c['copies']}")
sys.exit(0 if same and h["handoffs"] > 0 and h["copies"] == 0 else 1)
PYEOF
	$PY bench/handoff.py --device "$DEV" $([ "$DEV" = sim ] && echo --quick) --out "$OUT/handoff" || rc=1
	# Table I's stages: each vs ref.c (width 0.25 on the GPU: vgg's fc7 at full
	# width exceeds the check's tolerance in FP32, bench/tonic/README.md)
	local sc tw
	sc=$([ "$DEV" = sim ] && echo 0.004 || echo 0.0625)
	tw=SIMGPU_TWINS=bench/bin/libcamelot-tonic.twins.so:bench/bin/tonic-service.twins.so:bench/bin/libcamelot-stage.twins.so
	.venv/bin/colocate run --device "$DEV" --runtime-dir "$rd" -- env "$tw" $PY bench/camelot/chain.py --check \
		--kinds "$($PY -c 'import sys; sys.path.insert(0, "bench"); from camelot.suite import NETS; print(",".join(NETS))')" \
		--scale "$sc" --queries 2 >"$OUT/tonic_check.json" || rc=1
	for m in handle copy; do
		.venv/bin/colocate pipeline run bench/camelot/specs/text-to-img.toml --device "$DEV" --queries 40 \
			--rate 20 --runtime-dir "$rd" --json "$OUT/service_$m.json" $([ $m = copy ] && echo --copy) || rc=1
	done
	.venv/bin/colocate run --device "$DEV" --runtime-dir "$rd" -- env "$tw" $PY bench/camelot/chain.py \
		--kinds semantic-understanding,image-generation --queries 40 \
		$([ "$DEV" = sim ] && echo "--scale 0.01" || echo "--scale 1") >"$OUT/service_chain.json" || rc=1
	$PY - "$OUT" <<'PYEOF' || rc=1
import json, sys
h, c = (json.load(open(f"{sys.argv[1]}/service_{m}.json")) for m in ("handle", "copy"))
one = json.loads(open(f"{sys.argv[1]}/service_chain.json").read().strip().splitlines()[-1])
print(f"text-to-img: handles vs copy {'equal' if h['checksums'] == c['checksums'] else 'DIFFER'}, "
      f"vs one query at a time {'equal' if h['checksums'] == one else 'DIFFER'} over {len(one)} queries")
sys.exit(0 if h["checksums"] == c["checksums"] == one else 1)
PYEOF
	# Camelot's workflow on the device: profile the two stages, model, allocate
	# for 20 q/s (plan.json, t2i-plan.toml), then run what was planned
	.venv/bin/colocate pipeline plan bench/camelot/specs/text-to-img.toml --device "$DEV" --quotas 25,50,100 \
		--load 20 --store "$rd/store" --runtime-dir "$rd" --write "$OUT/t2i-plan.toml" --json >"$OUT/plan.json" || rc=1
	.venv/bin/colocate pipeline run "$OUT/t2i-plan.toml" --device "$DEV" --queries 40 --rate 20 \
		--runtime-dir "$rd" --json "$OUT/plan_run.json" || rc=1
	rm -rf "$rd"
	return $rc
}

green() {
	# exit: 0 all measured, 1 a probe failed or MPS would not start, 2 no GPU
	# (mpsctl is global: the EXIT trap below may run after this returns)
	local P=bench/bin/gpu-green_probe J="$OUT/green.jsonl" td rc=0 m ctl pipe logd
	[ -x "$P" ] || make "$P" || return 1
	export PATH=$PATH:/usr/local/nvidia/bin:/usr/lib/nvidia/bin:/opt/nvidia/bin
	td=$(mktemp -d /tmp/cgreen-XXXXXX)
	mkdir -p "$td/nomps" "$td/mps/pipe" "$td/mps/log"
	: >"$J"
	note() {        # note EXIT_CODE WHAT: keep the step's worst outcome
		[ "$1" -eq 0 ] && return
		echo "$2: exit $1"
		if [ "$1" -eq 2 ]; then [ $rc -eq 0 ] && rc=2; else rc=1; fi
	}
	probe() {       # probe OUT_FILE ARGS...: one run against $pipe, its line to OUT_FILE
		local f=$1
		shift
		CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$logd timeout 90 "$P" "$@" >"$f"
	}
	hold() {        # hold TAG: one hold run, its line to green.jsonl
		probe "$td/$1.json" hold --sms 64 --ms 1500 --tag "$1"
		note $? "hold $1"
		cat "$td/$1.json" >>"$J"
	}
	pair() {        # pair TAG [FIRST_A FIRST_B]: two hold runs at once (with
		local pa pb ra rb fa=() fb=()   # FIRSTs: the shim's spans, --first)
		[ $# -ge 3 ] && fa=(--first "$2") fb=(--first "$3")
		probe "$td/$1-a.json" hold --sms 64 --ms 1500 "${fa[@]}" --tag "$1-a" &
		pa=$!
		probe "$td/$1-b.json" hold --sms 64 --ms 1500 "${fb[@]}" --tag "$1-b" &
		pb=$!
		wait $pa; ra=$?
		wait $pb; rb=$?
		cat "$td/$1-a.json" "$td/$1-b.json" >>"$J"
		note $ra "hold $1-a"
		note $rb "hold $1-b"
	}
	# without MPS: an empty pipe dir, where no daemon answers
	pipe=$td/nomps logd=$td/nomps
	for m in split bind create switch modload; do
		echo "== $m"
		probe "$td/$m.json" $m --tag nomps
		note $? "$m"
		tee -a "$J" <"$td/$m.json"
	done
	echo "== hold: one alone, then two at once (no MPS)"
	hold alone
	pair pair
	pair spans 0 64
	echo "== hold under MPS: one alone, then two at once"
	ctl=$(command -v nvidia-cuda-mps-control)
	pipe=$td/mps/pipe logd=$td/mps/log
	mpsctl=(env CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$logd" "$ctl")
	if [ $rc -eq 2 ]; then
		echo "no GPU: the MPS runs are skipped"
	elif [ -z "$ctl" ]; then
		note 1 "MPS: nvidia-cuda-mps-control not on PATH, the MPS runs skipped"
	elif ! "${mpsctl[@]}" -d; then
		note 1 "MPS: $ctl -d"
	else
		# a daemon left running would turn the later steps into MPS clients
		trap 'echo quit | "${mpsctl[@]}" >/dev/null 2>&1' EXIT
		trap 'exit 1' TERM INT
		for m in $(seq 50); do
			echo get_server_list | "${mpsctl[@]}" >/dev/null 2>&1 && break
			sleep 0.2
		done
		hold mps-alone
		pair mps-pair
		pair mps-spans 0 64
		echo quit | "${mpsctl[@]}" || note 1 "MPS: quit"
		trap - EXIT TERM INT
		tail -n 15 "$logd/control.log" "$logd/server.log" 2>/dev/null
	fi
	# the hold lines side by side: whether each pair overlapped, how much
	# slower its kernels ran than the one alone, which SM ids both used
	python3 - "$J" <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
hold = {r.get("tag"): r for r in rows if r.get("mode") == "hold"}
for t, r in hold.items():
    print(f"{t}: iterations {r.get('iterations')} kernel_ms_med {r.get('kernel_ms_med')} "
          f"busy {r.get('busy_frac')} SMs {r.get('sm_used')} ({r.get('sm_min')}..{r.get('sm_max')}) "
          f"error {r.get('error')}")
for p, alone in (("pair", "alone"), ("mps-pair", "mps-alone"), ("spans", "alone"),
                 ("mps-spans", "mps-alone")):
    a, b, one = hold.get(p + "-a"), hold.get(p + "-b"), hold.get(alone)
    if not (a and b and a.get("first_start_ns") and b.get("first_start_ns")):
        continue
    lo = max(a["first_start_ns"], b["first_start_ns"])
    hi = min(a["last_end_ns"], b["last_end_ns"])
    base = (one or {}).get("kernel_ms_med")
    rel = [round(x["kernel_ms_med"] / base, 2) if base and x.get("kernel_ms_med") else None
           for x in (a, b)]
    both = int(a.get("sm_mask") or "0", 16) & int(b.get("sm_mask") or "0", 16)
    print(f"{p}: overlap {max(0, hi - lo) / 1e6:.1f} ms; kernel time vs alone {rel}; "
          f"SM ids both used: {bin(both).count('1')}")
PY
	rm -rf "$td"
	return $rc
}

export -f build vmmapp greenapp calib apis green camelot
export OUT JOBS PY DEV SECS QUERIES
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
	greenapp) step greenapp 120 greenapp ;;
	calib) step calib 580 calib ;;
	apis) step apis 240 apis ;;
	parts) step parts 180 sh -c "$PY bench/partitions.py --device $DEV --flips 100 --switch-interval-us 50 >$OUT/partitions.json &&
		$PY bench/partitions.py --device $DEV --flips 100 --switch-interval-us 0 >$OUT/partitions_b2b.json" ;;
	partsim) step partsim 150 sh -c "$PY bench/partitions.py --device sim --flips 100 --switch-interval-us 50 --json >$OUT/partsim.json &&
		$PY bench/partitions.py --device sim --flips 100 --switch-interval-us 0 --json >$OUT/partsim_b2b.json" ;;
	handoff) step handoff 150 $PY bench/handoff.py --device "$DEV" --out "$OUT/handoff" ;;
	green) step green 240 green ;;
	camelot) step camelot 300 camelot ;;
	*) echo "unknown step $s (build pool fwd demo vmmapp greenapp calib apis parts partsim handoff green camelot)" | tee -a "$OUT/session.log"; exit 2 ;;
	esac
done
