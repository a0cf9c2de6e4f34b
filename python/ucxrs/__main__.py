"""``python -m ucxrs``: what a bug report needs to say about this installation.

Prints the package's and UCX's versions, where ``libucp`` was loaded from and how it was found,
the transports UCX found, CUDA support and the progress mode, then exits 0; or prints why
``ucxrs`` could not be imported and exits 1.
"""

import os
import platform
import re
import sys

#: The variables that change which UCX is loaded and how it behaves.
_VARIABLES = ("UCX_TLS", "UCX_NET_DEVICES", "UCX_MODULE_DIR", "LD_LIBRARY_PATH",
              "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY", "UCXPY_PROGRESS_MODE")


def transports(info):
    """``tl/device`` of each transport resource in ``ucp_context_print_info``'s text."""
    found = []
    for line in info.splitlines():
        m = re.search(r"resource\s+\d+\s*:.*--\s*(\S+/\S+)", line)
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def report():
    lines = [f"Python:          {platform.python_version()} ({sys.executable})"]
    try:
        import ucxrs
    except ImportError as e:
        lines.append(f"ucxrs:           cannot be imported: {e}")
        return lines, 1
    from ucxrs import _load, _ucxrs

    dist, version = _load.own_distribution()
    lines.append(
        f"ucxrs:           {ucxrs.__version__} ({dist or 'no distribution metadata'}"
        f"{' ' + version if version and version != ucxrs.__version__ else ''}) at "
        f"{os.path.dirname(ucxrs.__file__)}"
    )
    built = "%d.%d" % _ucxrs.built_against_ucx()
    lines.append(f"UCX:             {ucxrs.__ucx_version__} (built against {built})")
    lines.append(f"libucp:          {ucxrs.ucx_library() or 'not found'}")
    lines.append(f"found as:        {_load.LOADED.get('source')}")
    lines.append(f"libucx wheel:    {_load.LOADED.get('libucx') or 'not installed'}")
    mapped = _load.mapped_libucp()
    if len(mapped) > 1:
        lines.append(f"warning:         {len(mapped)} copies of libucp in this process: {mapped}")
    env = {k: os.environ[k] for k in _VARIABLES if k in os.environ}
    lines.append(f"environment:     {env or 'none of ' + ', '.join(_VARIABLES)}")
    rc = 0
    try:
        ucxrs.init()
        tls = transports(_ucxrs.ucx_context_info())
        lines.append(f"transports:      {', '.join(tls) or 'none'}")
        lines.append(f"CUDA:            {ucxrs.cuda_support()}")
        lines.append(f"progress mode:   {ucxrs.progress_mode()}")
    except Exception as e:  # a UCX that loads but cannot make a context: say so, fail
        lines.append(f"UCX context:     could not be created: {type(e).__name__}: {e}")
        rc = 1
    finally:
        try:
            ucxrs.reset()
        except Exception:
            pass
    return lines, rc


if __name__ == "__main__":
    out, code = report()
    print("\n".join(out))
    sys.exit(code)
