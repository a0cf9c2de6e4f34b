//! A Dask-like distributed task scheduler over `transport`.
pub mod core;
pub mod protocol;
pub mod spec;
