#include "runtime/core/cuda_graph.h"

#include <atomic>

#include "kernels/common/error.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"
#endif

namespace bt {
namespace {
std::atomic<int> g_captures{0};
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
  nodes_ = 0;
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
