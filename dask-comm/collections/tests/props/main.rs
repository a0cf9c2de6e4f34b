//! The collections' property tests, in one test binary (each binary links polars, faer and the
//! whole runtime: one binary instead of six keeps a debug build of them a sixth of the disk).
//! Every check runs on `Inline`, `Threaded` and one in-process `LocalCluster` they share.

mod common;

mod array;
mod async_compute;
mod bag;
mod frame;
mod linalg;
mod overlap;
mod shape;
