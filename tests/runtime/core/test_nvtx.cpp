// Note [NVTX ranges]: in a CUDA build every ProfileScope is an NVTX range,
// with BT_PROFILE or without. The test is the NVTX tool itself: a static
// injection (NVTX's loader binds its weak InitializeInjectionNvtx2_fnptr to
// the definition below when no NVTX_INJECTION64_PATH is set) that records
// every range pushed and popped in this process. No GPU is needed: NVTX is
// host code.
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/profiler.h"

#ifdef BT_CUDA
#include <cstdint>

// This file defines the injection symbol (below); NVTX's loader code, which
// the header brings, reads it, so it is declared first.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(uint32_t));
#include <nvtx3/nvToolsExt.h>

namespace {

std::mutex g_mu;
std::vector<std::string> g_events;

int NVTX_API on_push(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::string("push ") + name);
  return 0;
}

int NVTX_API on_pop() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back("pop");
  return 0;
}

int NVTX_API initialize(NvtxGetExportTableFunc_t get) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) ||
      size <= NVTX_CBID_CORE_RangePop)
    return 0;
  *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&on_push);
  *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&on_pop);
  return 1;
}

}  // namespace

extern "C" NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = &initialize;
#endif

namespace bt {
namespace {

TEST(Nvtx, EveryProfileScopeIsARangeWithoutBtProfile) {
#ifndef BT_CUDA
  GTEST_SKIP() << "built without CUDA: no NVTX";
#else
  ASSERT_FALSE(profiling_enabled()) << "run without BT_PROFILE: the ranges must not need it";
  {
    ProfileScope step("step");
    {
      ProfileScope block("block");
      ProfileScope attention(std::string("attention"));
    }
    ProfileScope head("head");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  const std::vector<std::string> want = {
      "push step", "push block", "push attention", "pop", "pop", "push head", "pop", "pop"};
  EXPECT_EQ(g_events, want);
#endif
}

}  // namespace
}  // namespace bt
