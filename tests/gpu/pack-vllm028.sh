#!/usr/bin/env bash
# Builds the offline bundle of vLLM 0.28.0 + torch 2.13.0 (its CUDA 13.0 build) + LMCache 0.5.4 for the
# H200 host, which has no network and whose image has Python 3.12 with torch 2.11.0+cu130 and its CUDA
# wheels. Only what that image lacks, or has at a version the new stack does not accept, is bundled, as a
# pre-extracted site tree (tar.xz) split into parts of 36,000,000 bytes, one part per folder, because
# one GPU call carries at most 64 MiB (67,108,864 bytes) including the kit's own tree: 26.8 MB on
# 2026-12-01, which leaves 40.3 MB, so 36 MB keeps room for the reports still to come.
# Other versions through the variables below (tests/gpu/pack-vllm034.sh: vLLM 0.34.0 + torch 2.14.0 +
# LMCache 0.5.6, parts v034.*); torch's CUDA build is read from the resolved wheel's own pins, never assumed.
#
#   usage: PYTHON=python3.12 tests/gpu/pack-vllm028.sh OUTDIR
#          VLLM=0.28.0 LMCACHE=0.5.4 TORCH=2.13.0 PART_BYTES=36000000 XZ_THREADS=2 XZ_LEVEL=6 (the defaults)
#          TAG=v028 (the parts' names)  HOST_PINS=transformers==5.17.0 (what the host keeps, resolved against)
#          FORCE_BUNDLE= (names to bundle whatever the image has: its copy needs what the new stack replaces)
#          HOST_VERSIONS= (NAME==VERSION of more image packages whose version is known: bundled only if refused)
#          OVERRIDES= (PKG:REQUIREMENT, PKG vllm or lmcache: the specifier PKG's metadata puts on that requirement
#          is replaced, or the requirement dropped where none is given; the resolver reads a stand-in of PKG's
#          metadata so changed, and the real wheel is bundled. For pins the registry cannot serve or that conflict)
#          RESOLVE_ONLY=1: resolve and decide only, into OUTDIR/RESOLVE.txt (and the pip report beside it)
#
# OUTDIR/c00, OUTDIR/c01, ... hold v028.00, v028.01, ... (c00 also v028.sha256); OUTDIR/MANIFEST.txt
# lists every wheel with its version and sha256, what was left out and why, and the sizes. On the GPU
# host: `tests/gpu/h200_conditions.sh stage DIR` for each folder, then `... unpack028` (checks the sums,
# unpacks into $SITE028, links the image's own CUDA libraries beside the bundled ones).
#
# Why a site tree and not wheels: xz over the extracted files is smaller than the wheels' zip deflate,
# the files no Hopper fp16 run loads can be cut out first, and unpacking is one `xz -d | tar -x` with no
# pip run on the host. The tree is made with `pip install --target` so that file modes (triton's ptxas)
# and wheels' .data folders come out as pip would lay them.
set -euo pipefail
ME=${PACK_NAME:-pack-vllm028.sh}  # the name in messages and in MANIFEST.txt (a wrapper sets its own)
out=${1:?usage: $ME OUTDIR}
VLLM=${VLLM:-0.28.0}
LMCACHE=${LMCACHE:-0.5.4}
TORCH=${TORCH:-2.13.0}
TAG=${TAG:-v028}
PART_BYTES=${PART_BYTES:-36000000}
HOST_PINS=${HOST_PINS-transformers==5.17.0}
PY=${PYTHON:-python3.12}
# Markers (python_version > "3.11" and the like) are evaluated by the interpreter that runs pip, not by
# --python-version, so the resolver must run under the host's Python minor version.
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
  || { echo "$ME: needs Python 3.12 to resolve for the host (set PYTHON=)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$SECONDS

"$PY" -m venv "$work/venv" >/dev/null
"$work/venv/bin/pip" install -q -U pip >/dev/null 2>&1
pip="$work/venv/bin/pip"
plat=(--python-version 3.12 --only-binary=:all: --platform linux_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# every glibc tag up to 2.35: nvidia-nccl-cu13 2.29.7 is tagged manylinux_2_18 only
for n in $(seq 5 35); do plat+=(--platform "manylinux_2_${n}_x86_64"); done

# The host keeps its transformers (5.17.0 in every H200 report's provenance), so resolve against it:
# that caps huggingface_hub below 2 while vLLM 0.28 asks for >= 1.27.
: >"$work/host.txt"
for pin in $HOST_PINS; do printf '%s\n' "$pin" >>"$work/host.txt"; done
reqs=("vllm==$VLLM" "lmcache==$LMCACHE")
if [ -n "${OVERRIDES:-}" ]; then
  # pip cannot override a dependency's pin: resolve against stand-in wheels that carry vllm's or lmcache's own
  # metadata with the overridden pins; only resolving reads them (the download below takes the real wheels by name)
  for i in "${!reqs[@]}"; do
    pkg=${reqs[$i]%%==*}
    case " $OVERRIDES" in *" $pkg:"*) ;; *) continue ;; esac
    "$pip" install -q --dry-run --ignore-installed --no-deps --report "$work/$pkg.json" --target "$work/none" \
      "${plat[@]}" "${reqs[$i]}" 2> >(grep -v '^WARNING' >&2)
    reqs[i]=$("$work/venv/bin/python" - "$work/$pkg.json" "$work/standin" "$pkg" "$OVERRIDES" <<'PY'
import json, os, re, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
md = json.load(open(sys.argv[1]))["install"][0]["metadata"]
norm = lambda s: re.sub(r"[-_.]+", "-", s.lower())
mine = [o.split(":", 1)[1] for o in sys.argv[4].split() if o.split(":", 1)[0] == sys.argv[3]]
overrides = {norm(Requirement(o).name): Requirement(o) for o in mine}
lines, hit = [], set()
for line in md.get("requires_dist") or []:
    req = Requirement(line)
    if norm(req.name) in overrides:
        hit.add(norm(req.name))
        new = overrides[norm(req.name)]
        if not str(new.specifier):
            continue  # NAME alone: the requirement is dropped
        line = f"{req.name}{''.join(f'[{e}]' for e in sorted(req.extras))}{new.specifier}"
        line += f"; {req.marker}" if req.marker else ""
    lines.append(line)
if hit != set(overrides):
    sys.exit(f"OVERRIDES: {sys.argv[3]} {md['version']} does not require {', '.join(sorted(set(overrides) - hit))}")
name = f"{norm(md['name']).replace('-', '_')}-{md['version']}"
meta = ["Metadata-Version: 2.1", f"Name: {md['name']}", f"Version: {md['version']}"]
meta += [f"Requires-Python: {md['requires_python']}"] if md.get("requires_python") else []
meta += [f"Provides-Extra: {e}" for e in md.get("provides_extra") or []] + [f"Requires-Dist: {l}" for l in lines]
os.makedirs(sys.argv[2], exist_ok=True)
path = os.path.join(sys.argv[2], f"{name}-py3-none-any.whl")
with zipfile.ZipFile(path, "w") as whl:
    whl.writestr(f"{name}.dist-info/METADATA", "\n".join(meta) + "\n")
    whl.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    whl.writestr(f"{name}.dist-info/RECORD", "")
print(path)
PY
)
  done
  echo "resolving with pins overridden: $OVERRIDES" >&2
fi
echo "resolving vllm==$VLLM lmcache==$LMCACHE torch==$TORCH ..." >&2
"$pip" install -q --dry-run --ignore-installed --report "$work/report.json" --target "$work/none" "${plat[@]}" \
  -c "$work/host.txt" "torch==$TORCH" "${reqs[@]}" 2> >(grep -v '^WARNING' >&2)
t_resolve=$((SECONDS - t0))

# Decide per resolved package: bundle it, or leave it to the host image (or out, if nothing loads it).
"$work/venv/bin/python" - "$work/report.json" "$TORCH" "$work/torch-cuda.txt" "${FORCE_BUNDLE:-}" \
  "${HOST_VERSIONS:-}" >"$work/need.txt" 3>"$work/decisions.txt" <<'PY'
import json, os, re, sys
from pip._vendor.packaging.requirements import Requirement
# The image's CUDA stack at known versions: torch 2.11.0's own pins, which match what was measured there
# (nccl 2.28.9, cudnn 9.19.0.56, cublas 13.1.0.3, triton 3.6.0). Bundled only where torch 2.13's stack
# does not accept the image's version.
host = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0",
        "transformers": "5.17.0", "cuda-toolkit": "13.0.2", "nvidia-cublas": "13.1.0.3",
        "nvidia-cuda-cupti": "13.0.85", "nvidia-cuda-nvrtc": "13.0.88", "nvidia-cuda-runtime": "13.0.96",
        "nvidia-cudnn-cu13": "9.19.0.56", "nvidia-cufft": "12.0.0.61", "nvidia-cufile": "1.15.1.6",
        "nvidia-curand": "10.4.0.35", "nvidia-cusolver": "12.0.4.66", "nvidia-cusparse": "12.6.3.3",
        "nvidia-cusparselt-cu13": "0.8.0", "nvidia-nccl-cu13": "2.28.9", "nvidia-nvjitlink": "13.0.88",
        "nvidia-nvshmem-cu13": "3.4.5", "nvidia-nvtx": "13.0.85"}
host.update(dict(pin.split("==") for pin in sys.argv[5].split()))  # HOST_VERSIONS
# The rest of the image, versions not recorded: left to the host, as for the vLLM 0.26.0 bundle.
have = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cupy-cuda13x cycler cython einops filelock
frozenlist fsspec grpcio h11 hf-xet httpcore httpx huggingface-hub idna iniconfig jinja2 joblib
llvmlite markdown markdown-it-py markupsafe mdurl ml-dtypes mpmath msgpack multidict networkx ninja
numba numba-cuda numpy nvidia-ml-py opencv-python-headless packaging pandas pillow pip pluggy
prometheus-client propcache protobuf psutil py-cpuinfo pygments pytest pyyaml regex requests rich
safetensors scipy sentencepiece setuptools shellingham six sortedcontainers sympy tabulate tiktoken
tokenizers tqdm typer typing-extensions urllib3 uvloop wheel yarl zipp""".split())
# vLLM 0.28 raised its floor to huggingface_hub>=1.27.0 and the image's version is not recorded.
forced = set(sys.argv[4].split())  # FORCE_BUNDLE
force = {"huggingface-hub"} | forced
# Large optional kernels and tools that a dense fp16/bf16 model on Hopper does not load (the image has
# nvcc 13.0 for anything that compiles).
skip = set("""tokenspeed-triton tokenspeed-mla nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base
nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13 nvidia-nvvm
nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-nvdisasm nvidia-cuda-cccl tilelang pynvvideocodec
z3-solver fastsafetensors torchcodec cuda-tile humming-kernels quack-kernels""".split())
norm = lambda s: re.sub(r"[-_.]+", "-", s.lower())
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
items = json.load(open(sys.argv[1]))["install"]
# The report names extras only for what was asked for on the command line; torch asks for
# cuda-toolkit[cublas,...], whose pins (nvidia-cublas among them) hang on those extras.
extras = {norm(it["metadata"]["name"]): {""} | set(it.get("requested_extras") or []) for it in items}
specs = {}  # name -> {(specifier, who)} from every resolved package, markers evaluated for the host
while True:
    before = sum(map(len, extras.values()))
    for it in items:
        md = it["metadata"]
        for line in md.get("requires_dist") or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras[norm(md["name"])]):
                specs.setdefault(norm(req.name), set()).add((req.specifier, md["name"]))
                extras.setdefault(norm(req.name), {""}).update(req.extras)
    if sum(map(len, extras.values())) == before:
        break
def cuda_build(md):
    """torch's local version tag (cu130 for CUDA 13.0) from the CUDA runtime the wheel pins, and that pin."""
    for line in md.get("requires_dist") or []:
        req = Requirement(line)
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if re.fullmatch(r"cuda-toolkit|nvidia-cuda-runtime(-cu\d+)?", norm(req.name)) and pins:
            major, minor = pins[0].split(".")[:2]
            return f"cu{major}{minor}", f"{req.name}=={pins[0]}"
    return None, None
decisions = os.fdopen(3, "w")
for it in sorted(items, key=lambda i: norm(i["metadata"]["name"])):
    name, ver = norm(it["metadata"]["name"]), it["metadata"]["version"]
    if name == "torch" and (ver != sys.argv[2] or "+" in it["download_info"]["url"].rsplit("/", 1)[-1]):
        sys.exit(f"resolved torch {ver} from {it['download_info']['url']}: not the CUDA wheel {sys.argv[2]}")
    if name == "torch":
        tag, pin = cuda_build(it["metadata"])
        if tag is None:
            sys.exit(f"resolved torch {ver} from {it['download_info']['url']} pins no CUDA runtime: not a CUDA build")
        with open(sys.argv[3], "w") as fh:
            print(tag, pin, file=fh)
    if name in skip:
        why = "left out: not loaded by a dense fp16 model on Hopper"
    elif name in host and name in forced:
        why = f"bundled: host image has {host[name]}; forced (FORCE_BUNDLE)"
    elif name in host:
        h = host[name]
        bad = [f"{who} wants {s}" for s, who in specs.get(name, []) if not s.contains(h, prereleases=True)]
        if ver == h or not bad:
            why = f"host image has {h}, accepted"
        else:
            why = f"bundled: host image has {h}; " + "; ".join(sorted(set(bad)))
    elif name in have and name not in force:
        why = "host image has it"
    else:
        why = "bundled: " + ("host version unknown and " + "; ".join(
            sorted({f"{who} wants {s}" for s, who in specs.get(name, []) if str(s)})) if name in force
            else "not in the host image")
    print(f"{name:34} {ver:24} {why}", file=decisions)
    if why.startswith("bundled"):
        print(f"{it['metadata']['name']}=={ver}")
PY
read -r cuda cuda_pin <"$work/torch-cuda.txt"
echo "torch $TORCH resolved to its $cuda build (it pins $cuda_pin)" >&2
if [ -n "${RESOLVE_ONLY:-}" ]; then
  cp "$work/report.json" "$out/resolve-report.json"
  {
    echo "vllm==$VLLM lmcache==$LMCACHE torch==$TORCH for Python 3.12 manylinux x86_64 (resolved by tests/gpu/$ME)"
    echo "resolved: $(grep -c . "$work/decisions.txt") packages; to bundle: $(wc -l <"$work/need.txt"); seconds: $t_resolve"
    echo "torch: the $TORCH+$cuda build (its pin $cuda_pin)"
    if [ -n "${OVERRIDES:-}" ]; then echo "resolved with pins overridden: $OVERRIDES"; fi
    echo
    echo "## every resolved package and what would become of it"
    cat "$work/decisions.txt"
  } >"$out/RESOLVE.txt"
  echo "resolved only: $out/RESOLVE.txt" >&2
  exit 0
fi
echo "downloading $(wc -l <"$work/need.txt") wheels ..." >&2
t1=$SECONDS
"$pip" download -q --no-cache-dir --no-deps "${plat[@]}" -d "$work/wheels" -r "$work/need.txt" \
  2> >(grep -v '^WARNING' >&2)
t_download=$((SECONDS - t1))

t2=$SECONDS
"$pip" install -q --no-index --no-deps --no-compile --target "$work/site" "${plat[@]}" "$work"/wheels/*.whl \
  2> >(grep -v '^WARNING' >&2)
site=$work/site
# Kernels for other GPU generations and other Pythons, a Rust front end, web assets, console scripts.
rm -rf "$site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$site/vllm/vllm-rs" \
       "$site/vllm/third_party/fmha_sm100" "$site/vllm/third_party/deep_gemm/include" \
       "$site/vllm/entrypoints/serve/instrumentator/static" "$site/bin"
find "$site/vllm/third_party/deep_gemm" -name '_C.cpython-31[0134]-*' -delete 2>/dev/null || true
# torch must come from this tree, the CUDA build its wheel's pins named (cu130 for 2.13.0 and 2.14.0).
grep -q "^__version__ = '$TORCH+$cuda'" "$site/torch/version.py" \
  || { echo "$ME: torch in the tree is not $TORCH+$cuda" >&2; exit 3; }
raw=$(du -sb "$site" | cut -f1)
echo "compressing $((raw / 1000000)) MB ..." >&2
tar -C "$site" --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | xz -T"${XZ_THREADS:-2}" -"${XZ_LEVEL:-6}" >"$work/bundle.tar.xz"
t_pack=$((SECONDS - t2))

rm -rf "$out"/c[0-9][0-9]
split -b "$PART_BYTES" -d -a 2 "$work/bundle.tar.xz" "$work/$TAG."
(cd "$work" && sha256sum "$TAG".[0-9][0-9] >"$TAG.sha256")
i=0
for part in "$work/$TAG".[0-9][0-9]; do
  d=$(printf '%s/c%02d' "$out" "$i"); mkdir -p "$d"; mv "$part" "$d/"; i=$((i + 1))
done
cp "$work/$TAG.sha256" "$out/c00/"
packed=$(stat -c %s "$work/bundle.tar.xz")
{
  echo "vllm==$VLLM lmcache==$LMCACHE torch==$TORCH for Python 3.12 manylinux x86_64 (made by tests/gpu/$ME)"
  if [ -n "${OVERRIDES:-}" ]; then echo "resolved with pins overridden: $OVERRIDES (the wheels are the real ones)"; fi
  echo "parts: $i of at most $PART_BYTES bytes (c00/$TAG.00 ...); sums in c00/$TAG.sha256"
  echo "site tree: $raw bytes unpacked; $packed bytes as tar.xz, sha256 $(sha256sum "$work/bundle.tar.xz" | cut -d' ' -f1)"
  echo "wheels: $(cat "$work"/wheels/*.whl | wc -c) bytes in $(ls "$work"/wheels | wc -l) files"
  echo "seconds: resolve $t_resolve, download $t_download, install+strip+compress $t_pack"
  echo
  echo "## wheels bundled (bytes, sha256)"
  (cd "$work/wheels" && for w in *.whl; do printf '%s %s %s\n' "$w" "$(stat -c %s "$w")" "$(sha256sum "$w" | cut -d' ' -f1)"; done)
  echo
  echo "## every resolved package and what became of it"
  cat "$work/decisions.txt"
} >"$out/MANIFEST.txt"
echo "vllm==$VLLM lmcache==$LMCACHE torch==$TORCH: $i parts, $packed bytes in $out" >&2
