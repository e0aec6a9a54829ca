import sys
sys.path.insert(0, "tests/gpu")
import test_gpu_backward as T
from gpu_helpers import variant_of
for body in ("dtype bf16; head_dim 256; heads 4 kv 2; mask causal", "dtype fp16; head_dim 192 value 128; heads 2; mask causal"):
    v = variant_of(f"attention pw {{ {body} }}")
    for (B, Lq, Lk) in ((1, 33, 33), (2, 130, 130)):
        try:
            T._check(v, T._case(v, B, Lq, Lk, seed=3, empty=False), False)
            print("ok  ", body, B, Lq, Lk, flush=True)
        except Exception as e:
            print("BAD ", body, B, Lq, Lk, type(e).__name__, str(e)[:300], flush=True)
