//! The client's blocking twins: each `*_blocking` call runs its async form to the end on the
//! client's runtime, for synchronous code (not to be called from inside an async task).

use std::time::Duration;

use dask_graph::{Arg, Graph, Key, Value};
use transport::Address;

use super::{Client, DFuture, SubmitOptions};
use crate::error::Result;
use crate::protocol::Transfer;
use crate::runtime::block_on;
use crate::security::Secret;

impl Client {
    /// [`Client::connect`], blocking.
    pub fn connect_blocking(address: &Address, secret: Secret) -> Result<Client> {
        block_on(Client::connect(address, secret))
    }

    /// [`Client::retire_workers`], blocking.
    pub fn retire_workers_blocking(&self, addresses: &[String]) -> Result<Vec<String>> {
        block_on(self.retire_workers(addresses))
    }

    /// [`Client::submit_with`], blocking.
    pub fn submit_blocking_with(
        &self,
        func: &str,
        args: Vec<Arg>,
        opts: &SubmitOptions,
    ) -> Result<DFuture> {
        block_on(self.submit_with(func, args, opts))
    }

    /// [`Client::transfer_log`], blocking.
    pub fn transfer_log_blocking(&self) -> Result<Vec<(String, Vec<Transfer>)>> {
        block_on(self.transfer_log())
    }

    /// [`Client::holders`], blocking.
    pub fn holders_blocking(&self, futures: &[DFuture]) -> Result<Vec<(Key, Vec<String>)>> {
        block_on(self.holders(futures))
    }

    /// [`Client::persist`], blocking.
    pub fn persist_blocking(&self, graph: Graph, keys: &[Key]) -> Result<Vec<DFuture>> {
        block_on(self.persist(graph, keys))
    }

    /// [`Client::persist_with`], blocking.
    pub fn persist_blocking_with(
        &self,
        graph: Graph,
        keys: &[Key],
        opts: &SubmitOptions,
    ) -> Result<Vec<DFuture>> {
        block_on(self.persist_with(graph, keys, opts))
    }

    /// [`Client::compute`], blocking.
    pub fn compute_blocking(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>> {
        block_on(self.compute(graph, keys))
    }

    /// [`Client::submit`], blocking.
    pub fn submit_blocking(&self, func: &str, args: Vec<Arg>) -> Result<DFuture> {
        block_on(self.submit(func, args))
    }

    /// [`Client::map`], blocking.
    pub fn map_blocking<T: dask_graph::Data>(
        &self,
        func: &str,
        items: impl IntoIterator<Item = T>,
    ) -> Result<Vec<DFuture>> {
        block_on(self.map(func, items))
    }

    /// [`Client::gather`], blocking.
    pub fn gather_blocking(&self, futures: &[DFuture]) -> Result<Vec<Value>> {
        block_on(self.gather(futures))
    }

    /// [`Client::scatter`], blocking.
    pub fn scatter_blocking(&self, values: Vec<Value>) -> Result<Vec<DFuture>> {
        block_on(self.scatter(values))
    }

    /// [`Client::wait`], blocking.
    pub fn wait_blocking(&self, futures: &[DFuture]) -> Result<()> {
        block_on(self.wait(futures))
    }

    /// [`Client::cancel`], blocking.
    pub fn cancel_blocking(&self, futures: &[DFuture]) -> Result<()> {
        block_on(self.cancel(futures))
    }

    /// [`Client::wait_for_workers`], blocking.
    pub fn wait_for_workers_blocking(&self, n: usize, limit: Duration) -> Result<()> {
        block_on(self.wait_for_workers(n, limit))
    }

    /// [`Client::shutdown`], blocking.
    pub fn shutdown_blocking(&self, limit: Duration) -> Result<()> {
        block_on(self.shutdown(limit))
    }

    /// [`Client::close`], blocking (errors are logged: the connection is gone either way).
    pub fn close_blocking(&self) {
        if let Err(e) = block_on(self.close()) {
            tracing::debug!(error = %e, "closing the client");
        }
    }
}
