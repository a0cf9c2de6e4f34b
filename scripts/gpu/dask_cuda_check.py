"""dask-cuda on the ucxrs:// comm, a step of the GPU proof (scripts/gpu/prove.sh).

Starts a LocalCUDACluster(protocol="ucxrs") with an RMM pool on each worker, as dask-cuda users
start one, and moves CuPy arrays and RMM buffers between the client and the workers (and between
workers, given two GPUs), every byte checked:

    python scripts/gpu/dask_cuda_check.py [--pool 1GB]

Needs a GPU, CuPy, RMM and dask-cuda (the GPU bundle carries the last two). Prints a line per
check, and exits non-zero at the first that fails.
"""

import argparse
import os
import sys
import time

# Dask-cuda sets this for its own UCX protocols only ("ucx", "ucxx"); a user of ucxrs:// sets
# it so that each worker's CUDA context exists before UCX starts (docs/dask.md). In the
# environment, so that the worker processes have it too.
os.environ.setdefault("DASK_DISTRIBUTED__COMM__UCX__CREATE_CUDA_CONTEXT", "True")


def plus_one(a):
    return a + 1


def same(a):
    return a


def worker_report(dask_worker):
    import rmm

    from ucxrs import _ucxrs
    import ucxrs

    return {
        "address": dask_worker.address,
        "cuda_support": ucxrs.cuda_support(),
        "rmm_resource": type(rmm.mr.get_current_device_resource()).__name__,
        "frames_into_rmm": _ucxrs.device_frame_allocator() is not None,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def stored_kinds(dask_worker):
    return sorted({type(v).__module__ + "." + type(v).__name__ for v in dask_worker.data.values()})


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="1GB", help="each worker's RMM pool (rmm_pool_size)")
    args = ap.parse_args()

    import cupy
    import numpy as np
    import rmm
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    gpus = cupy.cuda.runtime.getDeviceCount()
    start = time.monotonic()
    with LocalCUDACluster(
        protocol="ucxrs",
        rmm_pool_size=args.pool,
        threads_per_worker=1,
        dashboard_address=None,
        death_timeout=60,
    ) as cluster, Client(cluster, timeout=60) as client:
        client.wait_for_workers(gpus, timeout=120)
        check("the scheduler is on ucxrs://", cluster.scheduler_address.startswith("ucxrs://"),
              cluster.scheduler_address)
        reports = client.run(worker_report)
        check(f"one worker per GPU ({gpus})", len(reports) == gpus, str(len(reports)))
        for addr, r in sorted(reports.items()):
            check(f"worker {addr} is on ucxrs://", addr.startswith("ucxrs://"))
            check(f"worker {addr}: RMM pool from dask-cuda", "Pool" in r["rmm_resource"], r["rmm_resource"])
            check(f"worker {addr}: device frames land in RMM's memory", r["frames_into_rmm"])
            print(f"     worker {addr}: CUDA_VISIBLE_DEVICES={r['visible']}, UCX CUDA support: "
                  f"{r['cuda_support']}", flush=True)

        # Client -> scheduler -> worker and back: CuPy arrays, every byte checked.
        for n in (0, 1000, 1 << 20, 64 << 20):
            x = cupy.arange(n, dtype="u1")
            [fx] = client.scatter([x])
            y = client.submit(plus_one, fx).result(timeout=60)
            check(f"CuPy {n} bytes, client to worker and back", isinstance(y, cupy.ndarray)
                  and y.shape == x.shape and bool((y == x + 1).all()), type(y).__name__)
        kinds = set().union(*client.run(stored_kinds).values())
        check("the workers hold CuPy arrays", "cupy.ndarray" in kinds, str(sorted(kinds)))

        # RMM's DeviceBuffer travels as itself (Dask's RMM deserialiser takes nothing else).
        for n in (0, 4096, 8 << 20):
            host = (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
            buf = rmm.DeviceBuffer.to_device(host.tobytes())
            [fb] = client.scatter([buf])
            back = client.submit(same, fb).result(timeout=60)
            check(f"rmm.DeviceBuffer {n} bytes, client to worker and back",
                  isinstance(back, rmm.DeviceBuffer) and back.size == n
                  and bytes(back.copy_to_host().tobytes()) == host.tobytes(), type(back).__name__)

        # Worker to worker, device memory through the comm (two GPUs or more).
        if gpus >= 2:
            a, b = sorted(reports)[:2]
            made = client.submit(cupy.full, 32 << 20, 7, dtype="u1", workers=[a], pure=False)
            wait(made)
            got = client.submit(lambda v: float(v.sum(dtype="f8")), made, workers=[b], pure=False)
            check("CuPy 32 MiB from one worker to another", got.result(timeout=60) == 7.0 * (32 << 20))
        else:
            print("     one GPU: one worker, so no worker-to-worker transfer here", flush=True)

        # A dask.array of CuPy chunks, against NumPy.
        ref = np.arange(4_000_000, dtype="f8")
        total = (da.from_array(ref, chunks=500_000).map_blocks(cupy.asarray) * 2).sum().compute()
        check("a dask.array of CuPy chunks sums as NumPy does", float(total) == float((ref * 2).sum()))
    print(f"dask-cuda on ucxrs: every check passed ({time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
