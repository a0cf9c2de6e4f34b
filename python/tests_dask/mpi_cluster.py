"""Run by test_cluster.py under mpirun (4 ranks): dask-mpi's initialize makes rank 0 the
scheduler, rank 1 this client and the other ranks workers, all on ucxrs://."""

from dask_mpi import initialize

initialize(protocol="ucxrs", nthreads=1, dashboard=False)

import dask.array as da  # noqa: E402
from distributed import Client  # noqa: E402

with Client() as c:
    c.wait_for_workers(2, timeout=120)
    workers = list(c.scheduler_info()["workers"])
    assert len(workers) == 2 and all(w.startswith("ucxrs://") for w in workers), workers
    assert c.gather(c.map(lambda i: i * i, range(100))) == [i * i for i in range(100)]
    x = da.ones((2000, 2000), chunks=500)
    assert float((x @ x.T).sum().compute()) == 2000.0**3
    print("dask-mpi on ucxrs: all answers right", flush=True)
