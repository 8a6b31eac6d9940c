#include "runtime/dist/world.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include <unistd.h>

#include "runtime/dist/auth.h"
#include "runtime/dist/checks.h"
#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/nccl_process_group.h"
#include "runtime/dist/tcp_process_group.h"
#include "runtime/dist/tcp_store.h"

namespace bt::dist {
namespace {

World g_world;
bool g_init = false;
std::shared_ptr<ProcessGroup> g_cpu_group, g_gpu_group;
std::unique_ptr<TcpStore> g_store;  // the rendezvous of a torchrun-style job

bool has_env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

bool started_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMIX_RANK") || has_env("PMI_RANK") ||
         has_env("PMI_SIZE");
}

const char* kEnvHelp =
    "a torchrun-style job sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT on every rank";

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  BT_CHECK(v && *v, name, " is not set; ", kEnvHelp);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  BT_CHECK(end && *end == 0 && x >= lo && x <= hi, name, "=", v, " must be an integer in [", lo, ", ", hi,
           "]; ", kEnvHelp);
  return static_cast<int>(x);
}

/// Note [Rendezvous]: rank 0 serves a TcpStore on MASTER_ADDR:MASTER_PORT.
/// Each rank claims its RANK (a second claim is an error) and posts its
/// WORLD_SIZE; rank 0 checks that all agree and posts a verdict the others
/// wait for, so a mismatch stops every rank with the same message. The store
/// then carries what the process groups need to connect: the NCCL unique id,
/// and where rank 0's TCP group listens (Note [TCP process group]). It stays
/// up until finalize_world, after the groups are gone.
void init_from_env(bool insecure) {
  const int size = env_int("WORLD_SIZE", 1, 1 << 20);
  const int rank = env_int("RANK", 0, size - 1);
  g_world.rank = rank;
  g_world.size = size;
  g_world.launched_by = size > 1 ? "env" : "single";
  if (size == 1) return;
  g_world.local_rank = env_int("LOCAL_RANK", 0, size - 1);
  g_world.local_size = has_env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE", 1, size) : size;
  const char* addr = std::getenv("MASTER_ADDR");
  BT_CHECK(addr && *addr, "MASTER_ADDR is not set; ", kEnvHelp);
  const int port = env_int("MASTER_PORT", 1, 65535);
  const double timeout_s =
      has_env("BT_RENDEZVOUS_TIMEOUT_S") ? std::atof(std::getenv("BT_RENDEZVOUS_TIMEOUT_S")) : 300;
  BT_CHECK(timeout_s > 0, "BT_RENDEZVOUS_TIMEOUT_S must be > 0 seconds");
  // Note [Authenticated rendezvous] in auth.cpp.
  const std::optional<std::string> token = auth::job_token();
  BT_CHECK(token || insecure, "this job of ", size,
           " ranks was started with torchrun-style variables but without a job token, so anyone who can "
           "reach MASTER_ADDR:MASTER_PORT (",
           addr, ":", port,
           ") could join it. Give every rank the same secret in BT_JOB_TOKEN (e.g. "
           "BT_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')) or a file named by "
           "BT_JOB_TOKEN_FILE; `blutrain k8s render` makes one per job. On a network only this job uses, "
           "dist.insecure: true runs without one");
  if (token && insecure && rank == 0)
    std::fprintf(stderr, "rendezvous: dist.insecure is true, but a job token is set: using it\n");
  g_store = std::make_unique<TcpStore>(addr, port, rank == 0,
                                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                                       token.value_or(""));
  TcpStore& st = *g_store;
  BT_CHECK(st.add(cat("rank/", rank, "/claims"), 1) == 1, "RANK=", rank,
           " is used by two processes; give every rank its own RANK in [0, WORLD_SIZE)");
  st.set(cat("rank/", rank, "/world_size"), std::to_string(size));
  if (rank == 0) {
    std::string verdict = "ok";
    for (int r = 1; r < size && verdict == "ok"; ++r) {
      const std::string theirs = st.get(cat("rank/", r, "/world_size"));
      if (theirs != std::to_string(size))
        verdict = cat("world-size mismatch: rank 0 has WORLD_SIZE=", size, " but rank ", r,
                      " has WORLD_SIZE=", theirs, "; start every rank with the same WORLD_SIZE");
    }
    st.set("verdict", verdict);
    // Serve until every rank has read the verdict: a barrier, and on a
    // mismatch every rank stops with the same message.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (st.add("verdict_read", 0) < size - 1) {
      BT_CHECK(std::chrono::steady_clock::now() < deadline,
               "rendezvous timeout: not every rank read rank 0's "
               "verdict within ",
               timeout_s, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BT_CHECK(verdict == "ok", verdict);
  } else {
    // Rank 0 checks only the ranks below its own WORLD_SIZE: compare with it first.
    const std::string zero = st.get("rank/0/world_size");
    if (zero != std::to_string(size)) {
      st.add("verdict_read", 1);
      BT_FAIL("world-size mismatch: rank 0 has WORLD_SIZE=", zero, " but rank ", rank,
              " has WORLD_SIZE=", size, "; start every rank with the same WORLD_SIZE");
    }
    const std::string verdict = st.get("verdict");
    st.add("verdict_read", 1);
    BT_CHECK(verdict == "ok", verdict);
  }
}

}  // namespace

const World& init_world(bool insecure) {
  if (g_init) return g_world;
  int already = 0;
  BT_MPI_CHECK(MPI_Initialized(&already));
  if (started_by_mpi() || already) {  // already: the host program initialized MPI (a singleton, say)
    if (!already) {
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
    init_from_env(insecure);  // Note [Rendezvous]
  } else {
    g_world.launched_by = "single";
  }
  g_init = true;
  return g_world;
}

const World& world() { return g_world; }

std::shared_ptr<ProcessGroup> cpu_group() {
  if (!g_cpu_group && g_world.mpi) g_cpu_group = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD);
  if (!g_cpu_group && g_store)  // Note [TCP process group] in tcp_process_group.cpp
    g_cpu_group = std::make_shared<TcpProcessGroup>(*g_store, g_world.rank, g_world.size);
  BT_CHECK(g_cpu_group,
           "collectives on CPU tensors need a job of several ranks: start it with `blutrain launch`, mpirun "
           "or torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  return g_cpu_group;
}

std::shared_ptr<ProcessGroup> device_group(const Device& d) {
  if (!d.is_cuda()) return cpu_group();
  BT_CHECK(g_world.mpi || g_store,
           "a CUDA process group needs MPI or a rendezvous: use `blutrain launch`, mpirun "
           "or torchrun-style variables");
#ifdef BT_NCCL
  if (!g_gpu_group)
    g_gpu_group = g_world.mpi ? std::make_shared<NcclProcessGroup>(MPI_COMM_WORLD, d)
                              : std::make_shared<NcclProcessGroup>(*g_store, g_world.rank, g_world.size, d);
  return g_gpu_group;
#else
  BT_FAIL(
      "this build has no NCCL, so CUDA tensors cannot be shared across ranks; rebuild where NCCL is "
      "installed, or train with train.device=cpu");
#endif
}

void finalize_world() {
  g_gpu_group.reset();
  g_cpu_group.reset();  // a TCP group's connections close before the store they were found through
  if (g_store && g_world.size > 1) {
    // Rank 0 serves the store: it leaves only when every rank is done with it.
    g_store->add("finished", 1);
    if (g_world.rank == 0)
      while (g_store->add("finished", 0) < g_world.size)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  g_store.reset();
  if (g_world.mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  g_world = World{};
  g_init = false;
}

void abort_world(int code) {
  // Without MPI, exiting is enough: the process's sockets close, and the
  // other ranks' TCP groups fail at once naming this rank (Note [TCP process group]).
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
