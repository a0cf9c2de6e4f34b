//! The `dask-comm` command: `scheduler`, `worker` and `bench` (see `dask_comm::cli`).

fn main() {
    std::process::exit(dask_comm::cli::main());
}
