// Landing's view of a region for the CUDA delta kernels (DeltaPieceOf, src/net/landing.h): on
// both sides, element e of the piece lies where plan::ForEachRun's runs put it, for every region
// of the example specs' plans (rows to columns, fused q/k/v views, uneven nested shards, a
// domain schedule with fan-out), so the GPU encode reads and the GPU apply writes exactly the
// bytes the host path gathers and applies.
#include "src/net/landing.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/cuda/delta_index.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

TEST(DeltaPieceOf, ElementsLieWhereTheRegionsRunsPutThem) {
  int64_t regions = 0, strided = 0;
  for (const char* name :
       {"fig1-rows-to-cols", "fig3-tp4-to-tp2dp2", "fused-qkv", "uneven-nested"}) {
    SCOPED_TRACE(name);
    std::ifstream in(std::string(RESHARD_SOURCE_DIR) + "/examples/specs/" + name + ".json");
    std::stringstream text;
    text << in.rdbuf();
    auto spec = plan::ParseSpecJson(text.str());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const plan::Transfer& t : plan->transfers()) {
      const plan::Region& region = plan->region(t.region);
      if (region.bytes == 0) continue;
      // As the engine compares elements (DeltaElemBytes): at the destination's element size.
      const int es = plan->buffers()[plan->buffer_of(t.tensor, t.to_side)].elem_bytes;
      for (const bool source : {true, false}) {
        const cuda::DeltaPiece p = DeltaPieceOf(*plan, region, source, es);
        ASSERT_EQ(p.elems * es, region.bytes);
        int64_t e = 0;
        plan::ForEachRun(region, plan->region_dims(region),
                         [&](int64_t from, int64_t to, int64_t n) {
                           for (int64_t k = 0; k < n / es; ++k, ++e) {
                             ASSERT_EQ(cuda::ElementOffset(p, e), (source ? from : to) + k * es)
                                 << "element " << e;
                           }
                         });
        ASSERT_EQ(e, p.elems);
      }
      ++regions;
      strided += region.ndims > 0;
    }
  }
  EXPECT_GT(regions, 20);
  EXPECT_GT(strided, 10);
}

}  // namespace
}  // namespace reshard::net
