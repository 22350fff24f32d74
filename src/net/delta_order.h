// The order in which the refit engine posts its delta pieces, for the pipelined GPU encode
// (docs/delta.md, "The GPU encode pipeline"): a pure function of the send program, tested on the
// CPU with real programs (tests/net/delta_batch_test.cc).
//
// The engine (RefitEngine::Impl::PostSends) posts round-robin over its peer links, one
// descriptor per link per round; the links are program.peers rotated left by rank % their
// number (ranks sending to the same receivers start at different ones), and each link posts its
// initial descriptors (DependencyIndex::initial(), those without `after`) in that order. Delta
// pieces never have `after`, so this order is their posting order once every destination has
// granted (a destination that grants late only delays its own link: the others go on).
#pragma once

#include <cstdint>
#include <vector>

#include "src/net/send_program.h"

namespace reshard::net {

// The descriptors `selected` (by descriptor) names, among p's initial network descriptors, in
// the engine's posting order.
std::vector<uint32_t> DeltaPostingOrder(const SendProgram& p, const std::vector<bool>& selected);

}  // namespace reshard::net
