//! Finds UCX, generates bindings over `ucp/api/ucp.h` and compiles the C shim.
//!
//! Search order (first hit wins), in the spirit of openssl-sys:
//! 1. `UCX_PREFIX`: a directory holding `include/ucp/api/ucp.h` and `lib/libucp.so`
//!    (for example the `libucx/` directory of an unpacked PyPI `libucx-cu13` wheel);
//! 2. pkg-config's `ucx` package (Debian: `libucx-dev`).

use std::env;
use std::path::{Path, PathBuf};

struct Ucx {
    include_dirs: Vec<PathBuf>,
}

fn from_prefix(prefix: &Path) -> Ucx {
    let include = prefix.join("include");
    let lib = prefix.join("lib");
    if !include.join("ucp/api/ucp.h").exists() {
        fail(&format!(
            "UCX_PREFIX={} has no include/ucp/api/ucp.h",
            prefix.display()
        ));
    }
    if !has_libucp(&lib) {
        fail(&format!(
            "UCX_PREFIX={} has no lib/libucp.so (the headers alone cannot be linked)",
            prefix.display()
        ));
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["ucp", "uct", "ucs", "ucm"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    println!("cargo:root={}", prefix.display());
    Ucx {
        include_dirs: vec![include],
    }
}

/// Whether `lib` holds the shared UCP library (`libucp.so`, or a versioned `libucp.so.N`, as
/// the PyPI wheels ship it).
fn has_libucp(lib: &Path) -> bool {
    std::fs::read_dir(lib).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n == "libucp.so" || n.starts_with("libucp.so."))
        })
    })
}

fn from_pkg_config() -> Ucx {
    match pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
    {
        Ok(lib) => Ucx {
            include_dirs: lib.include_paths,
        },
        Err(e) => fail(&format!("pkg-config could not find `ucx`: {e}")),
    }
}

fn fail(why: &str) -> ! {
    panic!(
        "\n\nucx-sys: UCX was not found ({why}).\n\
         Install it, or point UCX_PREFIX at an installation:\n\
         \x20 Debian/Ubuntu: apt-get install -y libucx-dev pkg-config libclang-dev\n\
         \x20 Fedora/RHEL:   dnf install -y ucx-devel pkgconf clang-devel\n\
         \x20 CUDA-capable UCX from PyPI: pip download --no-deps --only-binary=:all: libucx-cu13,\n\
         \x20   unpack it with `python3 -m zipfile -e <wheel> <dir>`, then\n\
         \x20   export UCX_PREFIX=<dir>/libucx LD_LIBRARY_PATH=<dir>/libucx/lib\n\n"
    );
}

fn main() {
    println!("cargo:rerun-if-env-changed=UCX_PREFIX");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    for f in ["src/shim.c", "src/shim.h", "src/wrapper.h"] {
        println!("cargo:rerun-if-changed={f}");
    }

    let ucx = match env::var_os("UCX_PREFIX") {
        Some(p) if !p.is_empty() => from_prefix(Path::new(&p)),
        _ => from_pkg_config(),
    };

    let mut build = cc::Build::new();
    build
        .file("src/shim.c")
        .warnings(true)
        .extra_warnings(false);
    for inc in &ucx.include_dirs {
        build.include(inc);
    }
    // ucs_config_parser_print_all_opts gained a `filter` argument between 1.13 and 1.22: read
    // the installed header to know which one to call.
    let parser_h = ucx
        .include_dirs
        .iter()
        .map(|d| d.join("ucs/config/parser.h"))
        .find(|p| p.exists());
    if let Some(h) = parser_h {
        let text = std::fs::read_to_string(&h).unwrap_or_default();
        let decl = text
            .split("ucs_config_parser_print_all_opts(")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap_or("");
        if decl.contains("filter") {
            build.define("UCXRS_PRINT_ALL_OPTS_FILTER", "1");
        }
    }
    build.compile("ucxrs_shim");

    let mut bindings = bindgen::Builder::default()
        .header("src/wrapper.h")
        .allowlist_function("ucp_.*")
        .allowlist_function("ucs_status_string")
        .allowlist_function("ucxrs_.*")
        .allowlist_type("ucp_.*")
        .allowlist_type("ucs_.*")
        .allowlist_var("UCP_.*")
        .allowlist_var("UCS_.*")
        .blocklist_type("FILE")
        .blocklist_type("_IO_FILE")
        .raw_line("pub type FILE = libc::FILE;")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for inc in &ucx.include_dirs {
        bindings = bindings.clang_arg(format!("-I{}", inc.display()));
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed over ucp/api/ucp.h: {e}")))
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs into OUT_DIR");
}
