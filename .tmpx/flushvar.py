import sys, torch
sys.path.insert(0, ".")
from autokernel.harness import timing
from autokernel.harness.perf import gpu_input_sets, compiled_reference
from autokernel.kernelfile import import_kernel
from autokernel.registry import get_spec
spec = get_spec("add_rmsnorm"); k = import_kernel(__import__("pathlib").Path("kernels/add_rmsnorm.py"))
comp = compiled_reference(spec)
for shape in ({"M": 2048, "N": 2048}, {"M": 2048, "N": 4096}, {"M": 4096, "N": 768}):
    sets = gpu_input_sets(spec, shape, torch.float16)
    row = []
    for dirty in (True, False, True, False):
        for name, fn in (("k", k.kernel_fn), ("c", comp)):
            t = timing.time_gpu(fn, sets, dirty_flush=dirty)
            s = sorted(t.samples_us); n = len(s)
            row.append(f"{name}{'D' if dirty else 'C'} {t.median_us:5.1f} [{s[n//10]:5.1f},{s[9*n//10]:5.1f}]")
    print(shape, " | ".join(row), flush=True)
