"""One profiled launch each of the wgmma forward with a document mask (tile 128 x 128 x 2, bf16 D128
H16 B2 L16k): the suite's 16 random documents, then 16 documents of 1024 tokens, for ncu:

    ncu --clock-control none --profile-from-start off --kernel-name regex:attngen --launch-count 2 \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
        python3 tools/ncu_doc.py

Warm-up launches run outside the profiled range."""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import numpy as np, torch
from attngen.lang import frontend
from attngen.tools import bench
from attngen.runtime import kernel as runtime
from attngen.check import fuzz
from suite import _documents
body = "dtype bf16; head_dim 128; heads 16\n input doc: i32[B, Lk] sorted\n mask document(doc) && causal\n tile block_m 128 block_n 128 warps 8 stages 2"
v = frontend.loads(f"attention ncudoc {{ {body} }}\n", "<ncu>").get()
k = runtime.compile(v, family="forward")
ins = bench.device_qkv(v, 2, 16384, 16384, 3)
cases = [("random", _documents(None, 2, 16384, 16384)["doc"]),
         ("uniform1024", np.repeat(np.arange(16, dtype=np.int32), 1024)[None].repeat(2, 0).copy())]
dev = [(n, fuzz.to_device(d)) for n, d in cases]
for n, d in dev:
    k(ins["q"], ins["k"], ins["v"], doc=d, check_inputs=False)
fuzz.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for n, d in dev:
    k(ins["q"], ins["k"], ins["v"], doc=d, check_inputs=False)
fuzz.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done")
