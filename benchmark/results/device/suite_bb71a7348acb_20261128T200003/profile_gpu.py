"""Where a GPU-tier get/put spends its CPU time (cProfile), on the device machine."""
import cProfile, pstats, io, time
import cupy as cp
from cascade import CascadeStore, Config
from cascade.models import BlockSpec

for nbytes in (64 << 10, 16 << 20):
    spec = BlockSpec.flat(nbytes); half = spec.half_bytes; n = 64
    keys = [cp.full(half, i % 251, dtype=cp.uint8) for i in range(n)]
    vals = [cp.full(half, (i + 7) % 251, dtype=cp.uint8) for i in range(n)]
    outs = [(cp.empty(half, dtype=cp.uint8), cp.empty(half, dtype=cp.uint8)) for _ in range(n)]
    ids = [f"{i:032x}" for i in range(n)]
    with CascadeStore(Config(gpu_bytes=2 * n * (nbytes + 4096) + (16 << 20), shm_bytes=0, file_bytes=0), block_spec=spec) as s:
        for k, v, b in zip(keys, vals, ids):
            s.put(k, v, block_id=b)
        cp.cuda.get_current_stream().synchronize()
        reps = 4000 // n if nbytes < (1 << 20) else 2
        def gets():
            for _ in range(reps):
                for b, o in zip(ids, outs):
                    s.get_into(b, *o)
            cp.cuda.get_current_stream().synchronize()
        gets()
        t0 = time.perf_counter(); c0 = time.process_time(); gets()
        t1 = time.perf_counter(); c1 = time.process_time()
        print(f"size {nbytes}: get_into wall {(t1-t0)/reps/n*1e6:.1f} us cpu {(c1-c0)/reps/n*1e6:.1f} us per call")
        raw0 = time.perf_counter()
        for _ in range(reps):
            for k, o in zip(keys, outs):
                o[0].data.copy_from_device_async(k.data, half); o[1].data.copy_from_device_async(k.data, half)
        cp.cuda.get_current_stream().synchronize()
        print(f"  raw 2x copy_from_device_async {(time.perf_counter()-raw0)/reps/n*1e6:.1f} us per block")
        pr = cProfile.Profile(); pr.enable(); gets(); pr.disable()
        st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(25); print(st.getvalue()[:6000])
        def puts():
            for k, v, b in zip(keys, vals, ids):
                s.delete(b)
            for k, v, b in zip(keys, vals, ids):
                s.put(k, v, block_id=b)
            cp.cuda.get_current_stream().synchronize()
        pr = cProfile.Profile(); pr.enable(); [puts() for _ in range(max(1, reps // 4))]; pr.disable()
        st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(20); print(st.getvalue()[:5000])
