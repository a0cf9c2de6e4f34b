//! The `dask-comm` command: `scheduler`, `worker` and `bench` (see `dask_comm::cli`).

fn main() {
    // The benchmark's functions, which `dask-comm bench` and its workers run.
    dask_comm::cli::register_bench_functions();
    std::process::exit(dask_comm::cli::main());
}
