// The world of one job: which rank this process is, how many there are, and
// its rank on this host, found once at start-up.
//
// How a process learns its place, in order:
//   1. started by mpirun or srun (Open MPI / PMIx variables: OMPI_COMM_WORLD_SIZE,
//      PMIX_RANK, PMI_RANK): MPI_Init_thread; rank and size from
//      MPI_COMM_WORLD; the local rank from an MPI_COMM_TYPE_SHARED split
//      (never from host names);
//   2. torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
//      MASTER_PORT; Kubernetes): a TCP rendezvous served by rank 0 (Note
//      [Rendezvous] in world.cpp; BT_RENDEZVOUS_TIMEOUT_S, default 300),
//      every connection proving the job token, BT_JOB_TOKEN or
//      BT_JOB_TOKEN_FILE (Note [Authenticated rendezvous] in auth.cpp). Such
//      a job shares CUDA tensors through NCCL and CPU tensors through a TCP
//      star via rank 0 (Note [TCP process group] in tcp_process_group.cpp);
//   3. neither: a world of one, and MPI is never initialized (unless the host
//      program initialized it itself, as a singleton: then MPI is used).
#pragma once

#include <memory>
#include <string>

#include "runtime/dist/process_group.h"

namespace bt::dist {

struct World {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  bool mpi = false;         // MPI was initialized by init_world()
  std::string launched_by;  // "mpi", "env" (torchrun-style variables) or "single"
  bool distributed() const { return size > 1; }
};

/// Finds this process's place (see the top of this file) and initializes MPI
/// when the job was started by it. Idempotent; throws bt::Error on a broken
/// environment (a partial set of variables, a size that does not match), and
/// for a torchrun-style job of several ranks without a job token unless
/// `insecure` (dist.insecure) lets its rendezvous run open.
const World& init_world(bool insecure = false);
/// The world init_world() found (a world of one before it runs).
const World& world();
/// The CPU group over every rank (created on first use): MPI when MPI started
/// the job, TCP when torchrun-style variables did (needs one or the other).
std::shared_ptr<ProcessGroup> cpu_group();
/// The group for tensors on `d`: cpu_group() for the CPU, the NCCL group over
/// every rank for a CUDA device (created on first use; needs BT_NCCL).
std::shared_ptr<ProcessGroup> device_group(const Device& d);
/// Destroys the groups, then the rendezvous store, and finalizes MPI (normal exit).
void finalize_world();
/// Ends every rank of the job now with `code` (MPI_Abort when MPI is up):
/// what a rank does after an error another rank may be waiting on.
[[noreturn]] void abort_world(int code);

}  // namespace bt::dist
