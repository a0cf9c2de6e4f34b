//! This process's GPU for device blocks: its context and stream, the kernels loaded so far and
//! a cuBLAS handle, opened on first use.
//!
//! A worker uses the first GPU it can see: one worker per GPU comes from giving each worker
//! process its own `CUDA_VISIBLE_DEVICES` (`dask_comm::ClusterOptions::gpus`), as dask-cuda's
//! `LocalCUDACluster` does. Work goes on the context's default stream, the one the transport
//! lands received device frames on, so a kernel is ordered after the receive that filled its
//! input; every device task waits for its stream before it returns, so a block is complete
//! before anything (a send, another process) reads it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::result as blas;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ucx::cuda::DeviceBuffer;

use super::ptx::Kernel;

/// The GPU, its stream, the kernels loaded and cuBLAS.
pub(crate) struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Mutex<HashMap<String, CudaFunction>>,
    blas: Mutex<Option<Blas>>,
}

/// A cuBLAS handle bound to the GPU's stream.
struct Blas(blas_sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread, one at a time: it lives behind the
// `Gpu`'s mutex, which every use holds.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasCreate` and is destroyed once, here.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// The GPU, opened on first use; the reason where none can be used (no driver, no GPU).
pub(crate) fn gpu() -> Result<&'static Gpu, String> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        let ctx = ucx::cuda::open(0).map_err(|e| format!("no GPU for device blocks: {e}"))?;
        let stream = ctx.default_stream();
        tracing::info!(ordinal = ctx.ordinal(), "device blocks on this GPU");
        Ok(Gpu {
            ctx,
            stream,
            kernels: Mutex::new(HashMap::new()),
            blas: Mutex::new(None),
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn driver(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Threads per block of every launch; grids stop growing at `MAX_BLOCKS` (the kernels loop).
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

impl Gpu {
    /// The stream device blocks are made on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Makes the context current on this thread (task threads are the scheduler's).
    pub(crate) fn bind(&self) -> Result<(), String> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("making the GPU's context current"))
    }

    /// An uninitialised buffer of `len` bytes on the stream.
    pub(crate) fn alloc(&self, len: usize) -> Result<DeviceBuffer, String> {
        let mut b = DeviceBuffer::alloc(&self.stream, len).map_err(|e| e.to_string())?;
        b.set_len(len).map_err(|e| e.to_string())?;
        Ok(b)
    }

    /// `kernel`'s function, loading its module the first time.
    fn function(&self, kernel: &Kernel) -> Result<CudaFunction, String> {
        let mut loaded = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = loaded.get(&kernel.name) {
            return Ok(f.clone());
        }
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(kernel.ptx.clone()))
            .map_err(|e| format!("loading kernel {}: {e}", kernel.name))?;
        let f = module
            .load_function(&kernel.name)
            .map_err(|e| format!("finding kernel {}: {e}", kernel.name))?;
        loaded.insert(kernel.name.clone(), f.clone());
        Ok(f)
    }

    /// Launches `kernel` over `n` elements (grid-stride) with `args` as its parameters, which
    /// must be exactly the kernel's: device pointers and counts as `u64`, scalars as `f64`.
    ///
    /// # Safety
    ///
    /// `args` must match the kernel's parameters in number and type, every pointer among them
    /// must be a live allocation of this GPU holding as many elements as the kernel reads or
    /// writes through it (`n`, or the kernel's own count), and nothing else may write the
    /// output while the stream runs it.
    pub(crate) unsafe fn launch(
        &self,
        kernel: &Kernel,
        n: u64,
        args: &[Param],
    ) -> Result<(), String> {
        let f = self.function(kernel)?;
        let blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MAX_BLOCKS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&f);
        for a in args {
            match a {
                Param::U64(v) => launch.arg(v),
                Param::F64(v) => launch.arg(v),
            };
        }
        // SAFETY: the caller's contract: the parameters are the kernel's, the memory theirs.
        unsafe { launch.launch(cfg) }.map_err(|e| format!("launching {}: {e}", kernel.name))?;
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` on the stream.
    ///
    /// # Safety
    ///
    /// Both must be allocations of this GPU with `len` bytes from those addresses.
    pub(crate) unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, len, self.stream.cu_stream()) }
            .map_err(driver("copying device memory"))
    }

    /// Waits for the stream: what was queued on it is done (errors of kernels surface here).
    pub(crate) fn finish(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(driver("waiting for the GPU"))
    }

    /// `c = a · b` for row-major `a` (m × k) and `b` (k × n) in `f32` or `f64` (`double`),
    /// added to `c` when `accumulate` (else written), with cuBLAS on the stream.
    ///
    /// # Safety
    ///
    /// The pointers must be allocations of this GPU holding `m·k`, `k·n` and `m·n` elements of
    /// the type `double` says; nothing else may write `c` meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm(
        &self,
        double: bool,
        (m, k, n): (usize, usize, usize),
        a: u64,
        b: u64,
        c: u64,
        accumulate: bool,
    ) -> Result<(), String> {
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| format!("a matrix side of {v} is past cuBLAS's"))
        };
        let (mi, ki, ni) = (dim(m)?, dim(k)?, dim(n)?);
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // An empty sum: zeros (cuBLAS wants leading dimensions of at least one).
            if !accumulate {
                let len = m * n * if double { 8 } else { 4 };
                // SAFETY: `c` holds `m·n` elements of that size (the caller's contract).
                unsafe {
                    cudarc::driver::result::memset_d8_async(c, 0, len, self.stream.cu_stream())
                }
                .map_err(driver("zeroing a matrix"))?;
            }
            return Ok(());
        }
        let mut held = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_none() {
            // SAFETY: only tries to dlopen the library (and closes it again).
            if !unsafe { blas_sys::is_culib_present() } {
                return Err("matmul on the device needs cuBLAS: libcublas.so was not found (put its folder on LD_LIBRARY_PATH)".into());
            }
            let h = blas::create_handle().map_err(|e| format!("cublasCreate: {e}"))?;
            let h = Blas(h);
            // SAFETY: the handle is live; the stream is the GPU's, alive as long as the `Gpu`
            // (the process).
            unsafe { blas::set_stream(h.0, self.stream.cu_stream() as _) }
                .map_err(|e| format!("cublasSetStream: {e}"))?;
            *held = Some(h);
        }
        let h = held.as_ref().expect("created above").0;
        let op = blas_sys::cublasOperation_t::CUBLAS_OP_N;
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS sees B (n × k, leading n) times
        // A (k × m, leading k) into C (n × m, leading n), with no transposition.
        let (lda, ldb, ldc) = (ni, ki, ni);
        // The same call in either precision.
        macro_rules! gemm {
            ($f:path, $t:ty) => {{
                let (one, beta): ($t, $t) = (1.0, if accumulate { 1.0 } else { 0.0 });
                // SAFETY: the caller's contract on the pointers and sizes; alpha and beta are
                // host values, read during the call (the handle's default pointer mode).
                unsafe {
                    $f(
                        h,
                        op,
                        op,
                        ni,
                        mi,
                        ki,
                        &one,
                        b as *const $t,
                        lda,
                        a as *const $t,
                        ldb,
                        &beta,
                        c as *mut $t,
                        ldc,
                    )
                }
            }};
        }
        if double {
            gemm!(blas::dgemm, f64)
        } else {
            gemm!(blas::sgemm, f32)
        }
        .map_err(|e| format!("cuBLAS gemm: {e}"))
    }
}

/// A kernel parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param {
    /// A device pointer or a count.
    U64(u64),
    /// A scalar.
    F64(f64),
}
