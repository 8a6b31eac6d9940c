#include "runtime/core/cuda_graph.h"

#include <atomic>
#include <vector>

#include "kernels/common/error.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"
#include "kernels/copy.h"
#endif

namespace bt {
namespace {
std::atomic<int> g_captures{0};

#ifdef BT_CUDA
// Note [Small memsets as kernel nodes]
// cuBLASLt zeroes a 4-byte word of its workspace with a memset before each of
// its persistent GEMM kernels (those named nvjet_..._tst_...): 99 of the 104
// memset nodes in the graph of a bf16 GPT-2 step, one for each of those GEMMs.
// Between two kernels, a memset node costs about 2.0 us of GPU time and a
// kernel node that writes the same bytes about 0.7 us (one H200: chains of
// 200 small kernels, bench/RESULTS.md issue 18 step 22). So a capture ends by
// replacing each memset node of one row of at most kMemsetKernelMaxBytes with
// a one-block kernel node that writes the same bytes, joined to the same
// dependencies and dependents. What the graph computes is unchanged; larger
// memsets stay memset nodes.
std::vector<cudaGraphNode_t> edges(cudaGraphNode_t node, bool dependents) {
  size_t n = 0;
  if (dependents)
    BT_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  else
    BT_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> out(n);
  if (n == 0) return out;
  if (dependents)
    BT_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, out.data(), nullptr, &n));
  else
    BT_CUDA_CHECK(cudaGraphNodeGetDependencies(node, out.data(), nullptr, &n));
  out.resize(n);
  return out;
}

/// Replaces the small memset nodes of `graph` with kernel nodes; returns how many.
size_t small_memsets_to_kernels(cudaGraph_t graph) {
  size_t n = 0;
  BT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) BT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  size_t replaced = 0;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType type;
    BT_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams p{};
    BT_CUDA_CHECK(cudaGraphMemsetNodeGetParams(nodes[i], &p));
    kernels::cuda::MemsetKernelNode k;
    if (!kernels::cuda::memset_kernel_node(p, &k)) continue;
    const std::vector<cudaGraphNode_t> before = edges(nodes[i], false), after = edges(nodes[i], true);
    cudaGraphNode_t node = nullptr;
    BT_CUDA_CHECK(cudaGraphAddKernelNode(&node, graph, before.data(), before.size(), &k.params));
    for (cudaGraphNode_t d : after) BT_CUDA_CHECK(cudaGraphAddDependencies(graph, &node, &d, nullptr, 1));
    BT_CUDA_CHECK(cudaGraphDestroyNode(nodes[i]));
    ++replaced;
  }
  return replaced;
}
#endif
}  // namespace

bool capture_underway() { return g_captures.load(std::memory_order_relaxed) > 0; }

CaptureScope::CaptureScope() { ++g_captures; }
CaptureScope::~CaptureScope() { --g_captures; }

CudaGraph::~CudaGraph() {
  try {
    reset();
  } catch (...) {
    // A destructor must not throw; the device is failing anyway.
  }
}

void CudaGraph::reset() {
#ifdef BT_CUDA
  if (exec_ != nullptr) BT_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  if (graph_ != nullptr) BT_CUDA_CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
#endif
  exec_ = graph_ = nullptr;
  nodes_ = memsets_replaced_ = 0;
}

void CudaGraph::capture(const Stream& s, const std::function<void()>& fn) {
  BT_CHECK(s.device().is_cuda() && s.handle() != nullptr,
           "CudaGraph::capture: needs a created CUDA stream (not the CPU, not the legacy default stream)");
#ifdef BT_CUDA
  reset();
  auto cs = static_cast<cudaStream_t>(s.handle());
  StreamGuard g(s);
  CaptureScope mark;
  // Relaxed: the caching allocator may take a new segment (cudaMalloc) during
  // the capture, and the data loader's thread keeps pinning host memory.
  BT_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  try {
    fn();
  } catch (...) {
    (void)cudaStreamEndCapture(cs, &graph);  // ends the capture; the graph is discarded
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  const cudaError_t e = cudaStreamEndCapture(cs, &graph);
  if (e != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    BT_FAIL(
        "CUDA graph capture failed: ", cudaGetErrorString(e),
        " (work the capture cannot record, such as a synchronization or a copy from pageable host memory, "
        "ran inside it); set train.cuda_graph: false to run eagerly");
  }
  graph_ = graph;
  memsets_replaced_ = small_memsets_to_kernels(graph);
  size_t n = 0;
  BT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  nodes_ = n;
  cudaGraphExec_t exec = nullptr;
  BT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
#else
  (void)fn;
#endif
}

void CudaGraph::replay(const Stream& s) const {
  BT_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing was captured");
#ifdef BT_CUDA
  BT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(s.handle())));
#endif
}

}  // namespace bt
