"""Which UCX the native module runs on, loaded before it is imported.

In order (the first that applies):

1. a UCX this process has already loaded (an MPI library, or UCXX, loaded one first): it is
   used as it is, since two copies of UCX in one process would each install their own memory
   hooks and signal handlers;
2. the libucx wheel's (``libucx-cu12`` or ``libucx-cu13``, what ``ucxrs-cu12`` and
   ``ucxrs-cu13`` depend on), through ``libucx.load_library()`` as UCXX loads it: UCX then finds
   its transport modules beside its libraries, with no variable set.
   ``RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true`` makes that function try the system's first;
3. otherwise the dynamic linker's search (``LD_LIBRARY_PATH``, the system's UCX: a from-source
   build against Debian's ``libucx-dev``).

The native module then refuses a UCX older than the one it was built against. Whatever goes
wrong becomes an ``ImportError`` that says what was found and what to install.
"""

import importlib.metadata as _md
import os
import warnings

#: How UCX was found, for ``python -m ucxrs``: ``source`` ("already loaded", "libucx wheel",
#: "system"), and ``libucx`` (the libucx wheel's distribution and version, if one is installed).
LOADED = {}

_LIBUCX_DISTRIBUTIONS = ("libucx-cu12", "libucx-cu13")
_OWN_DISTRIBUTIONS = ("ucxrs-cu12", "ucxrs-cu13", "ucxrs")


def _installed(names):
    """``{distribution: version}`` of those of ``names`` that are installed."""
    found = {}
    for name in names:
        try:
            found[name] = _md.version(name)
        except _md.PackageNotFoundError:
            pass
    return found


def mapped_libucp():
    """The ``libucp`` files this process has mapped, in the order the kernel lists them."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    if os.path.basename(path).startswith("libucp.so") and path not in paths:
                        paths.append(path)
    except OSError:  # not Linux, or no /proc: the loader's search decides
        pass
    return paths


def own_distribution():
    """The distribution this package came from (``ucxrs-cu12``, ``ucxrs-cu13``, or ``ucxrs``
    for a build from source), and its version."""
    try:
        names = _md.packages_distributions().get("ucxrs", [])
    except Exception:  # a broken metadata folder elsewhere on sys.path
        names = []
    installed = _installed(_OWN_DISTRIBUTIONS)
    for name in _OWN_DISTRIBUTIONS:
        if name in installed and (name in names or not names):
            return name, installed[name]
    return None, None


def _ucx_requirement(dist):
    """This distribution's requirement on the libucx wheel (``libucx-cu12>=1.19.0,<1.23``)."""
    if dist is None:
        return None
    try:
        requires = _md.requires(dist) or []
    except _md.PackageNotFoundError:
        return None
    for req in requires:
        if req.replace("_", "-").lower().startswith("libucx-"):
            return req.split(";")[0].replace(" ", "")
    return None


def _what_to_install(dist):
    req = _ucx_requirement(dist)
    if req is not None:
        return f'pip install "{req}" (what {dist} depends on)'
    return (
        "pip install ucxrs-cu12 (or ucxrs-cu13): wheels that bring UCX as the libucx wheel; or "
        "give this build from source the UCX it was built against (Debian: apt-get install "
        "libucx0), or rebuild it against the UCX you have (pip install ./python, with UCX_PREFIX "
        "for a UCX outside pkg-config's reach)"
    )


def _check_distributions():
    libucx = _installed(_LIBUCX_DISTRIBUTIONS)
    if len(libucx) > 1:
        warnings.warn(
            f"both {' and '.join(f'{d} {v}' for d, v in libucx.items())} are installed: they "
            "share the `libucx` folder, so the one installed last has overwritten the other's "
            "files, and uninstalling either removes both. Keep the one for your CUDA: "
            "pip uninstall -y libucx-cu12 libucx-cu13, then pip install libucx-cu12 (or -cu13).",
            RuntimeWarning,
            stacklevel=3,
        )
    own = _installed(_OWN_DISTRIBUTIONS[:2])
    if len(own) > 1:
        warnings.warn(
            f"both {' and '.join(own)} are installed: they are the same package for two CUDA "
            "versions and share the `ucxrs` folder; uninstall one (pip uninstall -y "
            "ucxrs-cu12 ucxrs-cu13, then install the one for your CUDA).",
            RuntimeWarning,
            stacklevel=3,
        )
    return libucx


def load():
    """Loads UCX as the module docstring says and imports the native module; returns it."""
    libucx_dists = _check_distributions()
    LOADED["libucx"] = ", ".join(f"{d} {v}" for d, v in libucx_dists.items()) or None
    prefer_system = os.getenv("RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY", "false").lower() != "false"
    before = mapped_libucp()
    if before:
        LOADED["source"] = "already loaded in this process before ucxrs"
    else:
        try:
            import libucx
        except ImportError:
            libucx = None
        if libucx is None:
            LOADED["source"] = "system (the dynamic linker's search)"
        else:
            try:
                libucx.load_library()
            except OSError as e:
                raise ImportError(
                    f"ucxrs: the libucx wheel ({LOADED['libucx']}) is installed, but its UCX "
                    f"did not load: {e}. Reinstall it: "
                    f"{_what_to_install(own_distribution()[0])} --force-reinstall"
                ) from e
            wheel_dir = os.path.dirname(os.path.abspath(libucx.__file__))
            now = mapped_libucp()
            if any(p.startswith(wheel_dir + os.sep) for p in now):
                LOADED["source"] = "libucx wheel"
            else:
                LOADED["source"] = (
                    "system (RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY)" if prefer_system else "system"
                )
    try:
        from . import _ucxrs
    except ImportError as e:
        raise ImportError(_explain(e, before, prefer_system)) from e
    return _ucxrs


def _explain(error, before, prefer_system):
    dist, _ = own_distribution()
    text = str(error)
    found = mapped_libucp()
    where = f" ({', '.join(found)})" if found else ""
    how = ""
    if before:
        how = (
            "UCX was already loaded in this process before ucxrs was imported (by another "
            "library: an MPI, say), and ucxrs uses that copy rather than load a second one; "
            "import ucxrs first to have both use the libucx wheel's. "
        )
    if prefer_system:
        how += (
            "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY is set, so the system's UCX was tried first; "
            "unset it to use the libucx wheel's. "
        )
    if "built against UCX" in text:
        if before and LOADED.get("libucx"):  # the wheel's UCX is there: the order is the fix
            return f"ucxrs: {text}. {how.rstrip()}"
        return f"ucxrs: {text}. {how}Install a newer UCX: {_what_to_install(dist)}."
    if "undefined symbol" in text or "version `" in text:
        return (
            f"ucxrs: the UCX this process loaded{where} does not match the one ucxrs was built "
            f"against ({text}). {how}Install the UCX it was built for: {_what_to_install(dist)}."
        )
    if any(f"{lib}.so" in text for lib in ("libucp", "libucs", "libuct", "libucm")):
        return (
            f"ucxrs needs UCX's libraries, and they could not be loaded ({text}). Install them: "
            f"{_what_to_install(dist)}."
        )
    return f"ucxrs: its native module did not load ({text}); UCX found{where or ': none'}."
