#include "src/net/ring_plan.h"

#include "absl/strings/str_format.h"
#include "src/common/status.h"
#include "src/net/posting_order.h"
#include "src/plan/region.h"

namespace reshard::net {

absl::StatusOr<RingPlan> PlanRing(const plan::Plan& plan, const SendProgram& program,
                                  const std::vector<bool>& selected,
                                  const std::vector<int64_t>& shift, int64_t base_align,
                                  int64_t budget_bytes) {
  // Each descriptor's stream, splittable at its runs.
  std::vector<cuda::BatchPiece> pieces;
  for (uint32_t i : PostingOrder(program, selected, /*local_copies=*/true)) {
    const SendDesc& d = program.descs[i];
    cuda::BatchPiece piece{i, 0};
    for (uint32_t r = d.run_begin; r < d.run_end; ++r) {
      if (r > d.run_begin) piece.cuts.push_back(piece.bytes);
      piece.bytes += program.runs[r].bytes;
    }
    pieces.push_back(std::move(piece));
  }
  const cuda::BatchPlan batches = cuda::PlanBatches(pieces, budget_bytes, cuda::kStageRingSlots);
  RingPlan ring;
  ring.slots = batches.slots;
  ring.slot_bytes = batches.slot_bytes;
  if (batches.batches() == 0) return ring;
  // Parts as runs: PlanBatches cut each piece at run boundaries only.
  ring.first_part.assign(program.descs.size(), -1);
  uint32_t run = 0;
  for (int32_t b = 0; b < batches.batches(); ++b) {
    ring.batch_begin.push_back(static_cast<uint32_t>(ring.parts.size()));
    for (uint32_t e = batches.batch_begin[b]; e < batches.batch_begin[b + 1]; ++e) {
      const cuda::BatchPlan::Entry& entry = batches.entries[e];
      const SendDesc& d = program.descs[entry.id];
      if (entry.begin == 0) {
        ring.first_part[entry.id] = static_cast<int64_t>(ring.parts.size());
        run = d.run_begin;
      }
      RingPart part{entry.id, run, run, b, entry.offset, entry.begin, entry.bytes};
      int64_t covered = 0;
      while (covered < entry.bytes) covered += program.runs[part.run_end++].bytes;
      RESHARD_CHECK(covered == entry.bytes && part.run_end <= d.run_end);
      run = part.run_end;
      ring.parts.push_back(part);
    }
  }
  ring.batch_begin.push_back(static_cast<uint32_t>(ring.parts.size()));
  // One pack batch per ring batch: each part's stream range is slabs of its source region
  // (plan::ForEachSlab: rows of one width at one pitch), packed at the part's slot offset.
  cuda::PackBatchOptions options;
  options.strided_base_align = base_align;
  options.packed_base_align = cuda::kMaxPackWidth;  // Slots start at multiples of kBatchAlign.
  ring.pack.resize(static_cast<size_t>(batches.batches()));
  ring.batch_bytes.assign(static_cast<size_t>(batches.batches()), 0);
  std::vector<cuda::StridedRegion> slabs;
  for (int32_t b = 0; b < batches.batches(); ++b) {
    ring.pack[b].strided_base_align = options.strided_base_align;
    ring.pack[b].packed_base_align = options.packed_base_align;
    for (uint32_t k = ring.batch_begin[b]; k < ring.batch_begin[b + 1]; ++k) {
      const RingPart& part = ring.parts[k];
      const SendDesc& d = program.descs[part.desc];
      const plan::Transfer& t = plan.transfers()[d.transfer];
      const plan::Region& region = plan.region(t.region);
      slabs.clear();
      plan::ForEachSlab(
          region, plan.region_dims(region), part.begin, part.begin + part.bytes,
          [&](int64_t from, int64_t, int64_t width, int64_t rows, int64_t from_pitch, int64_t) {
            cuda::StridedRegion slab;
            slab.offset = shift[d.from_buffer] + from;
            slab.run_bytes = width;
            slab.ndims = rows > 1 ? 1 : 0;
            slab.count[0] = rows;
            slab.stride[0] = from_pitch;
            slabs.push_back(slab);
          });
      options.packed_begin = part.offset;
      absl::StatusOr<cuda::PackBatch> built = cuda::BuildPackBatch(slabs, options);
      absl::Status appended =
          built.ok() ? cuda::AppendPackBatch(*built, &ring.pack[b]) : built.status();
      if (!appended.ok()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("the staging ring's batch %d (tensor \"%s\"): %s", b,
                            plan.spec().tensors[t.tensor].name, appended.message()));
      }
      ring.batch_bytes[b] += part.bytes;
    }
  }
  return ring;
}

}  // namespace reshard::net
