//! CUDA graphs for decode steps (issue 5 §1, switch `DECODE_CUDA_GRAPH`).
//!
//! A decode step launches a few hundred small kernels; launched one by one, the GPU waits for the
//! host between them. Here a step's work is recorded by stream capture instead of being launched,
//! then handed to the driver as one graph: the step's recorded graph *updates* an executable graph
//! kept from an earlier step of the same shape (`cuGraphExecUpdate`, which only rewrites the kernel
//! arguments that changed — positions, row counts, buffer addresses), or is instantiated once when
//! no kept graph has its topology, and launched with one call. Re-recording every step keeps the
//! forward code as it is (every scalar argument may change from step to step); the approach is
//! llama.cpp's (`ggml-cuda.cu`: capture each token, `cudaGraphExecUpdate`, instantiate on failure).
//!
//! Two things of an ordinary forward cannot be recorded and are replaced while capturing:
//! - **allocations**: a stream-ordered allocation would become a graph memory node, and graphs with
//!   memory nodes cannot be updated. [`Gpu::zeros`](super::gpu::Gpu::zeros) therefore returns a
//!   [`DevBuf`]: outside a capture a plain stream-ordered allocation, during one a block of the
//!   [`GraphPool`] (device memory allocated once, outside any stream, and reused; a block freed by
//!   the forward returns to the pool and may be handed out again later in the same step — safe
//!   because a graph captured from one stream runs its nodes in capture order);
//! - **uploads** from pageable host memory: [`Gpu::stage_upload`](super::gpu::Gpu::stage_upload)
//!   copies the data into pinned staging memory ([`PinnedStage`]) and records a host-to-device copy
//!   from there. The staging memory is rewritten only by the next capture, which first waits for
//!   the stream (so the previous graph has read it).
//!
//! A download or synchronisation inside a capture (the per-expert MoE path, any host-side decision
//! on device data) is refused with [`CudaError::Unsupported`]; the caller then restores the host
//! side of the sequence and runs the step without a graph (see `model::decode_step_gpu_dev`).
//!
//! Sources: CUDA driver API, stream capture (`cuStreamBeginCapture`, relaxed mode so that
//! `cuMemAlloc` stays legal while capturing), `cuGraphExecUpdate`, `cuGraphInstantiateWithFlags`,
//! `cuGraphLaunch`; PyTorch's CUDA-graph private memory pools for the pool idea.

use super::CudaError;
use cudarc::driver::{sys, CudaContext, CudaSlice, DeviceRepr, LaunchArgs, PushKernelArg};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

fn drv_res(what: &str, r: sys::CUresult) -> Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { what: what.into(), detail: format!("{r:?}") })
    }
}

/// The smallest pool block, bytes (every block is a power of two from here).
const MIN_BLOCK: usize = 256;

/// Executable graphs kept per device (one per step topology seen most recently).
pub const MAX_KEPT_GRAPHS: usize = 8;

/// A device buffer for the forward's temporaries: a `CudaSlice<T>` (through `Deref`) that is either
/// an ordinary stream-ordered allocation (freed on drop) or, while a decode step is being captured,
/// a block of the [`GraphPool`] (returned to the pool on drop).
pub struct DevBuf<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    pool: Option<(Arc<GraphPool>, usize)>,
}

impl<T> DevBuf<T> {
    /// An ordinary allocation.
    pub(crate) fn plain(slice: CudaSlice<T>) -> Self {
        DevBuf { slice: ManuallyDrop::new(slice), pool: None }
    }

    /// Whether the buffer is a pool block (allocated during a capture).
    pub fn pooled(&self) -> bool {
        self.pool.is_some()
    }
}

impl<T> std::ops::Deref for DevBuf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> std::ops::DerefMut for DevBuf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

// SAFETY: pushes the CudaSlice inside through cudarc's own implementation (the argument is the
// slice's device-pointer field, borrowed for 'b like the slice itself).
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b DevBuf<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DevBuf<T>) -> &mut Self {
        let s: &'b CudaSlice<T> = arg;
        <Self as PushKernelArg<&'b CudaSlice<T>>>::arg(self, s)
    }
}

// SAFETY: as for `&DevBuf`.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut DevBuf<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DevBuf<T>) -> &mut Self {
        let s: &'b mut CudaSlice<T> = arg;
        <Self as PushKernelArg<&'b mut CudaSlice<T>>>::arg(self, s)
    }
}

impl<T> Drop for DevBuf<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is taken exactly once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        match self.pool.take() {
            // The block goes back to the pool; `leak` hands over the pointer without freeing it
            // (event tracking is off, so it makes no driver call).
            Some((pool, bytes)) => pool.put(bytes, slice.leak()),
            None => drop(slice),
        }
    }
}

/// Device memory for the temporaries of captured steps: blocks of power-of-two sizes allocated with
/// `cuMemAlloc` (not stream-ordered, so legal during a relaxed capture and never a graph node),
/// kept for the life of the device and reused.
pub struct GraphPool {
    ctx: Arc<CudaContext>,
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    all: Mutex<Vec<sys::CUdeviceptr>>,
    bytes: AtomicU64,
}

impl GraphPool {
    fn new(ctx: Arc<CudaContext>) -> Self {
        GraphPool { ctx, free: Mutex::new(HashMap::new()), all: Mutex::new(Vec::new()), bytes: AtomicU64::new(0) }
    }

    /// Block size for `bytes`.
    fn block(bytes: usize) -> usize {
        bytes.max(MIN_BLOCK).next_power_of_two()
    }

    /// A free block of `block` bytes, allocating one if none is free.
    fn take(&self, block: usize) -> Result<sys::CUdeviceptr, CudaError> {
        if let Some(p) = self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&block).and_then(Vec::pop) {
            return Ok(p);
        }
        super::gpu::drv_bind(&self.ctx)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: plain allocation into a local; the context is current on this thread.
        drv_res("allocating graph pool memory", unsafe { sys::cuMemAlloc_v2(&mut p, block) })?;
        self.all.lock().unwrap_or_else(|e| e.into_inner()).push(p);
        self.bytes.fetch_add(block as u64, Ordering::Relaxed);
        Ok(p)
    }

    fn put(&self, block: usize, p: sys::CUdeviceptr) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(block).or_default().push(p);
    }

    /// Device bytes held by the pool.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        // Every DevBuf holds an Arc of the pool, so no block is in use here; the stream may still
        // run work on them: wait for the context first.
        if super::gpu::drv_bind(&self.ctx).is_err() {
            return;
        }
        let _ = self.ctx.synchronize();
        for p in self.all.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            // SAFETY: each pointer came from cuMemAlloc_v2 above and is freed once.
            unsafe { sys::cuMemFree_v2(p) };
        }
    }
}

/// Pinned host memory the uploads of a captured step are copied from (a bump allocator over
/// chunks allocated with `cuMemHostAlloc`, reset at the start of each capture).
pub struct PinnedStage {
    chunks: Vec<(*mut u8, usize)>,
    chunk: usize,
    used: usize,
}

// SAFETY: the raw pointers are pinned host allocations owned by this struct; every access goes
// through the Mutex in `GraphState`.
unsafe impl Send for PinnedStage {}

/// Smallest staging chunk, bytes.
const STAGE_CHUNK: usize = 1 << 20;

impl PinnedStage {
    fn reset(&mut self) {
        self.chunk = 0;
        self.used = 0;
    }

    /// Copies `data` into staging memory; returns its address there (256-byte aligned).
    fn push(&mut self, ctx: &Arc<CudaContext>, data: &[u8]) -> Result<*const u8, CudaError> {
        let need = data.len().max(1);
        loop {
            if let Some(&(base, cap)) = self.chunks.get(self.chunk) {
                let at = self.used.next_multiple_of(256);
                if at + need <= cap {
                    // SAFETY: `base .. base + cap` is one pinned allocation; `at + len ≤ cap`.
                    let dst = unsafe { base.add(at) };
                    // SAFETY: `data` and the staging memory do not overlap (host allocation of ours).
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
                    self.used = at + need;
                    return Ok(dst);
                }
                if self.chunk + 1 < self.chunks.len() {
                    self.chunk += 1;
                    self.used = 0;
                    continue;
                }
            }
            super::gpu::drv_bind(ctx)?;
            let cap = need.max(STAGE_CHUNK).next_power_of_two();
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: plain pinned allocation into a local (flags 0: portable not needed, one context).
            drv_res("allocating pinned staging memory", unsafe { sys::cuMemHostAlloc(&mut p, cap, 0) })?;
            self.chunks.push((p.cast(), cap));
            self.chunk = self.chunks.len() - 1;
            self.used = 0;
        }
    }
}

impl Drop for PinnedStage {
    fn drop(&mut self) {
        for (p, _) in self.chunks.drain(..) {
            // SAFETY: allocated by cuMemHostAlloc above, freed once (the owning GraphState waits
            // for the context before dropping it).
            unsafe { sys::cuMemFreeHost(p.cast()) };
        }
    }
}

/// A kept executable graph.
struct Exec(sys::CUgraphExec);

// SAFETY: an executable graph handle is used only under the Mutex in `GraphState`.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: instantiated by us, destroyed once.
        unsafe { sys::cuGraphExecDestroy(self.0) };
    }
}

/// Counters of the graph machinery (for checks and reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphStats {
    /// Steps captured and launched as graphs.
    pub launched: u64,
    /// Of those, launched after updating a kept executable graph.
    pub updated: u64,
    /// Of those, launched after a fresh instantiation.
    pub instantiated: u64,
    /// Captures abandoned (the step then ran without a graph).
    pub abandoned: u64,
}

/// Per-device graph state: the capture flag, the pool, the staging memory, the kept graphs.
pub struct GraphState {
    ctx: Arc<CudaContext>,
    capturing: AtomicBool,
    pub(crate) pool: Arc<GraphPool>,
    stage: Mutex<PinnedStage>,
    execs: Mutex<Vec<Exec>>,
    stats: Mutex<GraphStats>,
    /// Why graphs were turned off for this device (the first abandoned capture), if they were.
    broken: Mutex<Option<String>>,
}

impl GraphState {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Self {
        GraphState {
            pool: Arc::new(GraphPool::new(ctx.clone())),
            ctx,
            capturing: AtomicBool::new(false),
            stage: Mutex::new(PinnedStage { chunks: Vec::new(), chunk: 0, used: 0 }),
            execs: Mutex::new(Vec::new()),
            stats: Mutex::new(GraphStats::default()),
            broken: Mutex::new(None),
        }
    }

    /// Whether a capture is in progress.
    pub fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn stats(&self) -> GraphStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why graphs are off on this device, if a capture had to be abandoned.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn mark_broken(&self, why: String) {
        let mut b = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            eprintln!("flashseek: warning: CUDA graphs for decode are off on this device: {why}; decode steps run without them (same results)");
            *b = Some(why);
        }
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).abandoned += 1;
    }

    /// A pool block for `n` values of `T` (contents unspecified).
    pub(crate) fn pooled<T: DeviceRepr>(&self, stream: &Arc<cudarc::driver::CudaStream>, n: usize) -> Result<DevBuf<T>, CudaError> {
        let block = GraphPool::block(n * std::mem::size_of::<T>());
        let p = self.pool.take(block)?;
        // SAFETY: `p` is a live pool block of `block` ≥ n·size_of::<T>() bytes, owned by the
        // returned DevBuf until it is dropped (then back in the pool).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(p, n) };
        Ok(DevBuf { slice: ManuallyDrop::new(slice), pool: Some((self.pool.clone(), block)) })
    }

    /// A zeroed pool block for `n` values of `T`, the memset recorded on `stream`.
    pub(crate) fn pooled_zeros<T: DeviceRepr>(&self, stream: &Arc<cudarc::driver::CudaStream>, n: usize) -> Result<DevBuf<T>, CudaError> {
        let buf = self.pooled::<T>(stream, n)?;
        let bytes = n * std::mem::size_of::<T>();
        if bytes > 0 {
            use cudarc::driver::DevicePtr;
            let (p, _rec) = buf.device_ptr(stream);
            // SAFETY: memset of the block's first `bytes` bytes on the capturing stream.
            drv_res("recording a memset", unsafe { sys::cuMemsetD8Async(p, 0, bytes, stream.cu_stream()) })?;
        }
        Ok(buf)
    }

    /// A pool block holding `data`, copied from pinned staging memory by a recorded copy.
    pub(crate) fn pooled_upload<T: DeviceRepr>(&self, stream: &Arc<cudarc::driver::CudaStream>, data: &[T]) -> Result<DevBuf<T>, CudaError> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.pooled::<T>(stream, data.len())?;
        if bytes > 0 {
            use cudarc::driver::DevicePtr;
            let (p, _rec) = buf.device_ptr(stream);
            // SAFETY: `data` is `bytes` bytes of plain values (DeviceRepr types are plain data).
            let raw = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bytes) };
            let src = self.stage.lock().unwrap_or_else(|e| e.into_inner()).push(&self.ctx, raw)?;
            // SAFETY: pinned source of `bytes` bytes, kept until the next capture (which first
            // waits for the stream); destination block of at least `bytes` bytes.
            drv_res("recording an upload", unsafe { sys::cuMemcpyHtoDAsync_v2(p, src.cast(), bytes, stream.cu_stream()) })?;
        }
        Ok(buf)
    }

    /// Records everything `f` queues on `stream` as one graph and launches it (see the module
    /// documentation). The stream is synchronised first. On an error from `f` (or from the
    /// capture) nothing of the step has run; the error is returned and the caller must undo the
    /// host-side effects of `f`.
    ///
    /// Errors: `f`'s error, or the driver refusing to capture, update, instantiate or launch.
    pub(crate) fn capture_launch<R>(&self, stream: &Arc<cudarc::driver::CudaStream>, f: impl FnOnce() -> Result<R, CudaError>) -> Result<R, CudaError> {
        super::gpu::drv_bind(&self.ctx)?;
        // SAFETY: waits for our own stream (the previous graph has then read its staging memory).
        drv_res("synchronising before a capture", unsafe { sys::cuStreamSynchronize(stream.cu_stream()) })?;
        self.stage.lock().unwrap_or_else(|e| e.into_inner()).reset();
        let s = stream.cu_stream();
        // SAFETY: the stream is ours and idle; relaxed mode keeps cuMemAlloc (pool growth) legal.
        drv_res("beginning a capture", unsafe { sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) })?;
        self.capturing.store(true, Ordering::Relaxed);
        let r = f();
        self.capturing.store(false, Ordering::Relaxed);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above (also after an error, which may have invalidated it).
        let end = unsafe { sys::cuStreamEndCapture(s, &mut graph) };
        let graph = Graph(graph);
        let v = r?;
        drv_res("ending a capture", end)?;
        if graph.0.is_null() {
            return Err(CudaError::Driver { what: "ending a capture".into(), detail: "no graph was returned".into() });
        }
        self.launch(&graph, s)?;
        Ok(v)
    }

    /// Updates a kept executable graph with `graph` (most recently used first) or instantiates a
    /// new one, then launches it on `s`.
    fn launch(&self, graph: &Graph, s: sys::CUstream) -> Result<(), CudaError> {
        let mut execs = self.execs.lock().unwrap_or_else(|e| e.into_inner());
        let mut hit = None;
        for (i, e) in execs.iter().enumerate() {
            // SAFETY: a zeroed result-info struct is valid (plain data, null node handles).
            let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
            // SAFETY: both handles are live; a failed update leaves the executable graph as it was.
            if unsafe { sys::cuGraphExecUpdate_v2(e.0, graph.0, &mut info) } == sys::CUresult::CUDA_SUCCESS {
                hit = Some(i);
                break;
            }
        }
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        match hit {
            Some(i) => {
                let e = execs.remove(i);
                execs.insert(0, e);
                stats.updated += 1;
            }
            None => {
                let mut exec: sys::CUgraphExec = std::ptr::null_mut();
                // SAFETY: instantiates the captured graph (no flags) into a local.
                drv_res("instantiating a graph", unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph.0, 0) })?;
                execs.insert(0, Exec(exec));
                execs.truncate(MAX_KEPT_GRAPHS);
                stats.instantiated += 1;
            }
        }
        // SAFETY: the executable graph is live and its resources (pool blocks, staging) stay
        // untouched until the stream is synchronised again.
        drv_res("launching a graph", unsafe { sys::cuGraphLaunch(execs[0].0, s) })?;
        stats.launched += 1;
        Ok(())
    }
}

impl Drop for GraphState {
    fn drop(&mut self) {
        // Kept graphs and staging memory may still be in use by queued work.
        if super::gpu::drv_bind(&self.ctx).is_ok() {
            let _ = self.ctx.synchronize();
        }
    }
}

/// A captured graph, destroyed on drop.
struct Graph(sys::CUgraph);

impl Drop for Graph {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: returned by cuStreamEndCapture, destroyed once (instantiated executables are
            // independent of it).
            unsafe { sys::cuGraphDestroy(self.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_blocks_are_powers_of_two_from_the_minimum() {
        assert_eq!(GraphPool::block(0), MIN_BLOCK);
        assert_eq!(GraphPool::block(1), MIN_BLOCK);
        assert_eq!(GraphPool::block(MIN_BLOCK), MIN_BLOCK);
        assert_eq!(GraphPool::block(MIN_BLOCK + 1), 2 * MIN_BLOCK);
        assert_eq!(GraphPool::block(517_120), 524_288);
    }
}
