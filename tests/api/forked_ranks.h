// What the API suites that fork their ranks share (share_session_test, quantized_refit_test):
// the public store callbacks over a file store the forked ranks share, the transport of a
// parametrised test, and CHILD_EXPECT, which fails a forked rank (its exit status) with the
// file, line and a message instead of aborting it.
#pragma once

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "src/rendezvous/store.h"
#include "tests/testing/multiprocess.h"

namespace reshard::forked {

// A fresh directory for a file store, per test and process (removed when the test exits).
inline std::string StoreDir(const std::string& suite, const std::string& tag) {
  return testing::ScratchDir(absl::StrCat(suite, "-", tag));
}

// The public API's store callbacks over `store`.
inline StoreCallbacks Callbacks(rendezvous::Store* store) {
  StoreCallbacks cb;
  cb.set = [store](const std::string& k, const std::string& v) { return store->Set(k, v); };
  cb.get = [store](const std::string& k, absl::Time deadline) { return store->Get(k, deadline); };
  cb.list = [store](const std::string& prefix) { return store->List(prefix); };
  cb.del = [store](const std::string& k) { return store->Delete(k); };
  return cb;
}

// UCX over shared memory ("sm") or loopback tcp ("tcp"), a 120 s deadline per rank.
inline testing::ForkOptions Transport(const std::string& name) {
  testing::ForkOptions fork = testing::SharedMemoryUcx(absl::Seconds(120));
  if (name == "tcp") {
    fork.env = {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}, {"UCX_WARN_UNUSED_ENV_VARS", "n"}};
  }
  return fork;
}

}  // namespace reshard::forked
