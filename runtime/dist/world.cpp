#include "runtime/dist/world.h"

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "runtime/dist/checks.h"
#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/nccl_process_group.h"

namespace bt::dist {
namespace {

World g_world;
bool g_init = false;
std::shared_ptr<ProcessGroup> g_cpu_group, g_gpu_group;

bool has_env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

bool started_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMIX_RANK") || has_env("PMI_RANK") ||
         has_env("PMI_SIZE");
}

}  // namespace

const World& init_world() {
  if (g_init) return g_world;
  int already = 0;
  BT_MPI_CHECK(MPI_Initialized(&already));
  if (started_by_mpi() || already) {  // already: the host program initialized MPI (a singleton, say)
    int inited = 0;
    BT_MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
      int provided = 0;
      // MULTIPLE: the NCCL group's watchdog thread asks MPI who has arrived.
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      BT_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed (error ", rc,
               "): the job was started by mpirun/srun, but MPI could not start; check the launcher's output");
      BT_CHECK(provided == MPI_THREAD_MULTIPLE,
               "this MPI library does not support MPI_THREAD_MULTIPLE (got level ", provided,
               "); BluTrain needs it (Open MPI 4 has it)");
    }
    BT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    BT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank));
    BT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_world.size));
    MPI_Comm local;
    BT_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world.rank, MPI_INFO_NULL, &local));
    BT_MPI_CHECK(MPI_Comm_rank(local, &g_world.local_rank));
    BT_MPI_CHECK(MPI_Comm_size(local, &g_world.local_size));
    BT_MPI_CHECK(MPI_Comm_free(&local));
    g_world.mpi = true;
    g_world.launched_by = "mpi";
  } else if (has_env("RANK") || has_env("WORLD_SIZE") || has_env("LOCAL_RANK")) {
    const char* ws = std::getenv("WORLD_SIZE");
    BT_CHECK(
        !ws || std::string(ws) == "1" || std::string(ws).empty(), "WORLD_SIZE=", ws ? ws : "",
        " is set, but starting ranks from torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, "
        "MASTER_ADDR, MASTER_PORT) is not supported yet; start the job with `blutrain launch --nproc N -- "
        "train ...` or mpirun/srun");
    g_world.launched_by = "single";
  } else {
    g_world.launched_by = "single";
  }
  g_init = true;
  return g_world;
}

const World& world() { return g_world; }

std::shared_ptr<ProcessGroup> cpu_group() {
  BT_CHECK(g_world.mpi, "a CPU process group needs MPI: start the job with `blutrain launch` or mpirun");
  if (!g_cpu_group) g_cpu_group = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD);
  return g_cpu_group;
}

std::shared_ptr<ProcessGroup> device_group(const Device& d) {
  if (!d.is_cuda()) return cpu_group();
  BT_CHECK(g_world.mpi, "a CUDA process group needs MPI to start: use `blutrain launch` or mpirun");
#ifdef BT_NCCL
  if (!g_gpu_group) g_gpu_group = std::make_shared<NcclProcessGroup>(MPI_COMM_WORLD, d);
  return g_gpu_group;
#else
  BT_FAIL(
      "this build has no NCCL, so CUDA tensors cannot be shared across ranks; rebuild where NCCL is "
      "installed, or train with train.device=cpu");
#endif
}

void finalize_world() {
  g_gpu_group.reset();
  g_cpu_group.reset();
  if (g_world.mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  g_world = World{};
  g_init = false;
}

void abort_world(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (g_world.mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Abort(MPI_COMM_WORLD, code);
  }
  _exit(code);
}

}  // namespace bt::dist
