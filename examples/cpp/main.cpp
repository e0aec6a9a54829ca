// Calls an attngen kernel from C++: size the workspace with the generated query function, bind
// it, launch, and check a small case against a CPU loop. Built by CMakeLists.txt beside this file,
// which generates demo_sm80.{cu,h} and demo_sm90a.{cu,h} from attention.attn (`--prefix` keeps
// the two builds' symbols apart); the program runs the one built for the device's arch.
//
// The spec: fp16, heads 4 kv 2 (GQA), head_dim 64, causal, RMSNorm(1e-6) over each q head with
// an fp32[64] weight. Layout bhsd: q [B, H, L, D], k and v [B, Hkv, L, D], o [B, H, L, D].
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "demo_sm80.h"
#include "demo_sm90a.h"

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

constexpr int B = 2, L = 77;  // a length that is no multiple of any tile
constexpr int H = demo_sm90a_attn_demo_HEADS, HKV = demo_sm90a_attn_demo_KV_HEADS, D = demo_sm90a_attn_demo_HEAD_DIM;
constexpr float EPS = 1e-6f;

// The persistent (wgmma) build has a work counter; the mma.sync build has none.
template <class P>
auto set_work_counter(P& p, int* counter, int) -> decltype(p.work_counter = counter, void()) { p.work_counter = counter; }
template <class P>
void set_work_counter(P&, int*, long) {}

// One launch of the kernel whose C interface is (Params, launch, workspace_bytes, bind_workspace).
template <class Params, class Launch, class WsBytes, class Bind>
void run(Launch launch, WsBytes workspace_bytes, Bind bind_workspace, const __half* q, const __half* k, const __half* v,
         __half* o, const float* w, cudaStream_t stream) {
  Params p = {};
  p.q = q; p.k = k; p.v = v; p.o = o;
  p.B = B; p.Lq = L; p.Lk = L;
  p.q_sb = (long long)H * L * D;   p.q_sh = (long long)L * D; p.q_ss = D;
  p.k_sb = (long long)HKV * L * D; p.k_sh = (long long)L * D; p.k_ss = D;
  p.v_sb = (long long)HKV * L * D; p.v_sh = (long long)L * D; p.v_ss = D;
  p.o_sb = (long long)H * L * D;   p.o_sh = (long long)L * D; p.o_ss = D;
  p.in_q_norm_weight = w; p.in_q_norm_weight_n0 = D; p.in_q_norm_weight_s0 = 1;

  int* counter = nullptr;  // zeroed once; every launch leaves it 0
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMemset(counter, 0, sizeof(int)));
  set_work_counter(p, counter, 0);

  const size_t ws = workspace_bytes(B, L, L);  // the generated query function
  void* workspace = nullptr;
  if (ws) CHECK(cudaMalloc(&workspace, ws));
  bind_workspace(&p, workspace);
  std::printf("workspace: %zu bytes\n", ws);

  // Twice: the first launch sets the kernel up on this device (shared memory opt-in, SM count),
  // the second runs on what the launcher cached. The output is poisoned (NaN) in between.
  for (int i = 0; i < 2; ++i) {
    CHECK(cudaMemsetAsync(o, 0xff, sizeof(__half) * B * H * L * D, stream));
    CHECK(launch(&p, stream));
  }
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaFree(workspace));
  CHECK(cudaFree(counter));
}

float h2f(__half x) { return __half2float(x); }
float round_half(float x) { return __half2float(__float2half(x)); }

}  // namespace

int main() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const int cc = prop.major * 10 + prop.minor;
  std::printf("device %d: %s, compute capability %d.%d\n", dev, prop.name, prop.major, prop.minor);

  // Inputs: q, k, v uniform in [-1, 1), the norm weight around 1.
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<__half> hq((size_t)B * H * L * D), hk((size_t)B * HKV * L * D), hv(hk.size());
  std::vector<float> hw(D);
  for (auto& x : hq) x = __float2half(uni(rng));
  for (auto& x : hk) x = __float2half(uni(rng));
  for (auto& x : hv) x = __float2half(uni(rng));
  for (auto& x : hw) x = 1.f + 0.25f * uni(rng);

  __half *q, *k, *v, *o;
  float* w;
  CHECK(cudaMalloc(&q, hq.size() * sizeof(__half)));
  CHECK(cudaMalloc(&k, hk.size() * sizeof(__half)));
  CHECK(cudaMalloc(&v, hv.size() * sizeof(__half)));
  CHECK(cudaMalloc(&o, hq.size() * sizeof(__half)));
  CHECK(cudaMalloc(&w, hw.size() * sizeof(float)));
  CHECK(cudaMemcpy(q, hq.data(), hq.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, hk.data(), hk.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v, hv.data(), hv.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(o, 0xff, hq.size() * sizeof(__half)));  // NaN: a row the kernel skips shows
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  // A cubin runs on its own arch family only: sm_90a on 9.0, sm_80 on 8.x.
  if (cc == 90) {
    std::printf("kernel: demo_sm90a_attn_demo (sm_90a)\n");
    run<demo_sm90a_attn_demo_params>(demo_sm90a_attn_demo_launch, demo_sm90a_attn_demo_workspace_bytes,
                                     demo_sm90a_attn_demo_bind_workspace, q, k, v, o, w, stream);
  } else if (cc / 10 == 8) {
    std::printf("kernel: demo_sm80_attn_demo (sm_80)\n");
    run<demo_sm80_attn_demo_params>(demo_sm80_attn_demo_launch, demo_sm80_attn_demo_workspace_bytes,
                                    demo_sm80_attn_demo_bind_workspace, q, k, v, o, w, stream);
  } else {
    std::fprintf(stderr, "this program was built for sm_80 and sm_90a; add the device's arch in CMakeLists.txt\n");
    return 2;
  }
  std::vector<__half> ho(hq.size());
  CHECK(cudaMemcpy(ho.data(), o, ho.size() * sizeof(__half), cudaMemcpyDeviceToHost));

  // The CPU loop: q rows RMS-normalised (and rounded to fp16, as the kernel's workspace holds
  // them), scores scaled by 1/sqrt(D), causal softmax, weighted sum of v; fp32 throughout.
  const float scale = 1.f / std::sqrt((float)D);
  double max_err = 0;
  int bad = 0;
  std::vector<float> qn(D), s(L);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk_ = h / (H / HKV);
      for (int i = 0; i < L; ++i) {
        const __half* qr = &hq[(((size_t)b * H + h) * L + i) * D];
        float ms = 0;
        for (int d = 0; d < D; ++d) ms += h2f(qr[d]) * h2f(qr[d]);
        const float r = 1.f / std::sqrt(ms / D + EPS);
        for (int d = 0; d < D; ++d) qn[d] = round_half(h2f(qr[d]) * r * hw[d]);
        float m = -INFINITY;
        for (int j = 0; j <= i; ++j) {  // causal: kv <= q
          const __half* kr = &hk[(((size_t)b * HKV + hk_) * L + j) * D];
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += qn[d] * h2f(kr[d]);
          s[j] = dot * scale;
          m = std::fmax(m, s[j]);
        }
        float sum = 0;
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - m));
        for (int d = 0; d < D; ++d) {
          float acc = 0;
          for (int j = 0; j <= i; ++j) acc += s[j] * h2f(hv[(((size_t)b * HKV + hk_) * L + j) * D + d]);
          const float ref = acc / sum;
          const float got = h2f(ho[(((size_t)b * H + h) * L + i) * D + d]);
          const double err = std::fabs((double)got - ref);
          if (!(err <= 1e-2 + 1e-2 * std::fabs(ref))) ++bad;  // also catches NaN
          if (err > max_err || std::isnan(err)) max_err = err;
        }
      }
    }
  std::printf("B=%d H=%d Hkv=%d L=%d D=%d: max |gpu - cpu| = %.3g, %d of %zu outside 1e-2 + 1e-2*|ref|\n", B, H,
              HKV, L, D, max_err, bad, ho.size());
  std::printf(bad == 0 ? "PASS\n" : "FAIL\n");
  return bad == 0 ? 0 : 1;
}
