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
//!   copies the data into pinned staging memory (an [`Arena`] owned by the captured step) and
//!   records a host-to-device copy from there; the arena is reused only after an event recorded
//!   behind the graph's launch has completed.
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
    super::drv(what, r.result())
}

/// Makes `ctx` current for a destructor: a first failure may only be an error cudarc recorded
/// earlier on the context (which the attempt consumes), so it is tried twice.
fn bind_for_drop(ctx: &CudaContext) -> bool {
    ctx.bind_to_thread().is_ok() || ctx.bind_to_thread().is_ok()
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
        DevBuf {
            slice: ManuallyDrop::new(slice),
            pool: None,
        }
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
        GraphPool {
            ctx,
            free: Mutex::new(HashMap::new()),
            all: Mutex::new(Vec::new()),
            bytes: AtomicU64::new(0),
        }
    }

    /// Block size for `bytes`.
    fn block(bytes: usize) -> usize {
        bytes.max(MIN_BLOCK).next_power_of_two()
    }

    /// A free block of `block` bytes, allocating one if none is free.
    fn take(&self, block: usize) -> Result<sys::CUdeviceptr, CudaError> {
        if let Some(p) = lock(&self.free).get_mut(&block).and_then(Vec::pop) {
            return Ok(p);
        }
        super::gpu::drv_bind(&self.ctx)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: plain allocation into a local; the context is current on this thread.
        drv_res("allocating graph pool memory", unsafe {
            sys::cuMemAlloc_v2(&mut p, block)
        })?;
        lock(&self.all).push(p);
        self.bytes.fetch_add(block as u64, Ordering::Relaxed);
        Ok(p)
    }

    fn put(&self, block: usize, p: sys::CUdeviceptr) {
        lock(&self.free).entry(block).or_default().push(p);
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
        if !bind_for_drop(&self.ctx) {
            return;
        }
        let _ = self.ctx.synchronize();
        for p in lock(&self.all).drain(..) {
            // SAFETY: each pointer came from cuMemAlloc_v2 above and is freed once.
            unsafe { sys::cuMemFree_v2(p) };
        }
    }
}

/// Pinned host memory the uploads of one captured step are copied from (a bump allocator over
/// chunks allocated with `cuMemHostAlloc`). A captured graph owns its arena until it is launched;
/// after the launch the arena waits for an event recorded behind the graph before it is reused.
pub struct Arena {
    /// Kept alive (and made current) until the pinned memory is freed.
    ctx: Arc<CudaContext>,
    chunks: Vec<(*mut u8, usize)>,
    chunk: usize,
    used: usize,
    /// Recorded after each launch of a graph that reads this arena (created at the first launch,
    /// then recorded again: its state is that of its last record, so an arena captured but
    /// discarded stays free).
    done: Option<cudarc::driver::CudaEvent>,
}

// SAFETY: the raw pointers are pinned host allocations owned by this struct, used by one thread
// at a time (the arena is moved, never shared).
unsafe impl Send for Arena {}

/// Smallest staging chunk, bytes.
const STAGE_CHUNK: usize = 1 << 16;

impl Arena {
    fn new(ctx: Arc<CudaContext>) -> Self {
        Arena {
            ctx,
            chunks: Vec::new(),
            chunk: 0,
            used: 0,
            done: None,
        }
    }

    /// Whether the graph that last read it has finished (or it was never launched).
    fn free(&self) -> bool {
        self.done
            .as_ref()
            .is_none_or(|e| e.try_is_complete().unwrap_or(false))
    }

    fn reset(&mut self) {
        self.chunk = 0;
        self.used = 0;
    }

    /// Copies `data` into the arena; returns its address there (256-byte aligned).
    fn push(&mut self, data: &[u8]) -> Result<*const u8, CudaError> {
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
            super::gpu::drv_bind(&self.ctx)?;
            let cap = need.max(STAGE_CHUNK).next_power_of_two();
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: plain pinned allocation into a local.
            drv_res("allocating pinned staging memory", unsafe {
                sys::cuMemHostAlloc(&mut p, cap, 0)
            })?;
            self.chunks.push((p.cast(), cap));
            self.chunk = self.chunks.len() - 1;
            self.used = 0;
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if !bind_for_drop(&self.ctx) {
            return;
        }
        if let Some(e) = &self.done {
            let _ = e.synchronize();
        }
        for (p, _) in self.chunks.drain(..) {
            // SAFETY: allocated by cuMemHostAlloc above, freed once, after the graph reading it.
            unsafe { sys::cuMemFreeHost(p.cast()) };
        }
    }
}

/// An executable graph (instantiated by us, destroyed on drop).
/// The context is kept alive (and made current) until the executable is destroyed.
struct Exec(sys::CUgraphExec, Arc<CudaContext>);

// SAFETY: an executable graph handle is used by one owner at a time (moved, never shared).
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        if !bind_for_drop(&self.1) {
            return;
        }
        // SAFETY: instantiated by us, destroyed once, its context alive and current.
        unsafe { sys::cuGraphExecDestroy(self.0) };
    }
}

/// A captured step ready to launch: its executable graph (owned until the launch, so no other
/// capture updates it meanwhile) and the staging arena it reads.
pub struct Captured {
    exec: Exec,
    arena: Arena,
}

/// Counters of the graph machinery (for checks and reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct GraphStats {
    /// Steps launched as graphs.
    pub launched: u64,
    /// Captures that updated a kept executable graph.
    pub updated: u64,
    /// Captures that instantiated a new executable graph.
    pub instantiated: u64,
    /// Captures abandoned (an op needed the host; the step then ran without a graph).
    pub abandoned: u64,
    /// Captured steps dropped unlaunched (a pre-captured next step whose sequence changed).
    pub discarded: u64,
    /// Host seconds spent capturing and updating/instantiating, in total.
    pub capture_s: f64,
}

/// Per-device graph state: the capture flag, the pool, the staging arenas, the kept graphs.
pub struct GraphState {
    ctx: Arc<CudaContext>,
    capturing: AtomicBool,
    pub(crate) pool: Arc<GraphPool>,
    /// The arena of the capture in progress.
    current: Mutex<Option<Arena>>,
    /// Arenas not owned by a captured step (some may still be read by a launched graph).
    arenas: Mutex<Vec<Arena>>,
    /// Executable graphs not owned by a captured step, most recently used first.
    execs: Mutex<Vec<Exec>>,
    stats: Mutex<GraphStats>,
    /// Why graphs were turned off for this device (the first abandoned capture), if they were.
    broken: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GraphState {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Self {
        GraphState {
            pool: Arc::new(GraphPool::new(ctx.clone())),
            ctx,
            capturing: AtomicBool::new(false),
            current: Mutex::new(None),
            arenas: Mutex::new(Vec::new()),
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
        *lock(&self.stats)
    }

    /// Why graphs are off on this device, if a capture had to be abandoned.
    pub fn broken(&self) -> Option<String> {
        lock(&self.broken).clone()
    }

    pub(crate) fn mark_broken(&self, why: String) {
        let mut b = lock(&self.broken);
        if b.is_none() {
            eprintln!("flashseek: warning: CUDA graphs for decode are off on this device: {why}; decode steps run without them (same results)");
            *b = Some(why);
        }
        lock(&self.stats).abandoned += 1;
    }

    /// Counts a capture abandoned for a passing reason (memory), said once; graphs stay on.
    pub(crate) fn note_failure(&self, why: String) {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            eprintln!("flashseek: warning: a decode step ran without a CUDA graph: {why} (later steps try again)");
        }
        lock(&self.stats).abandoned += 1;
    }

    /// A pool block for `n` values of `T` (contents unspecified).
    pub(crate) fn pooled<T: DeviceRepr>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        n: usize,
    ) -> Result<DevBuf<T>, CudaError> {
        let block = GraphPool::block(n * std::mem::size_of::<T>());
        let p = self.pool.take(block)?;
        // SAFETY: `p` is a live pool block of `block` ≥ n·size_of::<T>() bytes, owned by the
        // returned DevBuf until it is dropped (then back in the pool).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(p, n) };
        Ok(DevBuf {
            slice: ManuallyDrop::new(slice),
            pool: Some((self.pool.clone(), block)),
        })
    }

    /// A zeroed pool block for `n` values of `T`, the memset recorded on `stream`.
    pub(crate) fn pooled_zeros<T: DeviceRepr>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        n: usize,
    ) -> Result<DevBuf<T>, CudaError> {
        let buf = self.pooled::<T>(stream, n)?;
        let bytes = n * std::mem::size_of::<T>();
        if bytes > 0 {
            use cudarc::driver::DevicePtr;
            let (p, _rec) = buf.device_ptr(stream);
            // SAFETY: memset of the block's first `bytes` bytes on the capturing stream.
            drv_res("recording a memset", unsafe {
                sys::cuMemsetD8Async(p, 0, bytes, stream.cu_stream())
            })?;
        }
        Ok(buf)
    }

    /// A pool block holding `data`, copied by a recorded copy from the capture's staging arena.
    pub(crate) fn pooled_upload<T: DeviceRepr>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        data: &[T],
    ) -> Result<DevBuf<T>, CudaError> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.pooled::<T>(stream, data.len())?;
        if bytes > 0 {
            use cudarc::driver::DevicePtr;
            let (p, _rec) = buf.device_ptr(stream);
            // SAFETY: `data` is `bytes` bytes of plain values (DeviceRepr types are plain data).
            let raw = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bytes) };
            let src = match lock(&self.current).as_mut() {
                Some(a) => a.push(raw)?,
                None => {
                    return Err(CudaError::Unsupported {
                        what: "CUDA graph capture",
                        detail: "an upload outside a capture's staging arena".into(),
                    })
                }
            };
            // SAFETY: pinned source of `bytes` bytes, owned by the captured step until its graph
            // has run; destination block of at least `bytes` bytes.
            drv_res("recording an upload", unsafe {
                sys::cuMemcpyHtoDAsync_v2(p, src.cast(), bytes, stream.cu_stream())
            })?;
        }
        Ok(buf)
    }

    /// Records everything `f` queues on `stream` as one graph and readies it for launch: a kept
    /// executable graph of the same topology updated with it, or a new one. Nothing runs; work
    /// already queued on the stream keeps running (a step may be captured while the previous one
    /// executes). On an error from `f` (or from the capture) the error is returned and the caller
    /// must undo the host-side effects of `f`.
    ///
    /// Errors: `f`'s error, or the driver refusing to capture, update or instantiate.
    pub(crate) fn capture<R>(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        f: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<(R, Captured), CudaError> {
        let t0 = std::time::Instant::now();
        super::gpu::drv_bind(&self.ctx)?;
        let mut arena = {
            let mut free = lock(&self.arenas);
            match free.iter().position(Arena::free) {
                Some(i) => free.swap_remove(i),
                None => Arena::new(self.ctx.clone()),
            }
        };
        arena.reset();
        *lock(&self.current) = Some(arena);
        let s = stream.cu_stream();
        // SAFETY: begins capturing our own stream; relaxed mode keeps cuMemAlloc (pool growth)
        // and cuMemHostAlloc (staging growth) legal meanwhile.
        let begun = drv_res("beginning a capture", unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        });
        let began = begun.is_ok();
        let r = match begun {
            Ok(()) => {
                self.capturing.store(true, Ordering::Relaxed);
                // A panic in `f` must not leave the stream capturing: the guard ends the capture
                // (and drops its graph) on unwind; on return it is disarmed below.
                let guard = UnwindGuard { state: self, stream: s };
                let r = f();
                std::mem::forget(guard);
                self.capturing.store(false, Ordering::Relaxed);
                r
            }
            Err(e) => Err(e),
        };
        let arena = lock(&self.current).take().unwrap_or_else(|| Arena::new(self.ctx.clone()));
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let end = if began {
            // SAFETY: ends the capture begun above (also after an error in `f`).
            unsafe { sys::cuStreamEndCapture(s, &mut graph) }
        } else {
            sys::CUresult::CUDA_SUCCESS
        };
        let graph = Graph(graph);
        let done = (|| {
            let v = r?;
            drv_res("ending a capture", end)?;
            if graph.0.is_null() {
                return Err(CudaError::Driver {
                    what: "ending a capture".into(),
                    detail: "no graph was returned".into(),
                });
            }
            let exec = self.exec_for(&graph)?;
            Ok((v, exec))
        })();
        let dt = t0.elapsed().as_secs_f64();
        lock(&self.stats).capture_s += dt;
        match done {
            Ok((v, exec)) => Ok((v, Captured { exec, arena })),
            Err(e) => {
                lock(&self.arenas).push(arena);
                Err(e)
            }
        }
    }

    /// An executable graph for `graph`: a kept one of the same topology (most recently used first)
    /// updated with it, or a new instantiation. The executable is taken out of the kept list.
    fn exec_for(&self, graph: &Graph) -> Result<Exec, CudaError> {
        let mut execs = lock(&self.execs);
        for i in 0..execs.len() {
            // SAFETY: a zeroed result-info struct is valid (plain data, null node handles).
            let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
            // SAFETY: both handles are live; the executable is not owned by any captured step, and
            // an update leaves launches already queued unaffected.
            if unsafe { sys::cuGraphExecUpdate_v2(execs[i].0, graph.0, &mut info) }
                == sys::CUresult::CUDA_SUCCESS
            {
                lock(&self.stats).updated += 1;
                return Ok(execs.remove(i));
            }
        }
        drop(execs);
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: instantiates the captured graph (no flags) into a local.
        drv_res("instantiating a graph", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph.0, 0)
        })?;
        lock(&self.stats).instantiated += 1;
        Ok(Exec(exec, self.ctx.clone()))
    }

    /// Launches a captured step on `stream`; its executable graph returns to the kept list and its
    /// arena to the free list (reused once an event recorded behind the graph has completed).
    ///
    /// Errors: the driver refusing the launch or the event.
    pub(crate) fn launch(
        &self,
        stream: &Arc<cudarc::driver::CudaStream>,
        c: Captured,
    ) -> Result<(), CudaError> {
        let Captured { exec, mut arena } = c;
        super::gpu::drv_bind(&self.ctx)?;
        // SAFETY: the executable graph is live; the pool blocks it uses are reused only by work
        // queued after it on this stream, and its arena only after the event below.
        let r = drv_res("launching a graph", unsafe {
            sys::cuGraphLaunch(exec.0, stream.cu_stream())
        });
        let ev = match arena.done.take() {
            Some(e) => Ok(e),
            None => self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)),
        }
        .and_then(|e| e.record(stream).map(|_| e));
        match ev {
            Ok(e) => arena.done = Some(e),
            // Without the event, wait here so the arena is free.
            Err(_) => {
                let _ = stream.synchronize();
            }
        }
        lock(&self.arenas).push(arena);
        let mut execs = lock(&self.execs);
        execs.insert(0, exec);
        execs.truncate(MAX_KEPT_GRAPHS);
        drop(execs);
        r?;
        lock(&self.stats).launched += 1;
        Ok(())
    }

    /// Drops a captured step without launching it (its executable returns to the kept list).
    pub(crate) fn discard(&self, c: Captured) {
        let Captured { exec, arena } = c;
        lock(&self.arenas).push(arena);
        let mut execs = lock(&self.execs);
        execs.push(exec);
        execs.truncate(MAX_KEPT_GRAPHS);
        lock(&self.stats).discarded += 1;
    }
}

impl Drop for GraphState {
    fn drop(&mut self) {
        // Kept graphs and staging memory may still be in use by queued work: wait, then release
        // them while the context is certainly alive (each also holds it).
        if bind_for_drop(&self.ctx) {
            let _ = self.ctx.synchronize();
        }
        lock(&self.execs).clear();
        lock(&self.arenas).clear();
        lock(&self.current).take();
    }
}

/// Ends a capture left open by a panic (see [`GraphState::capture`]).
struct UnwindGuard<'a> {
    state: &'a GraphState,
    stream: sys::CUstream,
}

impl Drop for UnwindGuard<'_> {
    fn drop(&mut self) {
        self.state.capturing.store(false, Ordering::Relaxed);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun on our stream; the partial graph is destroyed.
        unsafe { sys::cuStreamEndCapture(self.stream, &mut graph) };
        drop(Graph(graph));
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
