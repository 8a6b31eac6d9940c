// A coarse, synchronizing profiler for finding where a training step's time
// goes when no GPU profiler is at hand. Enabled by the environment variable
// BT_PROFILE=1 (read once); otherwise every call is a cheap no-op.
//
// A ProfileScope synchronizes the device before and after its body, so the
// time it records is the body's device work plus its launch overhead, and the
// step runs slower than without profiling: read the shares, not the total.
// Nested scopes are recorded under "outer/inner" names. In a CUDA build every
// scope is also an NVTX range, profiling or not (Note [NVTX ranges] in
// profiler.cpp), for Nsight Systems traces.
#pragma once

#include <string>

namespace bt {

bool profiling_enabled();

class ProfileScope {
 public:
  explicit ProfileScope(const char* name);
  explicit ProfileScope(const std::string& name) : ProfileScope(name.c_str()) {}
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  bool on_;
  double t0_ = 0;
  size_t prefix_len_ = 0;
};

/// The table of scopes (total ms, calls, share of the top-level total), largest first.
std::string profile_report();
void profile_reset();

}  // namespace bt
