//! The client's blocking view: [`Client::blocking`] gives the same calls as the async
//! methods, each run to its end on the client's runtime, for synchronous code (not to be used
//! from inside an async task: it would block that task's thread).

use std::time::Duration;

use dask_graph::{Arg, Callable, Graph, Key, Name, Value};
use transport::Address;

use super::{Client, DFuture, SubmitOptions};
use crate::error::Result;
use crate::protocol::Transfer;
use crate::runtime::block_on;
use crate::security::Secret;

/// A blocking view of a [`Client`]: `client.blocking().gather(&futures)` is
/// `client.gather(&futures).await` for code that is not async.
///
/// ```no_run
/// # fn doc(client: &dask_comm::Client) -> dask_comm::Result<()> {
/// let inc = dask_graph::registry().register("inc-blocking-doc", |x: i64| x + 1);
/// let futures = client.blocking().map(inc, [1i64, 2, 3])?;
/// let values = client.blocking().gather(&futures)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Blocking<'a> {
    client: &'a Client,
}

impl Client {
    /// [`Client::connect`], blocking.
    pub fn connect_blocking(address: &Address, secret: Secret) -> Result<Client> {
        block_on(Client::connect(address, secret))
    }

    /// The blocking view of this client.
    pub fn blocking(&self) -> Blocking<'_> {
        Blocking { client: self }
    }
}

impl Blocking<'_> {
    /// [`Client::retire_workers`], blocking.
    pub fn retire_workers(&self, addresses: &[String]) -> Result<Vec<String>> {
        block_on(self.client.retire_workers(addresses))
    }

    /// [`Client::submit`], blocking.
    pub fn submit(&self, func: impl Into<Name>, args: Vec<Arg>) -> Result<DFuture> {
        block_on(self.client.submit(func, args))
    }

    /// [`Client::submit_with`], blocking.
    pub fn submit_with(
        &self,
        func: impl Into<Name>,
        args: Vec<Arg>,
        opts: &SubmitOptions,
    ) -> Result<DFuture> {
        block_on(self.client.submit_with(func, args, opts))
    }

    /// [`Client::map`], blocking.
    pub fn map<T: dask_graph::Data>(
        &self,
        func: impl Callable<(T,)>,
        items: impl IntoIterator<Item = T>,
    ) -> Result<Vec<DFuture>> {
        block_on(self.client.map(func, items))
    }

    /// [`Client::transfer_log`], blocking.
    pub fn transfer_log(&self) -> Result<Vec<(String, Vec<Transfer>)>> {
        block_on(self.client.transfer_log())
    }

    /// [`Client::holders`], blocking.
    pub fn holders(&self, futures: &[DFuture]) -> Result<Vec<(Key, Vec<String>)>> {
        block_on(self.client.holders(futures))
    }

    /// [`Client::persist`], blocking.
    pub fn persist(&self, graph: Graph, keys: &[Key]) -> Result<Vec<DFuture>> {
        block_on(self.client.persist(graph, keys))
    }

    /// [`Client::persist_with`], blocking.
    pub fn persist_with(
        &self,
        graph: Graph,
        keys: &[Key],
        opts: &SubmitOptions,
    ) -> Result<Vec<DFuture>> {
        block_on(self.client.persist_with(graph, keys, opts))
    }

    /// [`Client::compute`], blocking.
    pub fn compute(&self, graph: Graph, keys: &[Key]) -> Result<Vec<Value>> {
        block_on(self.client.compute(graph, keys))
    }

    /// [`Client::compute_with`], blocking.
    pub fn compute_with(
        &self,
        graph: Graph,
        keys: &[Key],
        opts: &SubmitOptions,
    ) -> Result<Vec<Value>> {
        block_on(self.client.compute_with(graph, keys, opts))
    }

    /// [`Client::gather`], blocking.
    pub fn gather(&self, futures: &[DFuture]) -> Result<Vec<Value>> {
        block_on(self.client.gather(futures))
    }

    /// [`Client::scatter`], blocking.
    pub fn scatter(&self, values: Vec<Value>) -> Result<Vec<DFuture>> {
        block_on(self.client.scatter(values))
    }

    /// [`Client::wait`], blocking.
    pub fn wait(&self, futures: &[DFuture]) -> Result<()> {
        block_on(self.client.wait(futures))
    }

    /// [`Client::cancel`], blocking.
    pub fn cancel(&self, futures: &[DFuture]) -> Result<()> {
        block_on(self.client.cancel(futures))
    }

    /// [`Client::wait_for_workers`], blocking.
    pub fn wait_for_workers(&self, n: usize, limit: Duration) -> Result<()> {
        block_on(self.client.wait_for_workers(n, limit))
    }

    /// [`Client::shutdown`], blocking.
    pub fn shutdown(&self, limit: Duration) -> Result<()> {
        block_on(self.client.shutdown(limit))
    }

    /// [`Client::close`], blocking (errors are logged: the connection is gone either way).
    pub fn close(&self) {
        if let Err(e) = block_on(self.client.close()) {
            tracing::debug!(error = %e, "closing the client");
        }
    }
}
