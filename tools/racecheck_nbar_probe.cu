// Calibrates compute-sanitizer racecheck on the hand-off that WgDq.WG uses: 256 producer threads
// fill a shared buffer and bar.arrive on FULL; 128 consumer threads bar.sync on FULL, read it, and
// bar.arrive on EMPTY, which the producers bar.sync on before they write it again. Two buffers,
// many rounds. Mode 0 is that protocol exactly (correct by the PTX memory model: an arrive
// synchronizes with the bar.sync that completes the barrier). Mode 1 is a lockstep control with
// the same named barriers and bar.sync only (one buffer: fill, sync, read, sync). Mode 2 is mode 0
// with the consumers reading before their FULL wait: a real race, with the same barrier counts.
//   nvcc -arch=sm_90a -o probe tools/racecheck_nbar_probe.cu && compute-sanitizer --tool racecheck ./probe 0
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void nbar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nbar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

constexpr int ROUNDS = 16, WORDS = 1024;

__global__ void __launch_bounds__(384, 1) probe(float* out, int mode) {
  __shared__ float buf[2][WORDS];
  const int t = threadIdx.x;
  float acc = 0.f;
  if (mode == 1) {  // lockstep: both sides bar.sync on both barriers
    for (int r = 0; r < ROUNDS; ++r) {
      if (t < 256)
        for (int i = t; i < WORDS; i += 256) buf[0][i] = float(r * WORDS + i);
      nbar_sync(2, 384);
      if (t >= 256)
        for (int i = t - 256; i < WORDS; i += 128) acc += buf[0][i];
      nbar_sync(4, 384);
    }
    if (t >= 256) out[t - 256] = acc;
    return;
  }
  if (t >= 256) {  // consumer
    const int u = t - 256;
    nbar_arrive(4, 384);  // both buffers start empty
    nbar_arrive(5, 384);
    for (int r = 0; r < ROUNDS; ++r) {
      const int b = r & 1;
      float early = 0.f;
      if (mode == 2)
        for (int i = u; i < WORDS; i += 128) early += buf[b][i];
      nbar_sync(2 + b, 384);
      if (mode == 2) acc += early;
      else
        for (int i = u; i < WORDS; i += 128) acc += buf[b][i];
      if (r + 2 < ROUNDS) nbar_arrive(4 + b, 384);
    }
    out[u] = acc;
  } else {  // producer
    for (int r = 0; r < ROUNDS; ++r) {
      const int b = r & 1;
      nbar_sync(4 + b, 384);
      for (int i = t; i < WORDS; i += 256) buf[b][i] = float(r * WORDS + i);
      nbar_arrive(2 + b, 384);
    }
  }
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  float* out;
  cudaMalloc(&out, 128 * sizeof(float));
  probe<<<4, 384>>>(out, mode);
  float h[128];
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  double want = 0;  // consumer 0's sum over all rounds of the words it reads
  for (int r = 0; r < ROUNDS; ++r) for (int i = 0; i < WORDS; i += 128) want += r * WORDS + i;
  const cudaError_t e = cudaGetLastError();
  printf("mode %d: %s, consumer 0 sum %.0f (want %.0f)\n", mode, cudaGetErrorString(e), h[0], want);
  return e == cudaSuccess && (mode == 2 || h[0] == (float)want) ? 0 : 1;  // mode 2 may read stale words
}
