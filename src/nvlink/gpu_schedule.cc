#include "src/nvlink/gpu_schedule.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_format.h"
#include "src/common/status.h"

namespace reshard::nvlink::internal {
namespace {

int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// `r` without its outermost dim, its offsets moved to slice `i` of that dim.
cuda::CopyRegion Slice(const cuda::CopyRegion& r, int64_t i) {
  cuda::CopyRegion s;
  s.from_offset = r.from_offset + i * r.from_stride[0];
  s.to_offset = r.to_offset + i * r.to_stride[0];
  s.run_bytes = r.run_bytes;
  s.ndims = r.ndims - 1;
  for (int d = 1; d < r.ndims; ++d) {
    s.count[d - 1] = r.count[d];
    s.from_stride[d - 1] = r.from_stride[d];
    s.to_stride[d - 1] = r.to_stride[d];
  }
  return s;
}

// Drops dims of count 1, merges a dim into the one outside it where both sides stay regular,
// and the innermost dim into the run where both sides are contiguous.
cuda::CopyRegion Normalize(const cuda::CopyRegion& in) {
  cuda::CopyRegion r = in;
  r.ndims = 0;
  for (int d = 0; d < in.ndims; ++d) {
    if (in.count[d] == 1) continue;
    const int n = r.ndims;
    if (n > 0 && r.from_stride[n - 1] == in.from_stride[d] * in.count[d] &&
        r.to_stride[n - 1] == in.to_stride[d] * in.count[d]) {
      r.count[n - 1] *= in.count[d];
      r.from_stride[n - 1] = in.from_stride[d];
      r.to_stride[n - 1] = in.to_stride[d];
      continue;
    }
    r.count[n] = in.count[d];
    r.from_stride[n] = in.from_stride[d];
    r.to_stride[n] = in.to_stride[d];
    r.ndims = n + 1;
  }
  while (r.ndims > 0 && r.from_stride[r.ndims - 1] == r.run_bytes &&
         r.to_stride[r.ndims - 1] == r.run_bytes) {
    r.run_bytes *= r.count[r.ndims - 1];
    r.count[r.ndims - 1] = 0;
    r.from_stride[r.ndims - 1] = r.to_stride[r.ndims - 1] = 0;
    --r.ndims;
  }
  for (int d = r.ndims; d < cuda::kMaxPackDims; ++d) {
    r.count[d] = r.from_stride[d] = r.to_stride[d] = 0;
  }
  return r;
}

// Rows per slice when a slice stride is a whole number (>= count) of row pitches.
int64_t RowsPerSlice(int64_t slice_stride, int64_t pitch, int64_t rows) {
  if (pitch <= 0 || slice_stride <= 0 || slice_stride % pitch != 0) return 0;
  const int64_t q = slice_stride / pitch;
  return q >= rows ? q : 0;
}

}  // namespace

cuda::CopyRegion CopyRegionOf(const FanoutTable& table, const FanoutEdge& e) {
  cuda::CopyRegion r;
  r.from_offset = e.region.from_offset;
  r.to_offset = e.region.to_offset;
  r.run_bytes = e.region.run_bytes;
  r.ndims = e.region.ndims;
  const plan::RegionDim* dims = table.dims_of(e);
  for (int d = 0; d < e.region.ndims; ++d) {
    r.count[d] = dims[d].count;
    r.from_stride[d] = dims[d].from_stride;
    r.to_stride[d] = dims[d].to_stride;
  }
  if (e.region.bytes == 0) r.run_bytes = 0;  // A region with no bytes moves none.
  return r;
}

void SplitRegion(const cuda::CopyRegion& r, int64_t max_bytes, std::vector<cuda::CopyRegion>* out) {
  RESHARD_CHECK(max_bytes > 0);
  if (r.bytes() <= max_bytes) {
    out->push_back(r);
    return;
  }
  if (r.ndims == 0) {
    for (int64_t at = 0; at < r.run_bytes; at += max_bytes) {
      cuda::CopyRegion part;
      part.from_offset = r.from_offset + at;
      part.to_offset = r.to_offset + at;
      part.run_bytes = std::min(max_bytes, r.run_bytes - at);
      out->push_back(part);
    }
    return;
  }
  const int64_t slice_bytes = Slice(r, 0).bytes();
  if (slice_bytes <= max_bytes) {
    const int64_t per = max_bytes / std::max<int64_t>(slice_bytes, 1);
    for (int64_t i = 0; i < r.count[0]; i += per) {
      cuda::CopyRegion part = r;
      part.from_offset = r.from_offset + i * r.from_stride[0];
      part.to_offset = r.to_offset + i * r.to_stride[0];
      part.count[0] = std::min(per, r.count[0] - i);
      out->push_back(part);
    }
    return;
  }
  for (int64_t i = 0; i < r.count[0]; ++i) SplitRegion(Slice(r, i), max_bytes, out);
}

absl::StatusOr<NcclSchedule> BuildNcclSchedule(const FanoutTable& table, int32_t batch_edges,
                                               int64_t staging_bytes) {
  if (staging_bytes < kMinStagingBytes || staging_bytes % kStreamAlign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fan-out: the GPU staging budget of %d bytes must be a multiple of %d and at least %d",
        staging_bytes, kStreamAlign, kMinStagingBytes));
  }
  if (batch_edges < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fan-out: nccl_batch_edges is %d; it must be at least 1", batch_edges));
  }
  NcclSchedule s;
  s.batch_edges = batch_edges;
  s.staging_bytes = staging_bytes;
  const size_t n = table.edges.size();
  s.num_batches = static_cast<uint32_t>((n + batch_edges - 1) / batch_edges);
  std::vector<cuda::CopyRegion> parts;
  for (uint32_t k = 0; k < s.num_batches; ++k) {
    // Per round: bytes each rank's staging holds, and each ordered pair's stream length.
    std::map<int32_t, int64_t> usage;
    std::map<std::pair<int32_t, int32_t>, int64_t> streams;
    NcclRound round;
    round.batch = k;
    const auto close = [&] {
      if (round.pieces.empty()) return;
      for (const auto& [pair, bytes] : streams)
        round.streams.push_back({pair.first, pair.second, bytes});
      s.rounds.push_back(std::move(round));
      round = NcclRound();
      round.batch = k;
      usage.clear();
      streams.clear();
    };
    const size_t end = std::min(n, static_cast<size_t>(k + 1) * batch_edges);
    for (size_t i = static_cast<size_t>(k) * batch_edges; i < end; ++i) {
      const FanoutEdge& e = table.edges[i];
      parts.clear();
      SplitRegion(CopyRegionOf(table, e), staging_bytes, &parts);
      for (const cuda::CopyRegion& part : parts) {
        const int64_t bytes = part.bytes();
        if (bytes == 0) continue;
        const int64_t size = AlignUp(bytes, kStreamAlign);
        if (usage[e.from_rank] + size > staging_bytes || usage[e.to_rank] + size > staging_bytes) {
          close();
        }
        int64_t& stream = streams[{e.from_rank, e.to_rank}];
        round.pieces.push_back({static_cast<uint32_t>(i), part, stream});
        stream += size;
        usage[e.from_rank] += size;
        usage[e.to_rank] += size;
      }
    }
    close();
  }
  return s;
}

int64_t AddressAlignment(int64_t address) {
  int64_t a = cuda::kMaxPackWidth;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

absl::StatusOr<NcclRankProgram> BuildNcclRankProgram(const FanoutTable& table,
                                                     const NcclSchedule& schedule, int32_t rank,
                                                     const std::vector<int64_t>& buffer_addresses) {
  NcclRankProgram p;
  p.batches.resize(schedule.num_batches);
  // Bases: the lowest address among the buffers this rank sends from / receives into.
  bool any_from = false, any_to = false;
  for (size_t i = 0; i < table.edges.size(); ++i) {
    const FanoutEdge& e = table.edges[i];
    if (e.from_rank != rank && e.to_rank != rank) continue;
    const bool send = e.from_rank == rank;
    const uint32_t b = send ? e.from_buffer : e.to_buffer;
    if (b >= buffer_addresses.size() || buffer_addresses[b] == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fan-out: rank %d has no buffer %d, which tensor %s's piece %d %s", rank, b,
          e.tensor < table.tensor_names.size() ? table.tensor_names[e.tensor] : "?", e.transfer,
          send ? "is sent from" : "lands in"));
    }
    int64_t& base = send ? p.from_base : p.to_base;
    bool& any = send ? any_from : any_to;
    base = any ? std::min(base, buffer_addresses[b]) : buffer_addresses[b];
    any = true;
    NcclRankBatch& batch = p.batches[i / schedule.batch_edges];
    (send ? batch.sends : batch.recvs).push_back(static_cast<uint32_t>(i));
  }
  const auto shift = [&](uint32_t buffer, int64_t base) { return buffer_addresses[buffer] - base; };
  for (uint32_t r = 0; r < schedule.rounds.size(); ++r) {
    const NcclRound& round = schedule.rounds[r];
    NcclRankRound rr;
    rr.round = r;
    // Staging: sends, then receives, peers ascending (streams are sorted by sender, receiver).
    int64_t cursor = 0;
    for (const NcclStreamSize& st : round.streams) {
      if (st.from_rank != rank) continue;
      rr.sends.push_back({st.to_rank, cursor, st.bytes});
      cursor += st.bytes;
    }
    const int64_t sends_end = cursor;
    for (const NcclStreamSize& st : round.streams) {
      if (st.to_rank != rank) continue;
      rr.recvs.push_back({st.from_rank, cursor, st.bytes});
      cursor += st.bytes;
    }
    if (rr.sends.empty() && rr.recvs.empty()) continue;
    p.staging_bytes = std::max(p.staging_bytes, cursor);
    // Pack and unpack regions in staging order; the batch builder lays them out densely at
    // kStreamAlign, which reproduces the stream offsets (checked below).
    std::vector<cuda::StridedRegion> pack, unpack;
    std::vector<int64_t> pack_at, unpack_at;
    for (const NcclStream& st : rr.sends) {
      for (const NcclPiece& piece : round.pieces) {
        const FanoutEdge& e = table.edges[piece.edge];
        if (e.from_rank != rank || e.to_rank != st.peer) continue;
        pack.push_back(piece.region.FromSide(shift(e.from_buffer, p.from_base)));
        pack_at.push_back(st.staging_offset + piece.stream_offset);
      }
    }
    for (const NcclStream& st : rr.recvs) {
      for (const NcclPiece& piece : round.pieces) {
        const FanoutEdge& e = table.edges[piece.edge];
        if (e.to_rank != rank || e.from_rank != st.peer) continue;
        unpack.push_back(piece.region.ToSide(shift(e.to_buffer, p.to_base)));
        unpack_at.push_back(st.staging_offset + piece.stream_offset);
      }
    }
    cuda::PackBatchOptions po;
    po.region_align = kStreamAlign;
    po.packed_base_align = kStreamAlign;  // Staging comes from cudaMalloc.
    po.strided_base_align = AddressAlignment(p.from_base);
    RESHARD_ASSIGN_OR_RETURN(rr.pack, cuda::BuildPackBatch(pack, po));
    po.strided_base_align = AddressAlignment(p.to_base);
    po.packed_begin = sends_end;
    RESHARD_ASSIGN_OR_RETURN(rr.unpack, cuda::BuildPackBatch(unpack, po));
    RESHARD_CHECK(rr.pack.packed_offsets == pack_at);
    RESHARD_CHECK(rr.unpack.packed_offsets == unpack_at);
    p.pieces += static_cast<int64_t>(pack.size() + unpack.size());
    ++p.rounds;
    p.batches[round.batch].rounds.push_back(std::move(rr));
  }
  return p;
}

const char* GpuCopyMethodName(GpuCopyMethod m) {
  switch (m) {
    case GpuCopyMethod::kNothing:
      return "nothing";
    case GpuCopyMethod::kMemcpy:
      return "cudaMemcpyAsync";
    case GpuCopyMethod::kMemcpy2D:
      return "cudaMemcpy2DAsync";
    case GpuCopyMethod::kMemcpy3D:
      return "cudaMemcpy3DAsync";
    case GpuCopyMethod::kKernel:
      return "copy kernel";
  }
  return "?";
}

GpuCopy ChooseGpuCopy(const cuda::CopyRegion& in, bool kernel_only) {
  GpuCopy c;
  c.region = Normalize(in);
  const cuda::CopyRegion& r = c.region;
  if (r.bytes() == 0) return c;
  if (kernel_only) {
    c.method = GpuCopyMethod::kKernel;
    return c;
  }
  if (r.ndims == 0) {
    c.method = GpuCopyMethod::kMemcpy;
    c.width = r.run_bytes;
    return c;
  }
  c.method = GpuCopyMethod::kKernel;
  if (r.run_bytes < kMinCopyEngineRun) return c;
  const int inner = r.ndims - 1;
  // Rows: pitches that hold a whole row on both sides (no aliasing reads either).
  if (r.from_stride[inner] < r.run_bytes || r.to_stride[inner] < r.run_bytes) return c;
  if (r.ndims == 1) {
    c.method = GpuCopyMethod::kMemcpy2D;
  } else if (r.ndims == 2) {
    c.from_rows = RowsPerSlice(r.from_stride[0], r.from_stride[1], r.count[1]);
    c.to_rows = RowsPerSlice(r.to_stride[0], r.to_stride[1], r.count[1]);
    if (c.from_rows == 0 || c.to_rows == 0) return c;
    c.method = GpuCopyMethod::kMemcpy3D;
    c.depth = r.count[0];
  } else {
    return c;
  }
  c.width = r.run_bytes;
  c.height = r.count[inner];
  c.from_pitch = r.from_stride[inner];
  c.to_pitch = r.to_stride[inner];
  return c;
}

}  // namespace reshard::nvlink::internal
