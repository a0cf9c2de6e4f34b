#!/usr/bin/env bash
# The six library crates package as crates.io takes them (docs/design.md, "Publishing"):
#   ucxrs-sys, ucxrs (lib `ucx`), ucxrs-transport (lib `transport`), dask-graph, dask-comm,
#   dask-collections.
#   bash scripts/crates_check.sh         what CI runs
#   bash scripts/crates_check.sh --all   every crate built from its .crate (dask-collections too)
# 1. rust-version: each declares one, at least what its edition and its locked dependency tree
#    (on x86_64 Linux, every feature) need; clippy's incompatible_msrv lint (CI runs clippy with
#    -D warnings) checks the standard library items each uses against it.
# 2. `cargo package` as `cargo publish --dry-run` checks it: versions on every path
#    dependency, each crate's files and lock file, and each crate built from its .crate file
#    with the others from a local overlay of the registry. All six are packaged; five are
#    built so here (CI: about a minute, in the workspace's target folder after the fast tier).
#    dask-collections' build from its .crate compiles polars again (its dependencies' features
#    differ from the workspace's unified ones: about 5 minutes), so CI checks instead that
#    every file its sources include is its own and packaged; `--all` builds it too.
# 3. The documentation builds without UCX: DOCS_RS set (docs.rs sets it), pkg-config told
#    not to look for `ucx` and no UCX_PREFIX; ucx-sys then uses its pre-generated bindings
#    (src/pregenerated.rs; `bash scripts/ucx_sys_bindings.sh --check` says whether they are
#    current). The same build without DOCS_RS must fail saying UCX is missing, which shows the
#    environment really hides it.
set -euo pipefail
cd "$(dirname "$0")/.."
CRATES=(ucxrs-sys ucxrs ucxrs-transport dask-graph dask-comm dask-collections)

python3 - "${CRATES[@]}" <<'EOF'
import json, subprocess, sys
meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "-q", "--format-version", "1", "--all-features",
     "--filter-platform", "x86_64-unknown-linux-gnu"]))
pkgs = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
def ver(v):
    parts = [int(x) for x in (v or "0").split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
EDITION = {"2015": "1.0", "2018": "1.31", "2021": "1.56", "2024": "1.85"}
bad = []
for name in sys.argv[1:]:
    root = next(i for i, p in pkgs.items() if p["name"] == name)
    seen, stack = set(), [root]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for d in nodes[i]["deps"]:
            if any(k["kind"] != "dev" for k in d["dep_kinds"]):
                stack.append(d["pkg"])
    need = max((ver(pkgs[i].get("rust_version")), pkgs[i]["name"] + " " + pkgs[i]["version"])
               for i in seen if i != root)
    need = max(need, (ver(EDITION[pkgs[root]["edition"]]), f"edition {pkgs[root]['edition']}"))
    declared = pkgs[root].get("rust_version")
    ok = declared is not None and ver(declared) >= need[0]
    print(f"crates: {name}: rust-version {declared}, needs {'.'.join(map(str, need[0][:2]))} ({need[1]})"
          + ("" if ok else "  <- too low"))
    if not ok:
        bad.append(name)
if bad:
    sys.exit(f"crates: rust-version missing or below what is needed: {', '.join(bad)}")
EOF

# Cargo takes a crate from the overlay registry as immutable, like any registry crate: it
# keeps the sources it unpacked into CARGO_HOME/registry/src/-<hash of the overlay's path>/
# and what it compiled from them in the target folder, and uses both again for the same name
# and version, so a second run in the same place would build today's crates against an
# earlier run's dependencies (CI failed so: a method added since was "not found"). Both go.
home=${CARGO_HOME:-$HOME/.cargo}
for c in "${CRATES[@]}"; do
  v=$(cargo pkgid -q -p "$c" | sed "s/.*[#@]//")
  for d in "$home"/registry/src/-*/"$c-$v"; do
    if [ -e "$d" ]; then rm -rf "$d"; fi
  done
done
# What it compiled is only there if an earlier run used this target folder (CI's is new).
if [ -d target/package/tmp-registry ]; then
  for c in "${CRATES[@]}"; do cargo clean -q -p "$c"; done
fi
args=()
for c in "${CRATES[@]}"; do args+=(-p "$c"); done
VERIFY=(ucxrs-sys ucxrs ucxrs-transport dask-graph dask-comm)
if [ "${1:-}" = --all ]; then
  VERIFY=("${CRATES[@]}")
else
  cargo package -q -j2 --allow-dirty --no-verify "${args[@]}"  # dask-collections' .crate
fi
args=()
for c in "${VERIFY[@]}"; do args+=(-p "$c"); done
cargo package -q -j2 --allow-dirty "${args[@]}"
# What a crate's sources include (include_str!, include_bytes!, #[path]) must be its own,
# packaged file: for the crates not built from their .crate above, checked here.
for c in "${CRATES[@]}"; do
  case " ${VERIFY[*]} " in *" $c "*) continue ;; esac
  dir=$(cargo pkgid -q -p "$c" | sed 's|^path+file://||; s|#.*||')
  listed=$(cargo package -q --allow-dirty --no-verify --list -p "$c")
  python3 - "$dir" "$listed" <<'EOF2'
import os, re, sys
root, listed = sys.argv[1], set(sys.argv[2].split())
bad = []
for base, _, files in os.walk(os.path.join(root, "src")):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(base, f)
        text = open(path).read()
        for m in re.finditer(r'(include_str!|include_bytes!)\(\s*"([^"]+)"|#\[path\s*=\s*"([^"]+)"\]', text):
            target = os.path.normpath(os.path.join(base, m.group(2) or m.group(3)))
            rel = os.path.relpath(target, root)
            if rel.startswith("..") or rel not in listed:
                bad.append(f"{os.path.relpath(path, root)}: {m.group(0)} -> {rel}")
if bad:
    sys.exit("crates: files included from outside the crate or not packaged:\n  " + "\n  ".join(bad))
EOF2
  echo "crates: $c: packaged (not built from its .crate here: --all does); what its sources include is its own"
done
for c in "${CRATES[@]}"; do
  f=target/package/$c-$(cargo pkgid -q -p "$c" | sed "s/.*[#@]//").crate
  built=""
  case " ${VERIFY[*]} " in *" $c "*) built=", builds from the .crate" ;; esac
  echo "crates: $(basename "$f"): $(tar -tzf "$f" | wc -l) files, $(du -k "$f" | cut -f1) KiB$built"
done

# Documentation without UCX, in its own target folder (DOCS_RS changes ucx-sys's build).
DOCS=(-p ucxrs-sys -p ucxrs -p ucxrs-transport -p dask-graph)
hide=(env DOCS_RS=1 UCX_NO_PKG_CONFIG=1 UCX_PREFIX= CARGO_TARGET_DIR=target/docs-rs)
if env -u DOCS_RS UCX_NO_PKG_CONFIG=1 UCX_PREFIX= CARGO_TARGET_DIR=target/docs-rs \
  cargo check -q -j2 -p ucxrs-sys > target/docs-rs-nodocs.log 2>&1; then
  echo "crates: ucxrs-sys built with UCX hidden and no DOCS_RS: the check would prove nothing" >&2
  exit 1
fi
grep -q "UCX was not found" target/docs-rs-nodocs.log \
  || { cat target/docs-rs-nodocs.log >&2; echo "crates: no 'UCX was not found' message" >&2; exit 1; }
RUSTDOCFLAGS="-D warnings" "${hide[@]}" cargo doc -q -j2 --no-deps --features ucxrs/cuda,ucxrs-transport/cuda "${DOCS[@]}"
echo "crates: docs of ucxrs-sys, ucxrs, ucxrs-transport and dask-graph build with UCX hidden (DOCS_RS, pre-generated bindings)"
# The pre-generated bindings are those of UCX_OLDEST's headers (a build of ucx-sys against them).
bash scripts/ucx_sys_bindings.sh --check
