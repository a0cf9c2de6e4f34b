//! The `dask-comm` command: `scheduler`, `worker` and `bench` (see `dask_comm::cli`).

fn main() {
    dask_comm::bench::register();
    std::process::exit(dask_comm::cli::main());
}
