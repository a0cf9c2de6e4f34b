# Small host<->device copy costs on this GPU (cupy), to explain the ~150 us device floor.
import time
try:
    import cupy as cp
    from cupy.cuda import runtime as rt
except Exception as e:
    print("no cupy:", e); raise SystemExit(0)
pin = cp.cuda.alloc_pinned_memory(1 << 22)
dst = cp.zeros(1 << 22, dtype=cp.uint8)
src_dev = cp.ones(1 << 22, dtype=cp.uint8)
s = cp.cuda.Stream(non_blocking=True)
def bench(fn, it=300):
    for _ in range(20): fn()
    t = time.perf_counter()
    for _ in range(it): fn()
    return (time.perf_counter() - t) / it * 1e6
print(f"{'bytes':>8} {'H2D':>8} {'H2D dflt strm':>14} {'D2D from mapped pinned':>24} {'D2H':>8} {'D2D':>8} {'sync only':>10}")
for n in [8, 4096, 16384, 65536, 262144, 1 << 20]:
    h2d = bench(lambda: (rt.memcpyAsync(dst.data.ptr, pin.ptr, n, rt.memcpyHostToDevice, s.ptr), s.synchronize()))
    h2d0 = bench(lambda: (rt.memcpyAsync(dst.data.ptr, pin.ptr, n, rt.memcpyHostToDevice, 0), rt.deviceSynchronize()))
    try:
        mapped = bench(lambda: (rt.memcpyAsync(dst.data.ptr, pin.ptr, n, rt.memcpyDeviceToDevice, s.ptr), s.synchronize()))
    except Exception as e:
        mapped = float('nan'); print("mapped failed", e)
    d2h = bench(lambda: (rt.memcpyAsync(pin.ptr, dst.data.ptr, n, rt.memcpyDeviceToHost, s.ptr), s.synchronize()))
    d2d = bench(lambda: (rt.memcpyAsync(dst.data.ptr, src_dev.data.ptr, n, rt.memcpyDeviceToDevice, s.ptr), s.synchronize()))
    sync = bench(lambda: s.synchronize())
    print(f"{n:>8} {h2d:>8.1f} {h2d0:>14.1f} {mapped:>24.1f} {d2h:>8.1f} {d2d:>8.1f} {sync:>10.1f}")
# Kernel write from mapped pinned memory: a cupy elementwise copy reading host memory.
import numpy as np
h = cp.cuda.alloc_pinned_memory(1 << 20)
mem = cp.cuda.UnownedMemory(h.ptr, 1 << 20, h)
hv = cp.ndarray((1 << 20,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))
for n in [8, 4096, 65536]:
    k = bench(lambda: (dst[:n].__setitem__(slice(None), hv[:n]), cp.cuda.get_current_stream().synchronize()))
    print(f"kernel copy from mapped pinned {n:>6} B: {k:.1f} us")
