// A spec whose sources send relay feeds and other pieces to the same receivers (plan.h,
// Transfer::feeds_relay): two trainer ranks in one domain, three inference domains of two
// ranks. "a" and "c" are needed by every inference domain, so each source sends every piece of
// them once and relays carry it on; "b" and "d" are needed by one domain each, so nothing relays
// them. Plan order lists those first, so a sender's feeds follow other pieces on their links.
#pragma once

namespace reshard::net {

inline constexpr char kRelayFeedsSpec[] =
    R"json({"topology": {"domains": [[0, 1], [2, 3], [4, 5], [6, 7]]}, "tensors": [
  {"name": "b", "dtype": "fp32", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "d", "dtype": "bf16", "shape": [128, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [4, 5], "placements": ["S(1)"]}},
  {"name": "a", "dtype": "fp32", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
  {"name": "c", "dtype": "bf16", "shape": [128, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(0)"]}}]})json";

}  // namespace reshard::net
