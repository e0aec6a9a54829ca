// Calls an attngen kernel on the CPU from C++: no CUDA anywhere. Built by CMakeLists.txt beside this
// file (target attn_demo_cpu), which generates demo_cpu.{cpp,h} from attention.attn with
// `attngen compile --target cpu`; or by hand:
//
//   attngen compile attention.attn --target cpu --prefix demo -o demo_cpu.cpp
//   attngen compile attention.attn --target cpu --prefix demo --emit header -o demo_cpu.h
//   g++ -std=c++17 -O3 -march=native -fno-math-errno -fopenmp main_cpu.cpp demo_cpu.cpp -o attn_demo_cpu
//
// The spec (the GPU demo's): fp16, heads 4 kv 2 (GQA), head_dim 64, causal, RMSNorm(1e-6) over each
// q head with an fp32[64] weight; layout bhsd. The program checks the kernel against a plain loop
// and prints the output's checksum; `attn_demo_cpu DIR` also writes q, k, v, the weight and o to
// DIR as raw little-endian arrays (tests/cpu/test_cpp_example_cpu.py holds them to the reference).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "demo_cpu.h"

namespace {

constexpr int B = 2, L = 77;  // a length that is no multiple of any tile
constexpr int H = demo_attn_demo_cpu_HEADS, HKV = demo_attn_demo_cpu_KV_HEADS, D = demo_attn_demo_cpu_HEAD_DIM;
constexpr float EPS = 1e-6f;

// fp16 <-> fp32 (round to nearest even); normal values only, which is all this program makes.
uint16_t f2h(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax < 0x38800000u) return (uint16_t)(sign | (uint32_t)std::nearbyint(std::fabs(f) * 16777216.0f));
  return (uint16_t)(sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13));
}
float h2f(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.f : 1.f) * (float)m * 5.9604644775390625e-08f;
  const uint32_t x = sign | ((e + 112u) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

template <class T>
void dump(const std::string& dir, const char* name, const std::vector<T>& a) {
  const std::string path = dir + "/" + name + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(a.data(), sizeof(T), a.size(), f) != a.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<uint16_t> q((size_t)B * H * L * D), k((size_t)B * HKV * L * D), v(k.size()), o(q.size(), 0xffff);
  std::vector<float> w(D);
  for (auto& x : q) x = f2h(uni(rng));
  for (auto& x : k) x = f2h(uni(rng));
  for (auto& x : v) x = f2h(uni(rng));
  for (auto& x : w) x = 1.f + 0.25f * uni(rng);

  demo_attn_demo_cpu_params p;
  std::memset(&p, 0, sizeof p);
  p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o.data();
  p.B = B; p.Lq = L; p.Lk = L;
  p.Lq_total = L; p.Lk_total = L;  // a whole sequence (offsets 0)
  p.q_sb = (long long)H * L * D;   p.q_sh = (long long)L * D; p.q_ss = D;
  p.k_sb = (long long)HKV * L * D; p.k_sh = (long long)L * D; p.k_ss = D;
  p.v_sb = (long long)HKV * L * D; p.v_sh = (long long)L * D; p.v_ss = D;
  p.o_sb = (long long)H * L * D;   p.o_sh = (long long)L * D; p.o_ss = D;
  p.in_q_norm_weight = w.data(); p.in_q_norm_weight_n0 = D; p.in_q_norm_weight_s0 = 1;
  const int rc = demo_attn_demo_cpu_launch(&p);
  if (rc != 0) {
    std::fprintf(stderr, "launch returned %d\n", rc);
    return 1;
  }

  // The plain loop: q rows RMS-normalised (rounded to fp16, as the contract says), causal softmax.
  const float scale = 1.f / std::sqrt((float)D);
  double max_err = 0, checksum = 0;
  int bad = 0;
  std::vector<float> qn(D), s(L);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / HKV);
      for (int i = 0; i < L; ++i) {
        const uint16_t* qr = &q[(((size_t)b * H + h) * L + i) * D];
        float ms = 0;
        for (int d = 0; d < D; ++d) ms += h2f(qr[d]) * h2f(qr[d]);
        const float r = 1.f / std::sqrt(ms / D + EPS);
        for (int d = 0; d < D; ++d) qn[d] = h2f(f2h(h2f(qr[d]) * r * w[d]));
        float m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += qn[d] * h2f(k[(((size_t)b * HKV + hk) * L + j) * D + d]);
          s[j] = dot * scale;
          m = std::fmax(m, s[j]);
        }
        float sum = 0;
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - m));
        for (int d = 0; d < D; ++d) {
          float acc = 0;
          for (int j = 0; j <= i; ++j) acc += s[j] * h2f(v[(((size_t)b * HKV + hk) * L + j) * D + d]);
          const float ref = acc / sum;
          const float got = h2f(o[(((size_t)b * H + h) * L + i) * D + d]);
          const double err = std::fabs((double)got - ref);
          if (!(err <= 1e-2 + 1e-2 * std::fabs(ref))) ++bad;  // also catches NaN
          if (err > max_err || std::isnan(err)) max_err = err;
          checksum += got;
        }
      }
    }
  if (argc > 1) {
    dump(argv[1], "q", q); dump(argv[1], "k", k); dump(argv[1], "v", v); dump(argv[1], "w", w); dump(argv[1], "o", o);
  }
  std::printf("B=%d H=%d Hkv=%d L=%d D=%d on the CPU: max |kernel - loop| = %.3g, %d of %zu outside 1e-2 + 1e-2*|ref|\n",
              B, H, HKV, L, D, max_err, bad, o.size());
  std::printf("checksum %.6f\n", checksum);
  std::printf(bad == 0 ? "PASS\n" : "FAIL\n");
  return bad == 0 ? 0 : 1;
}
