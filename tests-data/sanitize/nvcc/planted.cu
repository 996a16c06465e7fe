// Planted bugs for the emulator's sanitizers, compiled by nvcc (see build.sh). Each kernel has
// exactly one bug; building with -DFIXED gives the corrected kernel, which must report nothing.
// Launch: grid 2, block 128; out: 1024 floats written by the host, in: 1024 floats, n = 256.

// racecheck (shared): the exchange reads a slot another warp writes, with no barrier between
// (the tile is initialised first, so the read is a race, not a read of unwritten memory).
extern "C" __global__ void race_smem(float* out, const float* in, int n) {
  __shared__ volatile float s[128];
  int t = threadIdx.x;
  s[t] = 0.0f;
  __syncthreads();
  s[t] = in[blockIdx.x * 128 + t];
#ifdef FIXED
  __syncthreads();
#endif
  out[blockIdx.x * 128 + t] = s[127 - t];
}

// initcheck (shared): half of the tile is never written before it is read.
extern "C" __global__ void uninit_smem(float* out, const float* in, int n) {
  __shared__ float s[256];
  int t = threadIdx.x;
  s[t] = in[blockIdx.x * 128 + t];
#ifdef FIXED
  s[t + 128] = in[blockIdx.x * 128 + t] * 2.0f;
#endif
  __syncthreads();
  out[blockIdx.x * 128 + t] = s[t] + s[t + 128];
}

// synccheck: a barrier inside code that diverges within warp 1 (lanes 32..47 reach it).
extern "C" __global__ void divergent_barrier(float* out, const float* in, int n) {
  int t = threadIdx.x;
  float v = in[blockIdx.x * 128 + t];
#ifdef FIXED
  __syncthreads();
#else
  if (t < 48) __syncthreads();
#endif
  out[blockIdx.x * 128 + t] = v + 1.0f;
}

// racecheck (global): one thread of every CTA adds into out[0] without an atomic.
extern "C" __global__ void rmw_between_ctas(float* out, const float* in, int n) {
  if (threadIdx.x == 0) {
#ifdef FIXED
    atomicAdd(&out[0], in[blockIdx.x]);
#else
    out[0] += in[blockIdx.x];
#endif
  }
}

// memcheck: the store runs past the 1024-float buffer (index n*4 + t).
extern "C" __global__ void out_of_bounds(float* out, const float* in, int n) {
  int i = blockIdx.x * 128 + threadIdx.x;
#ifdef FIXED
  out[i] = in[i];
#else
  out[i + n * 4] = in[i];
#endif
}

// synccheck: a shuffle whose member mask leaves out lanes that execute it.
extern "C" __global__ void shfl_mask(float* out, const float* in, int n) {
  int i = blockIdx.x * 128 + threadIdx.x;
#ifdef FIXED
  unsigned mask = 0xffffffffu;
#else
  unsigned mask = 0x0000ffffu;
#endif
  out[i] = __shfl_sync(mask, in[i], 0);
}
