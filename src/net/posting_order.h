// The order in which the refit engine posts its network descriptors, for the two GPU pipelines
// that fill pinned slots ahead of posting (the delta encode, docs/delta.md "The GPU encode
// pipeline"; the staging ring, docs/data-plane.md "The staging ring"): a pure function of the
// send program, tested on the CPU with real programs (tests/net/batch_plan_test.cc).
//
// The engine (RefitEngine::Impl::PostSends) posts round-robin over its peer links, one
// descriptor per link per round; the links are program.peers rotated left by rank % their
// number (ranks sending to the same receivers start at different ones), and each link posts its
// initial descriptors (DependencyIndex::initial(), those without `after`) in that order. The
// pipelines select only descriptors without `after`, so this order is their posting order once
// every destination has granted (a destination that grants late only delays its own link: the
// others go on). Local copies (peer == rank) run in their own queue, in initial() order.
#pragma once

#include <cstdint>
#include <vector>

#include "src/net/send_program.h"

namespace reshard::net {

// The descriptors `selected` (by descriptor) names, among p's initial network descriptors, in
// the engine's posting order; with `local_copies`, followed by the selected initial local copies
// in the order the engine runs them.
std::vector<uint32_t> PostingOrder(const SendProgram& p, const std::vector<bool>& selected,
                                   bool local_copies = false);

}  // namespace reshard::net
