"""Each image's K best rows, best first: ``top_rows(xp, y, out, col)`` writes into ``out``
[N, K, C] the K rows of ``y`` [N, B, C] (float32, K <= B, K <= 4096) with the highest values
in column ``col``, in that order; rows of equal value keep their order in ``y`` (a stable
sort), and -0.0 ranks with 0.0 (where a NaN ranks is not defined: the epilogue's
``AllFinite`` answers such an image as an error). It is numpy's
``take_along_axis(y, argsort(-y[..., col], kind="stable")[:, :K, None], axis=1)``.

The detection epilogue (``DetectHead`` with ``keep``) ranks each image's boxes by score
with it on the device, so the host reads and NMS-es the ``max_candidates`` boxes that NMS
considers, best first, not every box the head has (8,400 for a 640x640 YOLOv8 head, of
which NMS takes 512 by default).

On cupy one block an image does it all in shared memory, with nothing allocated and no
host sync: a radix select of the K-th best value (four passes of 8-bit histograms over the
image's rows), the rows above it and as many of those equal to it as fit gathered in their
order (block-wide scans), then a bitonic sort of those K by (value down, row up) and the
copy of each row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _cuda

MAX_K = 4096
THREADS = 1024

SOURCE = r"""
__device__ __forceinline__ unsigned int value_key(float f) {
  // larger float -> larger key; -0.0 as 0.0 (numpy sorts them as equal)
  if (f == 0.0f) f = 0.0f;
  unsigned int u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The exclusive prefix of v over the block's threads, in thread order, and the block's total.
// Every thread of the block calls it (it synchronises).
__device__ int block_scan(int v, int* total, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // the last call's readers are done with warp_sums
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nw ? warp_sums[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < nw) warp_sums[lane] = w;
  }
  __syncthreads();
  *total = warp_sums[nw - 1];
  return (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
}

extern "C" __global__ void top_rows(const float* __restrict__ y, float* __restrict__ out,
                                    int B, int K, int C, int col) {
  __shared__ unsigned int skey[4096];
  __shared__ int sidx[4096];
  __shared__ unsigned int hist[256];
  __shared__ int warp_sums[32];
  __shared__ unsigned int s_prefix, s_mask;
  __shared__ int s_left;
  const int tid = threadIdx.x, nt = blockDim.x;
  const float* yr = y + (long long)blockIdx.x * B * C;
  float* outr = out + (long long)blockIdx.x * K * C;
  if (tid == 0) { s_prefix = 0u; s_mask = 0u; s_left = K; }
  __syncthreads();
  // the radix select: after the passes s_prefix is the K-th best key and s_left how many
  // rows of that key the K take (the rest of the K are above it)
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += nt) hist[i] = 0u;
    __syncthreads();
    const unsigned int prefix = s_prefix, mask = s_mask;
    for (int i = tid; i < B; i += nt) {
      unsigned int k = value_key(yr[(long long)i * C + col]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      const unsigned int left = (unsigned int)s_left;
      unsigned int above = 0u;
      int b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= left) break;
        above += hist[b];
      }
      s_left = (int)(left - above);
      s_prefix = prefix | ((unsigned int)b << shift);
      s_mask = mask | (255u << shift);
    }
    __syncthreads();
  }
  const unsigned int kth = s_prefix;
  const int ties = s_left;
  // the K rows, in their order in y
  int taken = 0, equal_seen = 0;
  for (int base = 0; base < B && taken < K; base += nt) {
    const int i = base + tid;
    unsigned int k = 0u;
    int above = 0, equal = 0;
    if (i < B) {
      k = value_key(yr[(long long)i * C + col]);
      above = k > kth;
      equal = k == kth;
    }
    int equal_total, take_total;
    const int equal_before = block_scan(equal, &equal_total, warp_sums);
    const int take = above || (equal && equal_seen + equal_before < ties);
    const int at = taken + block_scan(take, &take_total, warp_sums);
    if (take) { skey[at] = k; sidx[at] = i; }
    taken += take_total;
    equal_seen += equal_total;
  }
  int P = 1;
  while (P < K) P <<= 1;
  for (int i = K + tid; i < P; i += nt) { skey[i] = 0u; sidx[i] = 0x7fffffff; }
  __syncthreads();
  // bitonic sort: value down, then row up
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P; i += nt) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned int ki = skey[i], kj = skey[j];
          const int ii = sidx[i], ij = sidx[j];
          const bool j_first = kj > ki || (kj == ki && ij < ii);
          if (j_first == ((i & size) == 0)) {
            skey[i] = kj; skey[j] = ki; sidx[i] = ij; sidx[j] = ii;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int t = tid; t < K * C; t += nt) {
    const int r = t / C, c = t - r * C;
    outr[t] = yr[(long long)sidx[r] * C + c];
  }
}
"""


def top_rows(xp: Any, y: Any, out: Any, col: int) -> None:
    """``out`` [N, K, C] = each image's K rows of ``y`` [N, B, C] (float32, contiguous)
    highest in column ``col``, best first (stable), on ``xp``'s device."""
    n, b, c = y.shape
    k = out.shape[1]
    if not (1 <= k <= min(b, MAX_K)) or out.shape != (n, k, c):
        raise ValueError(f"top_rows: out [N, K<=min(B, {MAX_K}), C] for y {y.shape}: {out.shape}")
    if xp is np:
        order = np.argsort(-y[..., col], axis=1, kind="stable")[:, :k]
        out[...] = np.take_along_axis(y, order[..., None], axis=1)
        return
    if n == 0:
        return
    kern = _cuda.kernel(SOURCE, "top_rows", "float32")
    kern((n,), (THREADS,), (y, out, np.int32(b), np.int32(k), np.int32(c), np.int32(col)))
