#include "src/nvlink/backend.h"

#include "absl/strings/str_format.h"
#include "src/common/status.h"

namespace reshard::nvlink::internal {

absl::Status CheckEdgeBufferKinds(
    const FanoutContext& ctx, MemoryKind kind,
    const std::function<absl::Status(const FanoutEdge& edge, uint32_t buffer)>& also) {
  for (const FanoutEdge& e : ctx.table->edges) {
    if (e.from_rank != ctx.rank && e.to_rank != ctx.rank) continue;
    const uint32_t b = e.from_rank == ctx.rank ? e.from_buffer : e.to_buffer;
    if (ctx.buffers[b].kind != kind) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "buffer %d of rank %d is %s memory, not %s memory", b, ctx.rank,
          MemoryKindName(ctx.buffers[b].kind), kind == MemoryKind::kCuda ? "CUDA" : "host"));
    }
    if (also) RESHARD_RETURN_IF_ERROR(also(e, b));
  }
  return absl::OkStatus();
}

absl::Status BoardBackend::Progress(uint64_t epoch, std::vector<uint32_t>* arrived,
                                    std::vector<uint32_t>* completed) {
  RESHARD_RETURN_IF_ERROR(Complete(completed));
  boards_.Scan(epoch, arrived);
  return absl::OkStatus();
}

}  // namespace reshard::nvlink::internal
