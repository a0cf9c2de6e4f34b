"""The installation as a user has it: which UCX was loaded and from where, `python -m ucxrs`,
and the messages for a UCX that is missing, too old, already loaded, or installed twice.

Against an installed wheel (scripts/python_test.sh sets UCXRS_TEST_UCX=wheel) UCX must come
from the libucx wheel; against a build from source on Debian's UCX (UCXRS_TEST_UCX=system),
from the system. Each case runs in a fresh interpreter, since UCX is loaded once per process.
"""

import ctypes.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import ucxrs
from ucxrs import _load, _ucxrs

EXPECT = os.environ.get("UCXRS_TEST_UCX")  # "wheel", "system" or unset (either)
BUILT = _ucxrs.built_against_ucx()
PACKAGE_DIR = os.path.dirname(os.path.abspath(ucxrs.__file__))


def run(code, env=None, args=()):
    """Runs `code` in a fresh interpreter; returns (exit status, stdout + stderr)."""
    e = dict(os.environ)
    for k in ("PYTHONPATH", "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(code)],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    return p.returncode, p.stdout + p.stderr


def system_libucp():
    """Debian's (or another system's) libucp, and its version, or (None, None)."""
    name = ctypes.util.find_library("ucp")
    if name is None:
        return None, None
    rc, out = run(
        f"""
        import ctypes
        lib = ctypes.CDLL({name!r})
        v = [ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()]
        lib.ucp_get_version(*map(ctypes.byref, v))
        print(*[x.value for x in v])
        """
    )
    assert rc == 0, out
    return name, tuple(int(x) for x in out.split())


def require(condition, why):
    """Skips a case whose precondition this machine lacks; in CI that is a failure."""
    if not condition:
        if os.environ.get("CI"):
            pytest.fail(f"CI is expected to have this: {why}")
        pytest.skip(why)


def test_one_ucx_from_where_it_should_be():
    """This process mapped one libucp, the one ucx_library() names; from the libucx wheel when
    one is installed (and UCX was not loaded before), from the system otherwise."""
    mapped = [os.path.realpath(p) for p in _load.mapped_libucp()]
    assert len(mapped) == 1, mapped
    assert mapped[0] == os.path.realpath(ucxrs.ucx_library())
    assert ucxrs.__ucx_version__ == "%d.%d.%d" % ucxrs.get_ucx_version()
    assert tuple(ucxrs.get_ucx_version()[:2]) >= BUILT
    try:
        import libucx
    except ImportError:
        libucx = None
    if EXPECT == "wheel":
        assert libucx is not None, "the wheel's dependency, libucx, is not installed"
        assert "site-packages" in PACKAGE_DIR, f"testing {PACKAGE_DIR}, not the installed wheel"
    if EXPECT == "system":
        assert libucx is None, "a build on the system's UCX, with a libucx wheel installed"
    if libucx is not None:
        lib = os.path.realpath(os.path.join(os.path.dirname(libucx.__file__), "lib"))
        assert mapped[0].startswith(lib + os.sep), (mapped, lib)
        assert _load.LOADED["source"] == "libucx wheel"
    else:
        assert "site-packages" not in mapped[0], mapped
        assert _load.LOADED["source"].startswith("system")


def test_python_m_ucxrs_reports_the_installation():
    p = subprocess.run(
        [sys.executable, "-m", "ucxrs"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert p.returncode == 0, p.stdout + p.stderr
    fields = dict(
        (k.strip(), v.strip()) for k, v in (l.split(":", 1) for l in p.stdout.splitlines())
    )
    assert fields["ucxrs"].startswith(ucxrs.__version__), fields
    assert PACKAGE_DIR in fields["ucxrs"]
    assert fields["UCX"] == f"{ucxrs.__ucx_version__} (built against {BUILT[0]}.{BUILT[1]})"
    assert os.path.realpath(fields["libucp"]) == os.path.realpath(ucxrs.ucx_library())
    assert fields["found as"] == _load.LOADED["source"]
    # Loopback is always there: UCX's self and TCP transports at least.
    tls = fields["transports"].split(", ")
    assert any(t.startswith("self/") for t in tls) and any(t.startswith("tcp/") for t in tls), tls
    assert fields["CUDA"] in ("zero-copy", "staged", "unavailable", "not built")
    assert fields["progress mode"] == os.environ.get("UCXPY_PROGRESS_MODE", "thread")
    assert "warning" not in fields


def test_transports_parsed_from_ucx_context_info():
    from ucxrs.__main__ import transports

    text = "#      resource 0  :  md 0  dev 0  flags -- self/memory\n#      resource 1  :  md 1  dev 1  flags -- tcp/lo\n"
    assert transports(text) == ["self/memory", "tcp/lo"]
    ucxrs.init()
    assert "tcp/lo" in transports(_ucxrs.ucx_context_info())


def test_a_ucx_loaded_before_is_used_or_refused_clearly():
    """An MPI library (here: ctypes) loaded the system's UCX before ucxrs: ucxrs uses that copy
    rather than load a second, and refuses it, saying why, when it is older than the UCX it was
    built against."""
    name, version = system_libucp()
    require(name is not None, "no system UCX (Debian: libucx0)")
    rc, out = run(
        f"""
        import ctypes
        ctypes.CDLL({name!r}, ctypes.RTLD_GLOBAL)
        import ucxrs
        from ucxrs import _load
        print("MAPPED", _load.mapped_libucp())
        print("SOURCE", _load.LOADED["source"])
        """
    )
    if version[:2] < BUILT:
        assert rc != 0
        assert "ImportError" in out and f"built against UCX {BUILT[0]}.{BUILT[1]}" in out, out
        assert "already loaded in this process" in out, out
        assert "%d.%d.%d" % version in out, out
    else:
        assert rc == 0, out
        mapped = eval(out.split("MAPPED", 1)[1].split("\n", 1)[0])
        assert len(mapped) == 1, out
        assert "already loaded" in out.split("SOURCE", 1)[1], out


def test_prefer_system_library():
    """RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true, as UCXX honours it: with a libucx wheel
    installed, the system's UCX is tried first, and refused clearly when older than the UCX
    this was built against; without one, the variable changes nothing."""
    name, version = system_libucp()
    require(name is not None, "no system UCX (Debian: libucx0)")
    rc, out = run(
        "import ucxrs; from ucxrs import _load; print('SOURCE', _load.LOADED['source'])",
        env={"RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY": "true"},
    )
    try:
        import libucx  # noqa: F401

        has_wheel = True
    except ImportError:
        has_wheel = False
    # libucx.load_library() opens the system's libucs.so and libucp.so (the unversioned names
    # that Debian's libucx-dev provides) when the variable is set.
    system_dev = _find_lib_path("libucs.so") is not None and _find_lib_path("libucp.so") is not None
    if has_wheel and system_dev and version[:2] < BUILT:
        assert rc != 0, out
        assert "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY is set" in out, out
        assert "%d.%d.%d" % version in out, out
    else:
        assert rc == 0, out


def _find_lib_path(soname):
    """Where the dynamic linker's cache has `soname`."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith(soname + " ") and "x86-64" in line:
            return line.rsplit("=>", 1)[1].strip()
    return None


def isolated(tmp_path, dists=()):
    """A folder that holds only this package and its distribution's metadata (or, when
    `dists` are given, those distributions' metadata, made up), for an interpreter run with
    -I -S: no site-packages, so no libucx wheel."""
    os.symlink(PACKAGE_DIR, tmp_path / "ucxrs")
    dist, _ = _load.own_distribution()
    for entry in [] if dists else os.listdir(os.path.dirname(PACKAGE_DIR)):
        if dist and entry.startswith(dist.replace("-", "_") + "-") and entry.endswith(".dist-info"):
            os.symlink(os.path.join(os.path.dirname(PACKAGE_DIR), entry), tmp_path / entry)
    for name, version in dists:
        d = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(tmp_path)


def test_without_the_libucx_wheel(tmp_path):
    """The wheel installed without its dependency (pip install --no-deps): the system's UCX,
    if any, is tried, and refused with what to install when older than the one built against;
    a build from source on the system's UCX runs on it."""
    path = isolated(tmp_path)
    rc, out = run(
        f"import sys; sys.path.insert(0, {path!r}); import ucxrs; print('UCX', ucxrs.__ucx_version__)",
        args=("-I", "-S"),
    )
    name, version = system_libucp()
    if name is None:
        assert rc != 0 and "needs UCX's libraries" in out, out
    elif version[:2] < BUILT:
        assert rc != 0, out
        assert f"built against UCX {BUILT[0]}.{BUILT[1]}" in out and "pip install" in out, out
        dist, _ = _load.own_distribution()
        if dist in ("ucxrs-cu12", "ucxrs-cu13"):
            assert f'pip install "libucx-{dist[-4:]}' in out, out
    else:
        assert rc == 0 and "UCX %d.%d" % version[:2] in out, out


def test_no_ucx_at_all(tmp_path):
    """No UCX anywhere (the system's hidden in a mount namespace, no libucx wheel on the path):
    an ImportError that says what to install, not only the loader's message."""
    require(os.geteuid() == 0 and shutil.which("unshare"), "needs root and unshare to hide the system's UCX")
    path = isolated(tmp_path)
    hide = [p for p in {_find_lib_path("libucp.so.0"), _find_lib_path("libucs.so.0")} if p]
    mounts = " && ".join(f"mount --bind /dev/null {p}" for p in hide) or "true"
    code = f"import sys; sys.path.insert(0, {path!r}); import ucxrs"
    p = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'{mounts} && exec "$0" -I -S -c "$1"', sys.executable, code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "ImportError: ucxrs needs UCX's libraries" in out, out
    assert "pip install" in out, out


def test_two_variants_installed_warn(tmp_path):
    """libucx-cu12 and libucx-cu13 side by side share one folder (and ucxrs-cu12 and
    ucxrs-cu13 too): importing says so, with what to do."""
    path = isolated(
        tmp_path,
        dists=[("libucx-cu12", "1.22.0"), ("libucx-cu13", "1.22.0"), ("ucxrs-cu12", "0.1.0"), ("ucxrs-cu13", "0.1.0")],
    )
    rc, out = run(
        f"""
        import sys, warnings
        sys.path.insert(0, {path!r})
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                import ucxrs
            except ImportError:
                pass  # no UCX on this isolated path may be new enough: the warnings came first
        for x in w:
            print("WARNING", x.category.__name__, x.message)
        """,
        args=("-I", "-S"),
    )
    assert rc == 0, out
    warned = [l for l in out.splitlines() if l.startswith("WARNING RuntimeWarning")]
    assert len(warned) == 2, out
    assert "libucx-cu12 1.22.0 and libucx-cu13 1.22.0 are installed" in warned[0]
    assert "pip uninstall -y libucx-cu12 libucx-cu13" in warned[0]
    assert "ucxrs-cu12 and ucxrs-cu13 are installed" in warned[1]
